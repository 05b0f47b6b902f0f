/* Smoke client for the simulated driver: loads libcuda.so.1 the way cudart does
 * (dlopen, dlsym("cuGetProcAddress_v2"), then every entry point by base name) and
 * exercises contexts, allocations, pools, VMM and arrays. Exit status 0 = all good.
 *
 *   cc -O2 -o sim_smoke tests/clients/sim_smoke.c -ldl
 *   LD_LIBRARY_PATH=<dir with libcuda.so.1> ./sim_smoke [hold-seconds]
 *
 * With hold-seconds it keeps 1 GiB allocated that long after the checks (for tests
 * that look at the process from outside, or kill it).
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUstream, *CUmemoryPool, *CUarray;
typedef unsigned long long CUmemGenericAllocationHandle;

typedef struct { unsigned type, handleTypes, locType; int locId; void *win32; unsigned char flags[8]; } AllocProp;
typedef struct { unsigned locType; int locId; unsigned flags; } AccessDesc;
typedef struct { size_t Width, Height; unsigned Format, NumChannels; } ArrayDesc;

static CUresult (*pGetProc)(const char *, void **, int, unsigned long long, int *);
static int failures;

static void *sym(const char *name, int version, unsigned long long flags) {
    void *p = NULL;
    int status = -1;
    CUresult r = pGetProc(name, &p, version, flags, &status);
    if (r != 0 || p == NULL || status != 0) {
        printf("FAIL resolve %s@%d: r=%d status=%d\n", name, version, r, status);
        failures++;
    }
    return p;
}

#define CHECK(call, want) do { CUresult r_ = (call); if (r_ != (want)) { \
    printf("FAIL %s = %d (want %d) line %d\n", #call, r_, (want), __LINE__); failures++; } } while (0)
#define EXPECT(cond) do { if (!(cond)) { printf("FAIL %s line %d\n", #cond, __LINE__); failures++; } } while (0)

int main(int argc, char **argv) {
    int hold = argc > 1 ? atoi(argv[1]) : 0;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) { printf("FAIL dlopen: %s\n", dlerror()); return 1; }
    pGetProc = (CUresult (*)(const char *, void **, int, unsigned long long, int *))dlsym(lib, "cuGetProcAddress_v2");
    if (!pGetProc) { printf("FAIL no cuGetProcAddress_v2\n"); return 1; }
    const int V = 12080;

    CUresult (*cuInit)(unsigned) = sym("cuInit", V, 0);
    CUresult (*cuDriverGetVersion)(int *) = sym("cuDriverGetVersion", V, 0);
    CUresult (*cuDeviceGetCount)(int *) = sym("cuDeviceGetCount", V, 0);
    CUresult (*cuDeviceGet)(CUdevice *, int) = sym("cuDeviceGet", V, 0);
    CUresult (*cuDeviceGetName)(char *, int, CUdevice) = sym("cuDeviceGetName", V, 0);
    CUresult (*cuDeviceTotalMem)(size_t *, CUdevice) = sym("cuDeviceTotalMem", V, 0);
    CUresult (*cuCtxCreate)(CUcontext *, void *, unsigned, CUdevice) = sym("cuCtxCreate", V, 0); /* _v4 */
    CUresult (*cuCtxDestroy)(CUcontext) = sym("cuCtxDestroy", V, 0);
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t) = sym("cuMemAlloc", V, 0);
    CUresult (*cuMemFree)(CUdeviceptr) = sym("cuMemFree", V, 0);
    CUresult (*cuMemGetInfo)(size_t *, size_t *) = sym("cuMemGetInfo", V, 0);
    CUresult (*cuMemAllocPitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned) = sym("cuMemAllocPitch", V, 0);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice) = sym("cuDevicePrimaryCtxRetain", V, 0);
    CUresult (*cuDevicePrimaryCtxRelease)(CUdevice) = sym("cuDevicePrimaryCtxRelease", V, 0);
    CUresult (*cuCtxSetCurrent)(CUcontext) = sym("cuCtxSetCurrent", V, 0);
    CUresult (*cuStreamCreate)(CUstream *, unsigned) = sym("cuStreamCreate", V, 0);
    CUresult (*cuStreamSynchronize)(CUstream) = sym("cuStreamSynchronize", V, 2); /* _ptsz */
    CUresult (*cuMemAllocAsync)(CUdeviceptr *, size_t, CUstream) = sym("cuMemAllocAsync", V, 0);
    CUresult (*cuMemFreeAsync)(CUdeviceptr, CUstream) = sym("cuMemFreeAsync", V, 0);
    CUresult (*cuDeviceGetDefaultMemPool)(CUmemoryPool *, CUdevice) = sym("cuDeviceGetDefaultMemPool", V, 0);
    CUresult (*cuMemPoolSetAttribute)(CUmemoryPool, int, void *) = sym("cuMemPoolSetAttribute", V, 0);
    CUresult (*cuMemPoolGetAttribute)(CUmemoryPool, int, void *) = sym("cuMemPoolGetAttribute", V, 0);
    CUresult (*cuMemPoolTrimTo)(CUmemoryPool, size_t) = sym("cuMemPoolTrimTo", V, 0);
    CUresult (*cuMemCreate)(CUmemGenericAllocationHandle *, size_t, const AllocProp *, unsigned long long) = sym("cuMemCreate", V, 0);
    CUresult (*cuMemRelease)(CUmemGenericAllocationHandle) = sym("cuMemRelease", V, 0);
    CUresult (*cuMemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long) = sym("cuMemAddressReserve", V, 0);
    CUresult (*cuMemAddressFree)(CUdeviceptr, size_t) = sym("cuMemAddressFree", V, 0);
    CUresult (*cuMemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) = sym("cuMemMap", V, 0);
    CUresult (*cuMemUnmap)(CUdeviceptr, size_t) = sym("cuMemUnmap", V, 0);
    CUresult (*cuMemSetAccess)(CUdeviceptr, size_t, const AccessDesc *, size_t) = sym("cuMemSetAccess", V, 0);
    CUresult (*cuArrayCreate)(CUarray *, const ArrayDesc *) = sym("cuArrayCreate", V, 0);
    CUresult (*cuArrayDestroy)(CUarray) = sym("cuArrayDestroy", V, 0);
    CUresult (*cuGetErrorName)(CUresult, const char **) = sym("cuGetErrorName", V, 0);

    /* Version-dependent resolution, as the real driver does it. */
    void *a = NULL, *b = NULL; int st = -1;
    CHECK(pGetProc("cuMemAlloc", &a, 3010, 0, &st), 0);
    EXPECT(a == dlsym(lib, "cuMemAlloc") && st == 0);
    CHECK(pGetProc("cuMemAlloc", &b, 3020, 0, &st), 0);
    EXPECT(b == dlsym(lib, "cuMemAlloc_v2") && a != b);
    CHECK(pGetProc("cuDevicePrimaryCtxRelease", &a, 11000, 0, &st), 0);
    EXPECT(a == dlsym(lib, "cuDevicePrimaryCtxRelease_v2"));
    CHECK(pGetProc("cuStreamSynchronize", &a, V, 2, &st), 0);
    EXPECT(a == dlsym(lib, "cuStreamSynchronize_ptsz"));
    CHECK(pGetProc("cuNoSuchFunction", &a, V, 0, &st), 0);
    EXPECT(a == NULL && st == 1);
    CHECK(pGetProc("cuMemAllocAsync", &a, 11010, 0, &st), 0);
    EXPECT(a == NULL && st == 2);

    int ver = 0, n = 0; CUdevice dev; char name[64]; size_t total = 0, fr = 0, tot = 0;
    CUdeviceptr p = 0;
    CHECK(cuMemAlloc(&p, 1), 3); /* CUDA_ERROR_NOT_INITIALIZED before cuInit */
    CHECK(cuInit(0), 0);
    CHECK(cuDriverGetVersion(&ver), 0);
    CHECK(cuDeviceGetCount(&n), 0);
    CHECK(cuDeviceGet(&dev, 0), 0);
    CHECK(cuDeviceGetName(name, sizeof name, dev), 0);
    CHECK(cuDeviceTotalMem(&total, dev), 0);
    printf("driver %d, %d device(s), %s, %zu bytes\n", ver, n, name, total);
    CHECK(cuMemGetInfo(&fr, &tot), 201); /* CUDA_ERROR_INVALID_CONTEXT without a context */

    CUcontext ctx;
    CHECK(cuCtxCreate(&ctx, NULL, 0, dev), 0);
    size_t f0; CHECK(cuMemGetInfo(&f0, &tot), 0);
    CHECK(cuMemAlloc(&p, 1 << 30), 0);
    CHECK(cuMemGetInfo(&fr, &tot), 0);
    EXPECT(f0 - fr == (1u << 30));
    CHECK(cuMemFree(p), 0);
    CHECK(cuMemFree(p), 1);
    CHECK(cuMemFree(0), 0); /* free(NULL) semantics */
    CHECK(cuMemAlloc(&p, total), 2); /* CUDA_ERROR_OUT_OF_MEMORY */
    const char *en = NULL; CHECK(cuGetErrorName(2, &en), 0);
    EXPECT(en && strcmp(en, "CUDA_ERROR_OUT_OF_MEMORY") == 0);

    size_t pitch = 0;
    CHECK(cuMemAllocPitch(&p, &pitch, 1000, 100, 4), 0);
    EXPECT(pitch == 1024);
    CHECK(cuMemGetInfo(&fr, &tot), 0);
    EXPECT(f0 - fr == 1024 * 100);
    CHECK(cuMemFree(p), 0);

    /* Pools: freed memory stays reserved until a synchronisation point. */
    CUstream s; CUmemoryPool pool; unsigned long long v = 0;
    CHECK(cuStreamCreate(&s, 0), 0);
    CHECK(cuDeviceGetDefaultMemPool(&pool, dev), 0);
    CHECK(cuMemAllocAsync(&p, 3 << 20, s), 0);
    CHECK(cuMemPoolGetAttribute(pool, 5, &v), 0); /* RESERVED_MEM_CURRENT */
    EXPECT(v == 4 << 20);
    CHECK(cuMemFreeAsync(p, s), 0);
    CHECK(cuMemGetInfo(&fr, &tot), 0);
    EXPECT(f0 - fr == 4 << 20);
    CHECK(cuStreamSynchronize(s), 0);
    CHECK(cuMemGetInfo(&fr, &tot), 0);
    EXPECT(f0 == fr);
    v = ~0ull; CHECK(cuMemPoolSetAttribute(pool, 4, &v), 0); /* RELEASE_THRESHOLD = max */
    CHECK(cuMemAllocAsync(&p, 8 << 20, s), 0);
    CHECK(cuMemFreeAsync(p, s), 0);
    CHECK(cuStreamSynchronize(s), 0);
    CHECK(cuMemGetInfo(&fr, &tot), 0);
    EXPECT(f0 - fr == 8 << 20);
    CHECK(cuMemPoolTrimTo(pool, 0), 0);
    CHECK(cuMemGetInfo(&fr, &tot), 0);
    EXPECT(f0 == fr);

    /* VMM: memory goes when released AND unmapped. */
    AllocProp prop; memset(&prop, 0, sizeof prop); prop.type = 1; prop.locType = 1; prop.locId = 0;
    CUmemGenericAllocationHandle h; CUdeviceptr va;
    CHECK(cuMemCreate(&h, (2 << 20) + 1, &prop, 0), 1);
    CHECK(cuMemCreate(&h, 4 << 20, &prop, 0), 0);
    CHECK(cuMemAddressReserve(&va, 4 << 20, 0, 0, 0), 0);
    CHECK(cuMemMap(va, 4 << 20, 0, h, 0), 0);
    AccessDesc ad = {1, 0, 3};
    CHECK(cuMemSetAccess(va, 4 << 20, &ad, 1), 0);
    CHECK(cuMemRelease(h), 0);
    CHECK(cuMemGetInfo(&fr, &tot), 0);
    EXPECT(f0 - fr == 4 << 20);
    CHECK(cuMemUnmap(va, 4 << 20), 0);
    CHECK(cuMemAddressFree(va, 4 << 20), 0);
    CHECK(cuMemGetInfo(&fr, &tot), 0);
    EXPECT(f0 == fr);

    /* Arrays: bytes rounded up to 2 MiB. */
    CUarray arr; ArrayDesc desc = {1024, 1024, 0x20, 4};
    CHECK(cuArrayCreate(&arr, &desc), 0);
    CHECK(cuMemGetInfo(&fr, &tot), 0);
    EXPECT(f0 - fr == 16 << 20);
    CHECK(cuArrayDestroy(arr), 0);

    /* Primary context: reference counted, overhead once. */
    CUcontext pc1, pc2; size_t f1;
    CHECK(cuDevicePrimaryCtxRetain(&pc1, dev), 0);
    CHECK(cuDevicePrimaryCtxRetain(&pc2, dev), 0);
    EXPECT(pc1 == pc2);
    CHECK(cuMemGetInfo(&f1, &tot), 0);
    CHECK(cuDevicePrimaryCtxRelease(dev), 0);
    CHECK(cuDevicePrimaryCtxRelease(dev), 0);
    CHECK(cuMemGetInfo(&fr, &tot), 0);
    EXPECT(fr - f1 == f0 - f1 && fr == f0);
    CHECK(cuCtxDestroy(ctx), 0);

    if (hold > 0) {
        CUcontext pc;
        CHECK(cuDevicePrimaryCtxRetain(&pc, dev), 0);
        CHECK(cuCtxSetCurrent(pc), 0);
        CHECK(cuMemAlloc(&p, 1 << 30), 0);
        printf("HOLDING pid %d\n", (int)getpid());
        fflush(stdout);
        sleep(hold);
    }
    printf("%d passed, %d failed\n", failures ? 0 : 1, failures ? 1 : 0);
    return failures ? 1 : 0;
}
