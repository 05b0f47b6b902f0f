/*
 * cuclient: a scriptable CUDA driver client for fgpu's tests.
 *
 * It reaches the driver the way real programs do, chosen with --resolve:
 *   procaddr   dlopen libcuda.so.1, dlsym cuGetProcAddress_v2, then every function by base
 *              name + CUDA version + flags (what cudart 12/13 does)          [default]
 *   procaddr1  the same through the CUDA 11.3+ cuGetProcAddress
 *   dlsym      dlsym(handle, "cuMemAlloc_v2") on a dlopen handle (cudarc, Python bindings)
 *   default    dlsym(RTLD_DEFAULT, ...) after dlopen with RTLD_GLOBAL
 *   linked     compiled with -DLINKED and linked with -lcuda: plain exported symbols
 *
 * Then it runs the operations given as arguments and prints one line per operation, e.g.
 *   cuclient init primary alloc 64M info
 *   -> "init rc=0" "primary rc=0" "alloc 67108864 rc=0" "info rc=0 free=... total=..."
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUmemoryPool;
typedef void *CUarray;
typedef unsigned long long CUmemGenericAllocationHandle;

typedef struct { int type; int id; } CUmemLocation;
typedef struct {
    int type; int requestedHandleTypes; CUmemLocation location; void *win32HandleMetaData;
    unsigned char compressionType, gpuDirectRDMACapable; unsigned short usage; unsigned char reserved[4];
} CUmemAllocationProp;
typedef struct { int location_type; int location_id; unsigned long long flags; } CUmemAccessDesc_;
typedef struct { CUmemLocation location; unsigned long long flags; } CUmemAccessDesc;
typedef struct { size_t Width, Height; int Format; unsigned NumChannels; } CUDA_ARRAY_DESCRIPTOR;
typedef struct {
    int allocType; int handleTypes; CUmemLocation location; void *win32SecurityAttributes;
    size_t maxSize; unsigned short usage; unsigned char reserved[54];
} CUmemPoolProps;
typedef struct { size_t Width, Height, Depth; int Format; unsigned NumChannels, Flags; } CUDA_ARRAY3D_DESCRIPTOR;
typedef void *CUgraph;
typedef void *CUgraphNode;
typedef void *CUgraphExec;
typedef struct {
    CUmemPoolProps poolProps; const CUmemAccessDesc *accessDescs; size_t accessDescCount; size_t bytesize; CUdeviceptr dptr;
} CUDA_MEM_ALLOC_NODE_PARAMS;
typedef struct { unsigned long long flags; CUstream hUploadStream; CUgraphNode hErrNode_out; int result_out; } CUDA_GRAPH_INSTANTIATE_PARAMS;

#define FNS(X) \
    X(cuInit, "cuInit", CUresult, (unsigned)) \
    X(cuDeviceGet, "cuDeviceGet", CUresult, (CUdevice *, int)) \
    X(cuDeviceGetCount, "cuDeviceGetCount", CUresult, (int *)) \
    X(cuDeviceTotalMem, "cuDeviceTotalMem_v2", CUresult, (size_t *, CUdevice)) \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", CUresult, (CUcontext *, CUdevice)) \
    X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", CUresult, (CUdevice)) \
    X(cuCtxSetCurrent, "cuCtxSetCurrent", CUresult, (CUcontext)) \
    X(cuCtxCreate, "cuCtxCreate_v2", CUresult, (CUcontext *, unsigned, CUdevice)) \
    X(cuCtxDestroy, "cuCtxDestroy_v2", CUresult, (CUcontext)) \
    X(cuCtxSynchronize, "cuCtxSynchronize", CUresult, (void)) \
    X(cuMemAlloc, "cuMemAlloc_v2", CUresult, (CUdeviceptr *, size_t)) \
    X(cuMemAllocPitch, "cuMemAllocPitch_v2", CUresult, (CUdeviceptr *, size_t *, size_t, size_t, unsigned)) \
    X(cuMemAllocManaged, "cuMemAllocManaged", CUresult, (CUdeviceptr *, size_t, unsigned)) \
    X(cuMemFree, "cuMemFree_v2", CUresult, (CUdeviceptr)) \
    X(cuMemGetInfo, "cuMemGetInfo_v2", CUresult, (size_t *, size_t *)) \
    X(cuMemAllocAsync, "cuMemAllocAsync", CUresult, (CUdeviceptr *, size_t, CUstream)) \
    X(cuMemFreeAsync, "cuMemFreeAsync", CUresult, (CUdeviceptr, CUstream)) \
    X(cuStreamSynchronize, "cuStreamSynchronize", CUresult, (CUstream)) \
    X(cuDeviceGetMemPool, "cuDeviceGetMemPool", CUresult, (CUmemoryPool *, CUdevice)) \
    X(cuMemPoolTrimTo, "cuMemPoolTrimTo", CUresult, (CUmemoryPool, size_t)) \
    X(cuMemPoolSetAttribute, "cuMemPoolSetAttribute", CUresult, (CUmemoryPool, int, void *)) \
    X(cuMemPoolCreate, "cuMemPoolCreate", CUresult, (CUmemoryPool *, const CUmemPoolProps *)) \
    X(cuMemPoolDestroy, "cuMemPoolDestroy", CUresult, (CUmemoryPool)) \
    X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", CUresult, (CUdeviceptr *, size_t, CUmemoryPool, CUstream)) \
    X(cuMemCreate, "cuMemCreate", CUresult, (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long)) \
    X(cuMemRelease, "cuMemRelease", CUresult, (CUmemGenericAllocationHandle)) \
    X(cuMemAddressReserve, "cuMemAddressReserve", CUresult, (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long)) \
    X(cuMemAddressFree, "cuMemAddressFree", CUresult, (CUdeviceptr, size_t)) \
    X(cuMemMap, "cuMemMap", CUresult, (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long)) \
    X(cuMemUnmap, "cuMemUnmap", CUresult, (CUdeviceptr, size_t)) \
    X(cuArrayCreate, "cuArrayCreate_v2", CUresult, (CUarray *, const CUDA_ARRAY_DESCRIPTOR *)) \
    X(cuArray3DCreate, "cuArray3DCreate_v2", CUresult, (CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *)) \
    X(cuMipmappedArrayCreate, "cuMipmappedArrayCreate", CUresult, (CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned)) \
    X(cuArrayDestroy, "cuArrayDestroy", CUresult, (CUarray)) \
    X(cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy", CUresult, (CUarray)) \
    X(cuGraphCreate, "cuGraphCreate", CUresult, (CUgraph *, unsigned)) \
    X(cuGraphAddMemAllocNode, "cuGraphAddMemAllocNode", CUresult, (CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUDA_MEM_ALLOC_NODE_PARAMS *)) \
    X(cuGraphAddMemFreeNode, "cuGraphAddMemFreeNode", CUresult, (CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUdeviceptr)) \
    X(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", CUresult, (CUgraphExec *, CUgraph, unsigned long long)) \
    X(cuGraphAddChildGraphNode, "cuGraphAddChildGraphNode", CUresult, (CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUgraph)) \
    X(cuGraphInstantiateWithParams, "cuGraphInstantiateWithParams", CUresult, (CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *)) \
    X(cuGraphLaunch, "cuGraphLaunch", CUresult, (CUgraphExec, CUstream)) \
    X(cuGraphUpload, "cuGraphUpload", CUresult, (CUgraphExec, CUstream)) \
    X(cuGraphExecDestroy, "cuGraphExecDestroy", CUresult, (CUgraphExec)) \
    X(cuDeviceGraphMemTrim, "cuDeviceGraphMemTrim", CUresult, (CUdevice)) \
    X(cuModuleLoadData, "cuModuleLoadData", CUresult, (void **, const void *)) \
    X(cuModuleUnload, "cuModuleUnload", CUresult, (void *))

#ifdef LINKED
#define DECL(var, exported, ret, args) extern ret var args;
/* The exported names carry their version suffix; map our short names onto them. */
#define cuDeviceTotalMem cuDeviceTotalMem_v2
#define cuDevicePrimaryCtxRelease cuDevicePrimaryCtxRelease_v2
#define cuCtxCreate cuCtxCreate_v2
#define cuCtxDestroy cuCtxDestroy_v2
#define cuMemAlloc cuMemAlloc_v2
#define cuMemAllocPitch cuMemAllocPitch_v2
#define cuMemFree cuMemFree_v2
#define cuMemGetInfo cuMemGetInfo_v2
#define cuArrayCreate cuArrayCreate_v2
#define cuArray3DCreate cuArray3DCreate_v2
FNS(DECL)
#define CALL(f) f
#else
#define DECL(var, exported, ret, args) static ret(*p_##var) args;
FNS(DECL)
#define CALL(f) p_##f
#endif

