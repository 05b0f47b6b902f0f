/* fgpu-bench: an empty shared library. Preloading it into /bin/true shows what any
 * LD_PRELOAD costs on this machine (one more object for the dynamic loader to find, map
 * and relocate), the floor under the shim's own start-up figure.
 *
 * Built by fgpu-bench with: cc -O2 -shared -fPIC -o libfgpu_bench_empty.so empty_preload.c
 */
int fgpu_bench_empty_preload(void) { return 0; }
