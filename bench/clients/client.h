/* What every fgpu-bench client that calls the driver shares: the driver reached the way
 * cudart reaches it (dlopen "libcuda.so.1", dlsym "cuGetProcAddress_v2", then each entry
 * point by base name for CUDA 12.8), device 0 and its primary context, the clocks, and
 * CHECK. A client defines CLIENT, its name in messages, before it includes this file.
 * fgpu-bench writes this file beside the clients' sources and compiles them against it.
 */
#ifndef FGPU_BENCH_CLIENT_H
#define FGPU_BENCH_CLIENT_H

#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef CUresult (*GetProc)(const char *, void **, int, unsigned long long, int *);

static GetProc get_proc;

/* libcuda.so.1, with its cuGetProcAddress_v2 in get_proc; exits 1 without them. */
static inline void *open_driver(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) { fprintf(stderr, CLIENT ": dlopen: %s\n", dlerror()); exit(1); }
    get_proc = (GetProc)dlsym(lib, "cuGetProcAddress_v2");
    if (!get_proc) { fprintf(stderr, CLIENT ": no cuGetProcAddress_v2\n"); exit(1); }
    return lib;
}

/* The entry point `name` for CUDA 12.8, through get_proc; exits 1 if there is none. */
static inline void *sym(const char *name) {
    void *p = NULL;
    int status = -1;
    CUresult r = get_proc(name, &p, 12080, 0, &status);
    if (r != 0 || p == NULL || status != 0) {
        fprintf(stderr, CLIENT ": cannot resolve %s (r=%d status=%d)\n", name, r, status);
        exit(1);
    }
    return p;
}

static inline uint64_t clock_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t now_ns(void) { return clock_ns(CLOCK_MONOTONIC); }

#define CHECK(call) do { CUresult r_ = (call); if (r_ != 0) { \
    fprintf(stderr, CLIENT ": %s = %d\n", #call, r_); exit(1); } } while (0)

/* cuInit, then device 0. */
static inline CUdevice first_device(void) {
    CUresult (*cuInit)(unsigned) = sym("cuInit");
    CUresult (*cuDeviceGet)(CUdevice *, int) = sym("cuDeviceGet");
    CUdevice dev;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    return dev;
}

/* Device 0's primary context, retained and made current in this thread. */
static inline CUcontext primary_context(CUdevice dev) {
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice) = sym("cuDevicePrimaryCtxRetain");
    CUresult (*cuCtxSetCurrent)(CUcontext) = sym("cuCtxSetCurrent");
    CUcontext ctx;
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    return ctx;
}

#endif
