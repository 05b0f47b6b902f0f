/*
 * fgpu-client: a small CUDA driver / NVML client for the container tests.
 *
 * It finds the driver the way the CUDA runtime does: dlopen("libcuda.so.1"), dlsym
 * "cuGetProcAddress_v2" (or the 11.x "cuGetProcAddress"), then every other entry point by
 * base name and CUDA version. Needs no CUDA headers.
 *
 *   fgpu-client info                 cuMemGetInfo: total and free MiB
 *   fgpu-client alloc MIB [--hold]   allocate MIB MiB; with --hold, keep it until killed
 *   fgpu-client nvml                 NVML memory of GPU 0 and its compute processes
 *
 * Output is key=value lines. Exit status: 0 success, 2 the allocation failed with
 * CUDA_ERROR_OUT_OF_MEMORY, 1 anything else.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_VERSION_ASKED 12030

typedef CUresult (*getproc_v2_t)(const char *, void **, int, uint64_t, int *);
typedef CUresult (*getproc_v1_t)(const char *, void **, int, uint64_t);

static void *cuda_lib;
static getproc_v2_t getproc_v2;
static getproc_v1_t getproc_v1;

static void *cuda_sym(const char *base) {
    void *fn = NULL;
    CUresult r;
    if (getproc_v2) {
        int status = 0;
        r = getproc_v2(base, &fn, CUDA_VERSION_ASKED, 0, &status);
    } else {
        r = getproc_v1(base, &fn, CUDA_VERSION_ASKED, 0);
    }
    if (r != CUDA_SUCCESS || fn == NULL) {
        printf("error=cuGetProcAddress(%s) result=%d\n", base, r);
        exit(1);
    }
    return fn;
}

static void cuda_open(void) {
    cuda_lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!cuda_lib) {
        printf("error=dlopen libcuda.so.1: %s\n", dlerror());
        exit(1);
    }
    getproc_v2 = (getproc_v2_t)dlsym(cuda_lib, "cuGetProcAddress_v2");
    if (!getproc_v2) {
        getproc_v1 = (getproc_v1_t)dlsym(cuda_lib, "cuGetProcAddress");
        if (!getproc_v1) {
            printf("error=no cuGetProcAddress in libcuda.so.1\n");
            exit(1);
        }
    }
}

#define CHECK(call, what)                                   \
    do {                                                    \
        CUresult r_ = (call);                               \
        if (r_ != CUDA_SUCCESS) {                           \
            printf("error=%s result=%d\n", what, r_);       \
            exit(1);                                        \
        }                                                   \
    } while (0)

static void on_term(int sig) {
    (void)sig;
    _exit(0);
}

static int cuda_main(int alloc, unsigned long long mib, int hold) {
    CUresult (*cuInit)(unsigned) = cuda_sym("cuInit");
    CUresult (*cuDeviceGet)(CUdevice *, int) = cuda_sym("cuDeviceGet");
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice) = cuda_sym("cuDevicePrimaryCtxRetain");
    CUresult (*cuCtxSetCurrent)(CUcontext) = cuda_sym("cuCtxSetCurrent");
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t) = cuda_sym("cuMemAlloc");
    CUresult (*cuMemGetInfo)(size_t *, size_t *) = cuda_sym("cuMemGetInfo");
    CUdevice dev;
    CUcontext ctx;
    size_t free_b = 0, total_b = 0;

    CHECK(cuInit(0), "cuInit");
    CHECK(cuDeviceGet(&dev, 0), "cuDeviceGet");
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    CHECK(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    CHECK(cuMemGetInfo(&free_b, &total_b), "cuMemGetInfo");
    printf("pid=%d\n", (int)getpid());
    printf("total_mib=%llu\nfree_mib=%llu\n", (unsigned long long)total_b >> 20,
           (unsigned long long)free_b >> 20);
    if (!alloc) {
        return 0;
    }
    CUdeviceptr ptr = 0;
    CUresult r = cuMemAlloc(&ptr, (size_t)(mib << 20));
    printf("alloc_mib=%llu\nalloc_result=%d\n", mib, r);
    if (r != CUDA_SUCCESS) {
        fflush(stdout);
        return r == CUDA_ERROR_OUT_OF_MEMORY ? 2 : 1;
    }
    CHECK(cuMemGetInfo(&free_b, &total_b), "cuMemGetInfo");
    printf("free_mib_after=%llu\n", (unsigned long long)free_b >> 20);
    if (hold) {
        signal(SIGTERM, on_term);
        signal(SIGINT, on_term);
        printf("holding=1\n");
        fflush(stdout);
        for (;;) {
            pause();
        }
    }
    return 0;
}

/* NVML: nvmlMemory_t {total, free, used}; nvmlProcessInfo_t v2/v3: 24 bytes. */
typedef struct {
    unsigned long long total, free, used;
} nvml_memory_t;
typedef struct {
    unsigned int pid;
    unsigned long long used;
    unsigned int gpu_instance, compute_instance;
} nvml_process_t;

static int nvml_main(void) {
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        printf("error=dlopen libnvidia-ml.so.1: %s\n", dlerror());
        return 1;
    }
    int (*init)(void) = (int (*)(void))dlsym(lib, "nvmlInit_v2");
    int (*handle)(unsigned, void **) = (int (*)(unsigned, void **))dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    int (*meminfo)(void *, nvml_memory_t *) = (int (*)(void *, nvml_memory_t *))dlsym(lib, "nvmlDeviceGetMemoryInfo");
    int (*procs)(void *, unsigned *, nvml_process_t *) =
        (int (*)(void *, unsigned *, nvml_process_t *))dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3");
    if (!procs) {
        procs = (int (*)(void *, unsigned *, nvml_process_t *))dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v2");
    }
    if (!init || !handle || !meminfo) {
        printf("error=missing NVML symbols\n");
        return 1;
    }
    int r = init();
    if (r != 0) {
        printf("error=nvmlInit_v2 result=%d\n", r);
        return 1;
    }
    void *dev = NULL;
    if ((r = handle(0, &dev)) != 0) {
        printf("error=nvmlDeviceGetHandleByIndex_v2 result=%d\n", r);
        return 1;
    }
    nvml_memory_t mem;
    if ((r = meminfo(dev, &mem)) != 0) {
        printf("error=nvmlDeviceGetMemoryInfo result=%d\n", r);
        return 1;
    }
    printf("nvml_total_mib=%llu\nnvml_used_mib=%llu\nnvml_free_mib=%llu\n", mem.total >> 20,
           mem.used >> 20, mem.free >> 20);
    if (procs) {
        nvml_process_t list[256];
        unsigned count = 256;
        r = procs(dev, &count, list);
        if (r != 0) {
            printf("error=nvmlDeviceGetComputeRunningProcesses result=%d\n", r);
            return 1;
        }
        printf("nvml_process_count=%u\n", count);
        for (unsigned i = 0; i < count; i++) {
            printf("nvml_process=%u used_mib=%llu\n", list[i].pid, list[i].used >> 20);
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 2 && strcmp(argv[1], "info") == 0) {
        cuda_open();
        return cuda_main(0, 0, 0);
    }
    if (argc >= 3 && strcmp(argv[1], "alloc") == 0) {
        int hold = argc >= 4 && strcmp(argv[3], "--hold") == 0;
        cuda_open();
        return cuda_main(1, strtoull(argv[2], NULL, 10), hold);
    }
    if (argc >= 2 && strcmp(argv[1], "nvml") == 0) {
        return nvml_main();
    }
    fprintf(stderr, "usage: %s info | alloc MIB [--hold] | nvml\n", argv[0]);
    return 1;
}
