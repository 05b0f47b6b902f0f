/*
 * compute_load: keeps the simulated GPU busy for fgpu's compute-share tests.
 *
 *   compute_load [--resolve procaddr|dlsym] [--cuda-version V] [--via OP] [--us N]
 *                [--sync-every N] [--pace-us N] [--nodes N] [--threads N] [--seconds S]
 *
 * --resolve says how entry points are found (compile with -DLINKED for linked symbols):
 *   procaddr  dlopen libcuda.so.1, cuGetProcAddress_v2(base name, V, flags): flags 0
 *             gives the legacy-stream functions, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
 *             the _ptsz ones                                                      [default]
 *   dlsym     dlsym(handle, "cuLaunchKernel_ptsz") and so on
 * --cuda-version V  the CUDA version asked of cuGetProcAddress_v2 (default 12080)
 * --via      the launch call: launch launch_ptsz ex ex_ptsz coop coop_ptsz graph graph_ptsz
 *            (default launch). graph*: a graph of --nodes kernel nodes, launched whole.
 * --us       each kernel runs N microseconds on the device timeline (default 2000); the
 *            module declares `spin` at 1 us per block and the grid has N blocks.
 * --sync-every N  cuStreamSynchronize after every N launches (default 0: never; a launch
 *            then blocks while the queue holds 1024 items, as on the real driver).
 * --pace-us N  sleep N microseconds after each launch (default 0: launch as fast as
 *            admitted), as a program with work of its own between kernels does.
 * --threads N  N threads, each launching on a stream of its own (default 1).
 * --seconds S  stop after S seconds (default: run until killed or stdin closes).
 *
 * Prints "ready pid=PID" once every thread has launched once, and "done launches=N" at
 * the end. Work goes to a stream made with cuStreamCreate, or to stream 0 (the legacy or
 * the thread's per-thread default stream) with --default-stream.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext, *CUstream, *CUmodule, *CUfunction, *CUgraph, *CUgraphNode, *CUgraphExec, *CUkernel;
typedef struct { unsigned id; char pad[4]; union { char raw[64]; int cooperative; } value; } CUlaunchAttribute;
typedef struct {
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    CUstream hStream; CUlaunchAttribute *attrs; unsigned numAttrs;
} CUlaunchConfig;
typedef struct {
    CUfunction func; unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    void **kernelParams; void **extra; CUkernel kern; CUcontext ctx;
} CUDA_KERNEL_NODE_PARAMS_v2;

#define FNS(X) \
    X(cuInit, "cuInit", "cuInit", 0, CUresult, (unsigned)) \
    X(cuDeviceGet, "cuDeviceGet", "cuDeviceGet", 0, CUresult, (CUdevice *, int)) \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain", 0, CUresult, (CUcontext *, CUdevice)) \
    X(cuCtxSetCurrent, "cuCtxSetCurrent", "cuCtxSetCurrent", 0, CUresult, (CUcontext)) \
    X(cuModuleLoadData, "cuModuleLoadData", "cuModuleLoadData", 0, CUresult, (CUmodule *, const void *)) \
    X(cuModuleGetFunction, "cuModuleGetFunction", "cuModuleGetFunction", 0, CUresult, (CUfunction *, CUmodule, const char *)) \
    X(cuStreamCreate, "cuStreamCreate", "cuStreamCreate", 0, CUresult, (CUstream *, unsigned)) \
    X(cuStreamSynchronize, "cuStreamSynchronize", "cuStreamSynchronize", 0, CUresult, (CUstream)) \
    X(cuStreamSynchronize_ptsz, "cuStreamSynchronize_ptsz", "cuStreamSynchronize", 2, CUresult, (CUstream)) \
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
#endif
#include "driver_table.h"

static const char IMAGE[] = "fgpu-sim-module 2M\nkernel spin 1us\n";
static const char *via = "launch";
static unsigned us = 2000, sync_every = 0, pace_us = 0, nodes = 4, threads = 1, default_stream = 0;
static double seconds = 0;
static CUcontext ctx;
static CUfunction fn;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static unsigned started;
static unsigned long long total;

static double now_s(void) {
    struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int ptsz(void) { return strstr(via, "_ptsz") != NULL; }

static CUresult launch_one(CUstream s, CUgraphExec exec) {
    CUlaunchConfig cfg = { us, 1, 1, 32, 1, 1, 0, s, NULL, 0 };
    if (!strcmp(via, "launch")) return CALL(cuLaunchKernel)(fn, us, 1, 1, 32, 1, 1, 0, s, NULL, NULL);
    if (!strcmp(via, "launch_ptsz")) return CALL(cuLaunchKernel_ptsz)(fn, us, 1, 1, 32, 1, 1, 0, s, NULL, NULL);
    if (!strcmp(via, "ex")) return CALL(cuLaunchKernelEx)(&cfg, fn, NULL, NULL);
    if (!strcmp(via, "ex_ptsz")) return CALL(cuLaunchKernelEx_ptsz)(&cfg, fn, NULL, NULL);
    if (!strcmp(via, "coop")) return CALL(cuLaunchCooperativeKernel)(fn, us, 1, 1, 32, 1, 1, 0, s, NULL);
    if (!strcmp(via, "coop_ptsz")) return CALL(cuLaunchCooperativeKernel_ptsz)(fn, us, 1, 1, 32, 1, 1, 0, s, NULL);
    if (!strcmp(via, "graph")) return CALL(cuGraphLaunch)(exec, s);
    if (!strcmp(via, "graph_ptsz")) return CALL(cuGraphLaunch_ptsz)(exec, s);
    return 1;
}

static void *worker(void *arg) {
    (void)arg;
    CUstream s = NULL;
    CUgraphExec exec = NULL;
    CUresult rc = CALL(cuCtxSetCurrent)(ctx);
    if (!rc && !default_stream) rc = CALL(cuStreamCreate)(&s, 0);
    if (!rc && !strncmp(via, "graph", 5)) {
        CUgraph g; CUgraphNode prev = NULL, n;
        CUDA_KERNEL_NODE_PARAMS_v2 p; memset(&p, 0, sizeof p);
        p.func = fn; p.gridDimX = us; p.gridDimY = p.gridDimZ = 1; p.blockDimX = 32; p.blockDimY = p.blockDimZ = 1;
        rc = CALL(cuGraphCreate)(&g, 0);
        for (unsigned i = 0; i < nodes && !rc; i++) {
            rc = CALL(cuGraphAddKernelNode)(&n, g, prev ? &prev : NULL, prev ? 1 : 0, &p);
            prev = n;
        }
        if (!rc) rc = CALL(cuGraphInstantiateWithFlags)(&exec, g, 0);
    }
    if (!rc) rc = launch_one(s, exec);
    if (rc) { printf("error rc=%d\n", rc); exit(1); }
    pthread_mutex_lock(&lock);
    if (++started == threads) { printf("ready pid=%d\n", getpid()); pthread_cond_broadcast(&cond); }
    pthread_mutex_unlock(&lock);
    double end = seconds > 0 ? now_s() + seconds : 0;
    unsigned long long n = 1;
    for (;;) {
        if (end > 0 && now_s() >= end) break;
        rc = launch_one(s, exec);
        if (rc) { printf("error rc=%d\n", rc); exit(1); }
        n++;
        if (pace_us) usleep(pace_us);
        if (sync_every && n % sync_every == 0) {
            rc = ptsz() ? CALL(cuStreamSynchronize_ptsz)(s) : CALL(cuStreamSynchronize)(s);
            if (rc) { printf("sync error rc=%d\n", rc); exit(1); }
        }
    }
    pthread_mutex_lock(&lock);
    total += n;
    pthread_mutex_unlock(&lock);
    return NULL;
}

/* Ends the process when stdin closes (the test dropping it), however the workers are doing. */
static void *watch_stdin(void *arg) {
    (void)arg;
    char buf[64];
    while (read(0, buf, sizeof buf) > 0) {}
    _exit(0);
    return NULL;
}