#ifndef LINKED
static const char *base_name(const char *exported, char *buf) {
    strcpy(buf, exported);
    char *v = strstr(buf, "_v2");
    if (v) *v = 0;
    return buf;
}
#endif

static int resolve(const char *mode, int version, unsigned long long flags) {
#ifndef LINKED
    int global = strcmp(mode, "default") == 0;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | (global ? RTLD_GLOBAL : RTLD_LOCAL));
    if (!lib) { printf("dlopen failed: %s\n", dlerror()); return 1; }
    CUresult (*gpa2)(const char *, void **, int, unsigned long long, int *) = dlsym(lib, "cuGetProcAddress_v2");
    CUresult (*gpa1)(const char *, void **, int, unsigned long long) = dlsym(lib, "cuGetProcAddress");
    char buf[128];
#define RESOLVE(var, exported, ret, args) { \
        void *p = NULL; \
        if (!strcmp(mode, "procaddr")) { int st = 0; if (gpa2) gpa2(base_name(exported, buf), &p, version, flags, &st); } \
        else if (!strcmp(mode, "procaddr1")) { if (gpa1) gpa1(base_name(exported, buf), &p, version, flags); } \
        else if (!strcmp(mode, "dlsym")) p = dlsym(lib, exported); \
        else p = dlsym(RTLD_DEFAULT, exported); \
        p_##var = (ret(*) args)p; }
    FNS(RESOLVE)
    if (!p_cuMemAlloc || !p_cuInit) { printf("resolve failed\n"); return 1; }
