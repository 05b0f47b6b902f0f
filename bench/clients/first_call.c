/* fgpu-bench client: the cost of the first CUDA call that needs fgpu's per-process state.
 *
 * Loads the driver the way cudart does (dlopen "libcuda.so.1", dlsym
 * "cuGetProcAddress_v2", entry points by base name), calls cuInit and cuDeviceGet, then
 * times the first cuDeviceTotalMem and the fastest of 20 later ones. Under the shim the
 * first one builds its state: configuration, ledger open or create, slot join, device
 * registration.
 *
 *   first_call [SPAWN_NS]
 *
 * SPAWN_NS is the parent's CLOCK_MONOTONIC just before it started this process. Prints:
 * "first_ns F later_ns L ready_ns R total_mem T" where R is the time from SPAWN_NS to the
 * end of the first cuDeviceTotalMem (0 without SPAWN_NS) and T what it answered.
 *
 * Built by fgpu-bench with: cc -O2 -o first_call first_call.c -ldl (with client.h beside it)
 */
#define CLIENT "first_call"
#include "client.h"

int main(int argc, char **argv) {
    uint64_t spawn = argc > 1 ? strtoull(argv[1], NULL, 10) : 0;
    open_driver();
    CUresult (*cuDeviceTotalMem)(size_t *, CUdevice) = sym("cuDeviceTotalMem");
    CUdevice dev = first_device();

    size_t total = 0, again = 0;
    uint64_t t0 = now_ns();
    CHECK(cuDeviceTotalMem(&total, dev));
    uint64_t t1 = now_ns();
    uint64_t later = UINT64_MAX;
    for (int i = 0; i < 20; i++) {
        uint64_t a = now_ns();
        CHECK(cuDeviceTotalMem(&again, dev));
        uint64_t b = now_ns();
        if (b - a < later) later = b - a;
    }
    printf("first_ns %llu later_ns %llu ready_ns %llu total_mem %zu\n", (unsigned long long)(t1 - t0),
           (unsigned long long)later, (unsigned long long)(spawn ? t1 - spawn : 0), total);
    return 0;
}
