/*
 * kernel_launcher: launches kernels on the simulated GPU through every launch entry point
 * and times each with events, for fgpu's tests.
 *
 *   kernel_launcher [--resolve procaddr|dlsym] [--ms N] OP...
 *
 * --resolve says how entry points are found (compile with -DLINKED for linked symbols):
 *   procaddr  dlopen libcuda.so.1, cuGetProcAddress_v2(base name, 12080, flags): flags 0
 *             gives the legacy-stream functions, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
 *             the _ptsz ones                                                      [default]
 *   dlsym     dlsym(handle, "cuLaunchKernel_ptsz") and so on
 *
 * The module image declares `spin`, 1 ms per block; every kernel below has --ms blocks
 * (default 50), so it runs --ms milliseconds on the device timeline. Each OP prints
 * "OP rc=R ms=ELAPSED" where ELAPSED is cuEventElapsedTime around the launch:
 *   launch launch_ptsz ex ex_ptsz coop coop_ptsz  the six kernel launch calls
 *   graph graph_ptsz       a graph of one kernel node (cuGraphAddKernelNode_v2) and
 *                          cuGraphLaunch / cuGraphLaunch_ptsz
 *   library                cuLibraryLoadData + cuLibraryGetKernel, launched as a CUkernel
 *   coop_too_large         a cooperative grid that cannot be resident: prints its rc
 *   burst N                N launches of 1-block kernels back to back: "burst rc=R
 *                          launch_ms=WALL" (a launch blocks while 1024 are queued)
 *   copy_waits             a 300 ms kernel, then cuMemcpyDtoH: "copy_waits rc=R
 *                          wall_ms=WALL" (the copy returns once the kernel is done)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext, *CUstream, *CUevent, *CUmodule, *CUfunction, *CUgraph, *CUgraphNode, *CUgraphExec, *CUlibrary, *CUkernel;
typedef struct { unsigned id; char pad[4]; union { char raw[64]; int cooperative; } value; } CUlaunchAttribute;
typedef struct {
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    CUstream hStream; CUlaunchAttribute *attrs; unsigned numAttrs;
} CUlaunchConfig;
typedef struct {
    CUfunction func; unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    void **kernelParams; void **extra; CUkernel kern; CUcontext ctx;
} CUDA_KERNEL_NODE_PARAMS_v2;
typedef CUresult (*launch_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
typedef CUresult (*launch_ex_t)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*coop_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **);
typedef CUresult (*graph_launch_t)(CUgraphExec, CUstream);

/* name, base name for cuGetProcAddress, per-thread flag */
#define FNS(X) \
    X(cuInit, "cuInit", "cuInit", 0, CUresult, (unsigned)) \
    X(cuDeviceGet, "cuDeviceGet", "cuDeviceGet", 0, CUresult, (CUdevice *, int)) \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain", 0, CUresult, (CUcontext *, CUdevice)) \
    X(cuCtxSetCurrent, "cuCtxSetCurrent", "cuCtxSetCurrent", 0, CUresult, (CUcontext)) \
    X(cuCtxSynchronize, "cuCtxSynchronize", "cuCtxSynchronize", 0, CUresult, (void)) \
    X(cuMemAlloc, "cuMemAlloc_v2", "cuMemAlloc", 0, CUresult, (unsigned long long *, size_t)) \
    X(cuMemcpyDtoH, "cuMemcpyDtoH_v2", "cuMemcpyDtoH", 0, CUresult, (void *, unsigned long long, size_t)) \
    X(cuModuleLoadData, "cuModuleLoadData", "cuModuleLoadData", 0, CUresult, (CUmodule *, const void *)) \
    X(cuModuleGetFunction, "cuModuleGetFunction", "cuModuleGetFunction", 0, CUresult, (CUfunction *, CUmodule, const char *)) \
    X(cuLibraryLoadData, "cuLibraryLoadData", "cuLibraryLoadData", 0, CUresult, (CUlibrary *, const void *, void *, void **, unsigned, void *, void **, unsigned)) \
    X(cuLibraryGetKernel, "cuLibraryGetKernel", "cuLibraryGetKernel", 0, CUresult, (CUkernel *, CUlibrary, const char *)) \
    X(cuEventCreate, "cuEventCreate", "cuEventCreate", 0, CUresult, (CUevent *, unsigned)) \
    X(cuEventRecord, "cuEventRecord", "cuEventRecord", 0, CUresult, (CUevent, CUstream)) \
    X(cuEventSynchronize, "cuEventSynchronize", "cuEventSynchronize", 0, CUresult, (CUevent)) \
    X(cuEventElapsedTime, "cuEventElapsedTime", "cuEventElapsedTime", 0, CUresult, (float *, CUevent, CUevent)) \
    X(cuGraphCreate, "cuGraphCreate", "cuGraphCreate", 0, CUresult, (CUgraph *, unsigned)) \
    X(cuGraphAddKernelNode, "cuGraphAddKernelNode_v2", "cuGraphAddKernelNode", 0, CUresult, (CUgraphNode *, CUgraph, const CUgraphNode *, size_t, const CUDA_KERNEL_NODE_PARAMS_v2 *)) \
    X(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", "cuGraphInstantiateWithFlags", 0, CUresult, (CUgraphExec *, CUgraph, unsigned long long)) \
    X(cuLaunchKernel, "cuLaunchKernel", "cuLaunchKernel", 0, CUresult, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **)) \
    X(cuLaunchKernel_ptsz, "cuLaunchKernel_ptsz", "cuLaunchKernel", 2, CUresult, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **)) \
    X(cuLaunchKernelEx, "cuLaunchKernelEx", "cuLaunchKernelEx", 0, CUresult, (const CUlaunchConfig *, CUfunction, void **, void **)) \
    X(cuLaunchKernelEx_ptsz, "cuLaunchKernelEx_ptsz", "cuLaunchKernelEx", 2, CUresult, (const CUlaunchConfig *, CUfunction, void **, void **)) \
    X(cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel", 0, CUresult, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **)) \
    X(cuLaunchCooperativeKernel_ptsz, "cuLaunchCooperativeKernel_ptsz", "cuLaunchCooperativeKernel", 2, CUresult, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **)) \
    X(cuGraphLaunch, "cuGraphLaunch", "cuGraphLaunch", 0, CUresult, (CUgraphExec, CUstream)) \
    X(cuGraphLaunch_ptsz, "cuGraphLaunch_ptsz", "cuGraphLaunch", 2, CUresult, (CUgraphExec, CUstream))

#ifdef LINKED
#define cuGraphAddKernelNode cuGraphAddKernelNode_v2
#define cuMemAlloc cuMemAlloc_v2
#define cuMemcpyDtoH cuMemcpyDtoH_v2
#endif
#include "driver_table.h"

static double now_ms(void) {
    struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static const char IMAGE[] = "fgpu-sim-module 2M\nkernel spin 1ms\n";
static CUevent start, stop;

/* Prints the rc of a launch issued after the start event, and the time between the events. */
static void report(const char *op, CUresult rc) {
    float ms = -1;
    if (!rc) rc = CALL(cuEventRecord)(stop, NULL);
    if (!rc) rc = CALL(cuEventSynchronize)(stop);
    if (!rc) rc = CALL(cuEventElapsedTime)(&ms, start, stop);
    printf("%s rc=%d ms=%.3f\n", op, rc, ms);
}

int main(int argc, char **argv) {
    const char *mode = "procaddr"; unsigned ms = 50; int i = 1;
    for (; i < argc && !strncmp(argv[i], "--", 2); i++) {
        if (!strcmp(argv[i], "--resolve")) mode = argv[++i];
        else if (!strcmp(argv[i], "--ms")) ms = (unsigned)atoi(argv[++i]);
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (resolve(mode)) return 2;
    CUdevice dev; CUcontext ctx; CUmodule mod; CUfunction f;
    CUresult rc = CALL(cuInit)(0);
    if (!rc) rc = CALL(cuDeviceGet)(&dev, 0);
    if (!rc) rc = CALL(cuDevicePrimaryCtxRetain)(&ctx, dev);
    if (!rc) rc = CALL(cuCtxSetCurrent)(ctx);
    if (!rc) rc = CALL(cuModuleLoadData)(&mod, IMAGE);
    if (!rc) rc = CALL(cuModuleGetFunction)(&f, mod, "spin");
    if (!rc) rc = CALL(cuEventCreate)(&start, 0);
    if (!rc) rc = CALL(cuEventCreate)(&stop, 0);
    printf("setup rc=%d\n", rc);
    if (rc) return 1;
    for (; i < argc; i++) {
        const char *op = argv[i];
        /* A first kernel keeps the device busy so that the start event, the timed launch
         * and the stop event all queue behind it: the timed interval is the launch alone. */
        if (strcmp(op, "burst") && strcmp(op, "coop_too_large") && strcmp(op, "copy_waits")) {
            rc = CALL(cuLaunchKernel)(f, 200, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
            if (!rc) rc = CALL(cuEventRecord)(start, NULL);
            if (rc) { printf("%s rc=%d\n", op, rc); continue; }
        }
        /* The _ptsz calls get stream 0, the per-thread default stream; in this one-thread
         * program the events on the legacy stream still follow it (the simulator runs one
         * context's work in submission order). */
        CUlaunchConfig cfg = { ms, 1, 1, 64, 1, 1, 0, NULL, NULL, 0 };
        if (!strcmp(op, "launch")) report(op, CALL(cuLaunchKernel)(f, ms, 1, 1, 64, 1, 1, 0, NULL, NULL, NULL));
        else if (!strcmp(op, "launch_ptsz")) report(op, CALL(cuLaunchKernel_ptsz)(f, ms, 1, 1, 64, 1, 1, 0, NULL, NULL, NULL));
        else if (!strcmp(op, "ex")) report(op, CALL(cuLaunchKernelEx)(&cfg, f, NULL, NULL));
        else if (!strcmp(op, "ex_ptsz")) report(op, CALL(cuLaunchKernelEx_ptsz)(&cfg, f, NULL, NULL));
        else if (!strcmp(op, "coop")) report(op, CALL(cuLaunchCooperativeKernel)(f, ms, 1, 1, 64, 1, 1, 0, NULL, NULL));
        else if (!strcmp(op, "coop_ptsz")) report(op, CALL(cuLaunchCooperativeKernel_ptsz)(f, ms, 1, 1, 64, 1, 1, 0, NULL, NULL));
        else if (!strcmp(op, "coop_too_large")) {
            printf("%s rc=%d\n", op, CALL(cuLaunchCooperativeKernel)(f, 100000, 1, 1, 1024, 1, 1, 0, NULL, NULL));
        }
        else if (!strcmp(op, "graph") || !strcmp(op, "graph_ptsz")) {
            CUgraph g; CUgraphNode n; CUgraphExec e;
            CUDA_KERNEL_NODE_PARAMS_v2 p; memset(&p, 0, sizeof p);
            p.func = f; p.gridDimX = ms; p.gridDimY = p.gridDimZ = 1; p.blockDimX = 64; p.blockDimY = p.blockDimZ = 1;
            rc = CALL(cuGraphCreate)(&g, 0);
            if (!rc) rc = CALL(cuGraphAddKernelNode)(&n, g, NULL, 0, &p);
            if (!rc) rc = CALL(cuGraphInstantiateWithFlags)(&e, g, 0);
            if (!rc) rc = !strcmp(op, "graph") ? CALL(cuGraphLaunch)(e, NULL) : CALL(cuGraphLaunch_ptsz)(e, NULL);
            report(op, rc);
        }
        else if (!strcmp(op, "library")) {
            CUlibrary lib; CUkernel k;
            rc = CALL(cuLibraryLoadData)(&lib, IMAGE, NULL, NULL, 0, NULL, NULL, 0);
            if (!rc) rc = CALL(cuLibraryGetKernel)(&k, lib, "spin");
            if (!rc) rc = CALL(cuLaunchKernel)((CUfunction)k, ms, 1, 1, 64, 1, 1, 0, NULL, NULL, NULL);
            report(op, rc);
        }
        else if (!strcmp(op, "burst")) {
            int n = atoi(argv[++i]); double t0 = now_ms(); rc = 0;
            for (int k = 0; k < n && !rc; k++) rc = CALL(cuLaunchKernel)(f, 1, 1, 1, 64, 1, 1, 0, NULL, NULL, NULL);
            printf("burst rc=%d launch_ms=%.1f\n", rc, now_ms() - t0);
            if (!rc) rc = CALL(cuCtxSynchronize)();
        }
        else if (!strcmp(op, "copy_waits")) {
            unsigned long long dptr = 0; char host[64]; double t0 = 0;
            rc = CALL(cuMemAlloc)(&dptr, sizeof host);
            if (!rc) rc = CALL(cuLaunchKernel)(f, 300, 1, 1, 64, 1, 1, 0, NULL, NULL, NULL);
            if (!rc) { t0 = now_ms(); rc = CALL(cuMemcpyDtoH)(host, dptr, sizeof host); }
            printf("copy_waits rc=%d wall_ms=%.1f\n", rc, now_ms() - t0);
        }
        else { printf("unknown op %s\n", op); return 2; }
    }
    return 0;
}