#else
    (void)mode; (void)version; (void)flags;
#endif
    return 0;
}

static size_t parse_size(const char *s) {
    char *end; double v = strtod(s, &end);
    switch (*end) { case 'K': case 'k': v *= 1024; break; case 'M': case 'm': v *= 1048576; break;
                    case 'G': case 'g': v *= 1073741824.0; break; }
    return (size_t)v;
}

static CUdeviceptr ptrs[4096]; static int nptrs;
static CUdeviceptr aptrs[4096]; static int naptrs;
static CUarray arrays[256]; static int narrays;
static CUmemoryPool pools[64]; static int npools;
static CUarray mipmaps[256]; static int nmipmaps;
static CUcontext ctxs[64]; static int nctxs;
static CUgraphExec execs[64]; static int nexecs;
static void *modules[64]; static int nmodules;
static struct { CUmemGenericAllocationHandle h; CUdeviceptr va; size_t size; } vmms[256]; static int nvmms;

int main(int argc, char **argv) {
    const char *mode = "procaddr";
    int version = 12080; unsigned long long flags = 0; int i = 1;
    for (; i < argc && !strncmp(argv[i], "--", 2); i++) {
        if (!strcmp(argv[i], "--resolve")) mode = argv[++i];
        else if (!strcmp(argv[i], "--version")) version = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ptds")) flags = 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (resolve(mode, version, flags)) return 2;
    CUdevice dev = 0; CUcontext primary = NULL;
    for (; i < argc; i++) {
        const char *op = argv[i]; CUresult rc = 0;
        if (!strcmp(op, "init")) { rc = CALL(cuInit)(0); if (!rc) rc = CALL(cuDeviceGet)(&dev, 0); printf("init rc=%d\n", rc); }
        else if (!strcmp(op, "device")) { rc = CALL(cuDeviceGet)(&dev, atoi(argv[++i])); printf("device rc=%d\n", rc); }
        else if (!strcmp(op, "primary")) { rc = CALL(cuDevicePrimaryCtxRetain)(&primary, dev); if (!rc) rc = CALL(cuCtxSetCurrent)(primary); printf("primary rc=%d\n", rc); }
        else if (!strcmp(op, "release")) { rc = CALL(cuDevicePrimaryCtxRelease)(dev); printf("release rc=%d\n", rc); }
        else if (!strcmp(op, "ctx")) { CUcontext c = NULL; rc = CALL(cuCtxCreate)(&c, 0, dev); if (!rc) ctxs[nctxs++] = c; printf("ctx rc=%d\n", rc); }
        else if (!strcmp(op, "ctxdestroy")) { rc = nctxs ? CALL(cuCtxDestroy)(ctxs[--nctxs]) : 1; if (primary) CALL(cuCtxSetCurrent)(primary); printf("ctxdestroy rc=%d\n", rc); }
        else if (!strcmp(op, "alloc")) { size_t n = parse_size(argv[++i]); CUdeviceptr p = 0; rc = CALL(cuMemAlloc)(&p, n); if (!rc) ptrs[nptrs++] = p; printf("alloc %zu rc=%d\n", n, rc); }
        else if (!strcmp(op, "managed")) { size_t n = parse_size(argv[++i]); CUdeviceptr p = 0; rc = CALL(cuMemAllocManaged)(&p, n, 1); if (!rc) ptrs[nptrs++] = p; printf("managed %zu rc=%d\n", n, rc); }
        else if (!strcmp(op, "pitch")) { size_t w = parse_size(argv[++i]), h = parse_size(argv[++i]), pitch = 0; CUdeviceptr p = 0; rc = CALL(cuMemAllocPitch)(&p, &pitch, w, h, 4); if (!rc) ptrs[nptrs++] = p; printf("pitch rc=%d pitch=%zu\n", rc, pitch); }
        else if (!strcmp(op, "free")) { rc = nptrs ? CALL(cuMemFree)(ptrs[--nptrs]) : 1; printf("free rc=%d\n", rc); }
        else if (!strcmp(op, "freeall")) { while (nptrs) { CUresult r = CALL(cuMemFree)(ptrs[--nptrs]); if (r) rc = r; } printf("freeall rc=%d\n", rc); }
        else if (!strcmp(op, "async")) { size_t n = parse_size(argv[++i]); CUdeviceptr p = 0; rc = CALL(cuMemAllocAsync)(&p, n, NULL); if (!rc) aptrs[naptrs++] = p; printf("async %zu rc=%d\n", n, rc); }
        else if (!strcmp(op, "freeasync")) { rc = naptrs ? CALL(cuMemFreeAsync)(aptrs[--naptrs], NULL) : 1; printf("freeasync rc=%d\n", rc); }
        else if (!strcmp(op, "sync")) { rc = CALL(cuStreamSynchronize)(NULL); printf("sync rc=%d\n", rc); }
        else if (!strcmp(op, "ctxsync")) { rc = CALL(cuCtxSynchronize)(); printf("ctxsync rc=%d\n", rc); }
        else if (!strcmp(op, "pool")) { /* an explicit pool, threshold 0, one allocation from it */
            CUmemPoolProps props; memset(&props, 0, sizeof props); props.allocType = 1; props.location.type = 1; props.location.id = dev;
            size_t n = parse_size(argv[++i]); CUdeviceptr p = 0; rc = CALL(cuMemPoolCreate)(&pools[npools], &props);
            if (!rc) { rc = CALL(cuMemAllocFromPoolAsync)(&p, n, pools[npools], NULL); npools++; }
            if (!rc) aptrs[naptrs++] = p;
            printf("pool %zu rc=%d\n", n, rc);
        }
        else if (!strcmp(op, "pooldestroy")) { rc = npools ? CALL(cuMemPoolDestroy)(pools[--npools]) : 1; printf("pooldestroy rc=%d\n", rc); }
        else if (!strcmp(op, "keep")) { /* pool release threshold: keep everything (PyTorch's setting) */
            CUmemoryPool pool; unsigned long long v = ~0ULL; rc = CALL(cuDeviceGetMemPool)(&pool, dev); if (!rc) rc = CALL(cuMemPoolSetAttribute)(pool, 4, &v); printf("keep rc=%d\n", rc); }
        else if (!strcmp(op, "trim")) { CUmemoryPool pool; rc = CALL(cuDeviceGetMemPool)(&pool, dev); if (!rc) rc = CALL(cuMemPoolTrimTo)(pool, parse_size(argv[++i])); else i++; printf("trim rc=%d\n", rc); }
        else if (!strcmp(op, "vmm")) {
            size_t n = parse_size(argv[++i]); CUmemAllocationProp prop; memset(&prop, 0, sizeof prop);
            prop.type = 1; prop.location.type = 1; prop.location.id = dev;
            CUmemGenericAllocationHandle h = 0; CUdeviceptr va = 0;
            rc = CALL(cuMemCreate)(&h, n, &prop, 0);
            if (!rc) rc = CALL(cuMemAddressReserve)(&va, n, 0, 0, 0);
            if (!rc) rc = CALL(cuMemMap)(va, n, 0, h, 0);
            if (!rc) { vmms[nvmms].h = h; vmms[nvmms].va = va; vmms[nvmms].size = n; nvmms++; }
            printf("vmm %zu rc=%d\n", n, rc);
        }
        else if (!strcmp(op, "vmmrelease")) { /* release the handle but keep it mapped */
            rc = nvmms ? CALL(cuMemRelease)(vmms[nvmms - 1].h) : 1; printf("vmmrelease rc=%d\n", rc); }
        else if (!strcmp(op, "vmmunmap")) {
            if (!nvmms) rc = 1; else { nvmms--; rc = CALL(cuMemUnmap)(vmms[nvmms].va, vmms[nvmms].size); if (!rc) rc = CALL(cuMemAddressFree)(vmms[nvmms].va, vmms[nvmms].size); }
            printf("vmmunmap rc=%d\n", rc);
        }
        else if (!strcmp(op, "array")) { CUDA_ARRAY_DESCRIPTOR d = { parse_size(argv[i + 1]), parse_size(argv[i + 2]), 0x20, 1 }; i += 2; CUarray a; rc = CALL(cuArrayCreate)(&a, &d); if (!rc) arrays[narrays++] = a; printf("array rc=%d\n", rc); }
        else if (!strcmp(op, "array3d")) { CUDA_ARRAY3D_DESCRIPTOR d = { parse_size(argv[i + 1]), parse_size(argv[i + 2]), parse_size(argv[i + 3]), 0x20, 1, 0 }; i += 3; CUarray a; rc = CALL(cuArray3DCreate)(&a, &d); if (!rc) arrays[narrays++] = a; printf("array3d rc=%d\n", rc); }
        else if (!strcmp(op, "arraydestroy")) { rc = narrays ? CALL(cuArrayDestroy)(arrays[--narrays]) : 1; printf("arraydestroy rc=%d\n", rc); }
        else if (!strcmp(op, "mipmap")) { CUDA_ARRAY3D_DESCRIPTOR d = { parse_size(argv[i + 1]), parse_size(argv[i + 2]), 0, 0x20, 1, 0 }; unsigned levels = atoi(argv[i + 3]); i += 3; CUarray a; rc = CALL(cuMipmappedArrayCreate)(&a, &d, levels); if (!rc) mipmaps[nmipmaps++] = a; printf("mipmap rc=%d\n", rc); }
        else if (!strcmp(op, "mipmapdestroy")) { rc = nmipmaps ? CALL(cuMipmappedArrayDestroy)(mipmaps[--nmipmaps]) : 1; printf("mipmapdestroy rc=%d\n", rc); }
        else if (!strcmp(op, "graph") || !strcmp(op, "graphkeep") || !strcmp(op, "graphup") || !strcmp(op, "graphchild")) {
            /* a graph with one memory allocation node (and, except for "graphkeep", the node
             * that frees it), instantiated ("graphup": with CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD,
             * which takes the memory at once; "graphchild": inside a child graph of the one
             * instantiated); "launch"/"upload" run the newest one */
            size_t n = parse_size(argv[++i]); CUgraph g = NULL; CUgraphNode a = NULL, f = NULL;
            CUDA_MEM_ALLOC_NODE_PARAMS params; memset(&params, 0, sizeof params);
            params.poolProps.allocType = 1; params.poolProps.location.type = 1; params.poolProps.location.id = dev; params.bytesize = n;
            rc = CALL(cuGraphCreate)(&g, 0);
            if (!rc) rc = CALL(cuGraphAddMemAllocNode)(&a, g, NULL, 0, &params);
            if (!rc && strcmp(op, "graphkeep")) rc = CALL(cuGraphAddMemFreeNode)(&f, g, &a, 1, params.dptr);
            if (!rc && !strcmp(op, "graphchild")) {
                CUgraph parent = NULL; CUgraphNode c = NULL;
                rc = CALL(cuGraphCreate)(&parent, 0);
                if (!rc) rc = CALL(cuGraphAddChildGraphNode)(&c, parent, NULL, 0, g);
                if (!rc) g = parent;
            }
            if (!rc && !strcmp(op, "graphup")) {
                CUDA_GRAPH_INSTANTIATE_PARAMS ip; memset(&ip, 0, sizeof ip); ip.flags = 2;
                rc = CALL(cuGraphInstantiateWithParams)(&execs[nexecs], g, &ip);
            } else if (!rc) rc = CALL(cuGraphInstantiateWithFlags)(&execs[nexecs], g, 0);
            if (!rc) nexecs++;
            printf("%s %zu rc=%d\n", op, n, rc);
        }
        else if (!strcmp(op, "launch")) { rc = nexecs ? CALL(cuGraphLaunch)(execs[nexecs - 1], NULL) : 1; printf("launch rc=%d\n", rc); }
        else if (!strcmp(op, "upload")) { rc = nexecs ? CALL(cuGraphUpload)(execs[nexecs - 1], NULL) : 1; printf("upload rc=%d\n", rc); }
        else if (!strcmp(op, "execdestroy")) { rc = nexecs ? CALL(cuGraphExecDestroy)(execs[--nexecs]) : 1; printf("execdestroy rc=%d\n", rc); }
        else if (!strcmp(op, "graphtrim")) { rc = CALL(cuDeviceGraphMemTrim)(dev); printf("graphtrim rc=%d\n", rc); }
        else if (!strcmp(op, "module")) { /* the simulated driver reads the module's size from its image */
            char image[64]; snprintf(image, sizeof image, "fgpu-sim-module %s", argv[++i]);
            rc = CALL(cuModuleLoadData)(&modules[nmodules], image); if (!rc) nmodules++; printf("module rc=%d\n", rc); }
        else if (!strcmp(op, "moduleunload")) { rc = nmodules ? CALL(cuModuleUnload)(modules[--nmodules]) : 1; printf("moduleunload rc=%d\n", rc); }
        else if (!strcmp(op, "info")) { size_t f = 0, t = 0; rc = CALL(cuMemGetInfo)(&f, &t); printf("info rc=%d free=%zu total=%zu\n", rc, f, t); }
        else if (!strcmp(op, "total")) { size_t t = 0; rc = CALL(cuDeviceTotalMem)(&t, dev); printf("total rc=%d total=%zu\n", rc, t); }
        else if (!strcmp(op, "fill")) {
            size_t chunk = parse_size(argv[++i]), got = 0; int n = 0; CUdeviceptr p;
            while (nptrs < 4096 && !(rc = CALL(cuMemAlloc)(&p, chunk))) { ptrs[nptrs++] = p; got += chunk; n++; }
            printf("fill count=%d bytes=%zu rc=%d\n", n, got, rc);
        }
        else if (!strcmp(op, "hold")) { printf("holding\n"); fflush(stdout); char c; while (read(0, &c, 1) > 0) {} }
        else if (!strcmp(op, "sleep")) { usleep(atoi(argv[++i]) * 1000); }
        else if (!strcmp(op, "forksleep")) { /* a child that outlives us without touching CUDA */
            pid_t pid = fork();
            if (pid == 0) { usleep(atoi(argv[i + 1]) * 1000); _exit(0); }
            i++; printf("forked pid=%d\n", (int)pid);
        }
        else { printf("unknown op %s\n", op); return 2; }
    }
    return 0;
}
