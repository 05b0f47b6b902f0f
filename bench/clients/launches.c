/* fgpu-bench client: kernel launches through the cuGetProcAddress path.
 *
 * Reaches the driver the way cudart does: dlopen("libcuda.so.1"), dlsym
 * "cuGetProcAddress_v2", then every entry point by base name for CUDA 12.8. Retains the
 * primary context of device 0, loads a module whose kernel `tiny` runs 1 ns on the
 * simulated GPU (so the GPU is never what limits the loop, and a process with a compute
 * share stays far under it), launches on a stream of its own for WARMUP_MS (the limiter
 * learns the launches' cost meanwhile), then for DURATION_MS, timed.
 *
 * The timed part alternates bursts of BURST launches through two pointers to
 * cuLaunchKernel: the driver's own (looked up with glibc's dlsym, which the shim does not
 * see: found with dlvsym) and the one the program gets (through cuGetProcAddress, the
 * shim's when it is preloaded). Both go to the same driver, stream and kernel, in the same
 * process, interleaved, so whatever else the machine does falls on both alike: the
 * difference is what the shim adds to a launch.
 *
 *   launches WARMUP_MS DURATION_MS
 *
 * Prints one line: "launches N direct_cpu_ns D hooked_cpu_ns H cpu_ns C wall_ns W
 * total_mem T": N launches of each kind, D and H the CPU time this thread spent in the
 * bursts of each, C in all, W the wall-clock time, T what cuMemGetInfo calls the device's
 * memory (so the caller can check the shim was in effect). Exit 1 on error.
 *
 * Built by fgpu-bench with: cc -O2 -o launches launches.c -ldl (with client.h beside it)
 */
#define CLIENT "launches"
#include "client.h"

typedef void *CUmodule, *CUfunction, *CUstream;

#define BURST 256

static const char IMAGE[] = "fgpu-sim-module 2M\nkernel tiny 1ns\n";

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: launches WARMUP_MS DURATION_MS\n");
        return 2;
    }
    uint64_t warmup = strtoull(argv[1], NULL, 10) * 1000000ull;
    uint64_t duration = strtoull(argv[2], NULL, 10) * 1000000ull;
    void *lib = open_driver();
    CUresult (*cuMemGetInfo)(size_t *, size_t *) = sym("cuMemGetInfo");
    CUresult (*cuModuleLoadData)(CUmodule *, const void *) = sym("cuModuleLoadData");
    CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *) = sym("cuModuleGetFunction");
    CUresult (*cuStreamCreate)(CUstream *, unsigned) = sym("cuStreamCreate");
    CUresult (*cuStreamSynchronize)(CUstream) = sym("cuStreamSynchronize");
    CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **) = sym("cuLaunchKernel");

    CUmodule mod;
    CUfunction fn;
    CUstream stream;
    size_t free_mem = 0, total_mem = 0;
    primary_context(first_device());
    CHECK(cuMemGetInfo(&free_mem, &total_mem));
    CHECK(cuModuleLoadData(&mod, IMAGE));
    CHECK(cuModuleGetFunction(&fn, mod, "tiny"));
    CHECK(cuStreamCreate(&stream, 0));

    uint64_t end = clock_ns(CLOCK_MONOTONIC) + warmup;
    while (clock_ns(CLOCK_MONOTONIC) < end) {
        for (int i = 0; i < 256; i++) CHECK(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL));
    }
    /* glibc's own dlsym: the shim interposes on the unversioned name only. */
    void *(*glibc_dlsym)(void *, const char *) = dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.34");
    if (!glibc_dlsym) glibc_dlsym = dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.2.5");
    if (!glibc_dlsym) { fprintf(stderr, "launches: no glibc dlsym\n"); return 1; }
    CUresult (*direct)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **) =
        glibc_dlsym(lib, "cuLaunchKernel");
    if (!direct) { fprintf(stderr, "launches: no cuLaunchKernel in libcuda.so.1\n"); return 1; }

    uint64_t n = 0, direct_ns = 0, hooked_ns = 0;
    uint64_t cpu0 = clock_ns(CLOCK_THREAD_CPUTIME_ID), start = clock_ns(CLOCK_MONOTONIC);
    end = start + duration;
    /* Which of the two goes first in each pair is drawn (a fixed LCG): the simulated
     * driver's queue fills every 1024 launches, and a fixed order would put that cost on
     * the same side every time. */
    uint32_t lcg = 12345;
    while (clock_ns(CLOCK_MONOTONIC) < end) {
        lcg = lcg * 1664525u + 1013904223u;
        int hooked_first = (lcg >> 16) & 1;
        for (int side = 0; side < 2; side++) {
            int hooked = side ^ !hooked_first;
            uint64_t a = clock_ns(CLOCK_THREAD_CPUTIME_ID);
            if (hooked)
                for (int i = 0; i < BURST; i++) CHECK(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL));
            else
                for (int i = 0; i < BURST; i++) CHECK(direct(fn, 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL));
            uint64_t b = clock_ns(CLOCK_THREAD_CPUTIME_ID);
            if (hooked) hooked_ns += b - a; else direct_ns += b - a;
        }
        n += BURST;
    }
    uint64_t cpu1 = clock_ns(CLOCK_THREAD_CPUTIME_ID), stop = clock_ns(CLOCK_MONOTONIC);
    CHECK(cuStreamSynchronize(stream));
    printf("launches %llu direct_cpu_ns %llu hooked_cpu_ns %llu cpu_ns %llu wall_ns %llu total_mem %llu\n", (unsigned long long)n,
           (unsigned long long)direct_ns, (unsigned long long)hooked_ns, (unsigned long long)(cpu1 - cpu0),
           (unsigned long long)(stop - start), (unsigned long long)total_mem);
    return 0;
}
