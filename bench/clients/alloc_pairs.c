/* fgpu-bench client: cuMemAlloc/cuMemFree pairs through the cuGetProcAddress path.
 *
 * Reaches the driver the way cudart does: dlopen("libcuda.so.1"), dlsym
 * "cuGetProcAddress_v2", then every entry point by base name for CUDA 12.8. Retains the
 * primary context of device 0, warms up, then allocates and frees SIZE bytes in a loop
 * for DURATION_MS milliseconds.
 *
 *   alloc_pairs SIZE DURATION_MS          start at once
 *   alloc_pairs SIZE DURATION_MS sync     print "ready", read "START_NS" (CLOCK_MONOTONIC)
 *                                         from stdin, sleep until then, run DURATION_MS
 *
 * Prints one line: "pairs P start_ns S end_ns E cpu_ns C total_mem T": S and E on
 * CLOCK_MONOTONIC, C the CPU time this thread spent in the timed loop (what it cost,
 * whatever else the machine ran meanwhile), T what cuMemGetInfo calls the device's memory
 * (so the caller can check the shim was in effect). Exit 1 on error.
 *
 * Built by fgpu-bench with: cc -O2 -o alloc_pairs alloc_pairs.c -ldl (with client.h beside it)
 */
#define CLIENT "alloc_pairs"
#include "client.h"
#include <string.h>

typedef unsigned long long CUdeviceptr;

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: alloc_pairs SIZE DURATION_MS [sync]\n");
        return 2;
    }
    size_t size = strtoull(argv[1], NULL, 10);
    uint64_t duration = strtoull(argv[2], NULL, 10) * 1000000ull;
    int sync = argc > 3 && strcmp(argv[3], "sync") == 0;

    open_driver();
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t) = sym("cuMemAlloc");
    CUresult (*cuMemFree)(CUdeviceptr) = sym("cuMemFree");
    CUresult (*cuMemGetInfo)(size_t *, size_t *) = sym("cuMemGetInfo");

    primary_context(first_device());

    CUdeviceptr p;
    for (int i = 0; i < 20000; i++) {
        CHECK(cuMemAlloc(&p, size));
        CHECK(cuMemFree(p));
    }

    uint64_t start = now_ns();
    if (sync) {
        char line[64];
        printf("ready\n");
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin)) { fprintf(stderr, "alloc_pairs: no start time\n"); return 1; }
        start = strtoull(line, NULL, 10);
        struct timespec ts = { (time_t)(start / 1000000000ull), (long)(start % 1000000000ull) };
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {}
        start = now_ns();
    }
    uint64_t end = start + duration, t, pairs = 0;
    uint64_t cpu0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    do {
        for (int i = 0; i < 256; i++) {
            CHECK(cuMemAlloc(&p, size));
            CHECK(cuMemFree(p));
        }
        pairs += 256;
        t = now_ns();
    } while (t < end);
    uint64_t cpu = clock_ns(CLOCK_THREAD_CPUTIME_ID) - cpu0;

    size_t free_mem = 0, total_mem = 0;
    CHECK(cuMemGetInfo(&free_mem, &total_mem));
    printf("pairs %llu start_ns %llu end_ns %llu cpu_ns %llu total_mem %zu\n", (unsigned long long)pairs,
           (unsigned long long)start, (unsigned long long)t, (unsigned long long)cpu, total_mem);
    return 0;
}