int main(int argc, char **argv) {
    const char *mode = "procaddr";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--resolve") && i + 1 < argc) mode = argv[++i];
        else if (!strcmp(argv[i], "--via") && i + 1 < argc) via = argv[++i];
        else if (!strcmp(argv[i], "--cuda-version") && i + 1 < argc) resolve_version = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--us") && i + 1 < argc) us = (unsigned)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--sync-every") && i + 1 < argc) sync_every = (unsigned)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--pace-us") && i + 1 < argc) pace_us = (unsigned)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--nodes") && i + 1 < argc) nodes = (unsigned)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = (unsigned)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--default-stream")) default_stream = 1;
        else { printf("unknown argument %s\n", argv[i]); return 2; }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (resolve(mode)) return 2;
    CUdevice dev; CUmodule mod;
    CUresult rc = CALL(cuInit)(0);
    if (!rc) rc = CALL(cuDeviceGet)(&dev, 0);
    if (!rc) rc = CALL(cuDevicePrimaryCtxRetain)(&ctx, dev);
    if (!rc) rc = CALL(cuCtxSetCurrent)(ctx);
    if (!rc) rc = CALL(cuModuleLoadData)(&mod, IMAGE);
    if (!rc) rc = CALL(cuModuleGetFunction)(&fn, mod, "spin");
    if (rc) { printf("setup rc=%d\n", rc); return 1; }
    pthread_t watcher, tids[64];
    if (seconds <= 0) pthread_create(&watcher, NULL, watch_stdin, NULL);
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    for (unsigned i = 0; i < threads; i++) pthread_create(&tids[i], NULL, worker, NULL);
    for (unsigned i = 0; i < threads; i++) pthread_join(tids[i], NULL);
    printf("done launches=%llu\n", total);
    return 0;
}
