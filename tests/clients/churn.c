/*
 * churn: threads that allocate and free at random through every kind of device memory a
 * framework uses, until killed or until the time is up: cuMemAlloc_v2/cuMemFree_v2,
 * cuMemAllocAsync/cuMemFreeAsync (with a stream synchronisation now and then, where the
 * pool gives memory back) and cuMemCreate/cuMemRelease, all resolved through
 * cuGetProcAddress_v2 as cudart does.
 *
 *   churn THREADS SECONDS MIN_MIB MAX_MIB
 *
 * Prints "churn started" once its context exists; any result but success or
 * CUDA_ERROR_OUT_OF_MEMORY (2) is printed and exits 1.
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
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef void *CUcontext;
typedef struct { int type; int id; } CUmemLocation;
typedef struct {
    int type; int requestedHandleTypes; CUmemLocation location; void *win32HandleMetaData;
    unsigned char compressionType, gpuDirectRDMACapable; unsigned short usage; unsigned char reserved[4];
} CUmemAllocationProp;

static CUresult (*gpa)(const char *, void **, int, unsigned long long, int *);
static CUresult (*p_init)(unsigned);
static CUresult (*p_retain)(CUcontext *, int);
static CUresult (*p_set)(CUcontext);
static CUresult (*p_alloc)(CUdeviceptr *, size_t);
static CUresult (*p_free)(CUdeviceptr);
static CUresult (*p_alloc_async)(CUdeviceptr *, size_t, void *);
static CUresult (*p_free_async)(CUdeviceptr, void *);
static CUresult (*p_sync)(void *);
static CUresult (*p_create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
static CUresult (*p_release)(CUmemGenericAllocationHandle);
static CUcontext ctx;
static double seconds;
static size_t min_bytes, max_bytes;
/* CHURN_KINDS: which kinds to use, a bit each (1 cuMemAlloc, 2 cuMemAllocAsync, 4 cuMemCreate). */
static int kinds = 7;

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }

static void check(const char *what, CUresult rc) {
    if (rc != 0 && rc != 2) { printf("churn error %s rc=%d\n", what, rc); fflush(stdout); exit(1); }
}

struct held { int kind; unsigned long long handle; };

static void give_back(struct held h) {
    if (h.kind == 0) check("cuMemFree", p_free(h.handle));
    else if (h.kind == 1) check("cuMemFreeAsync", p_free_async(h.handle, NULL));
    else check("cuMemRelease", p_release(h.handle));
}

static void *worker(void *arg) {
    unsigned seed = (unsigned)(size_t)arg * 7919u ^ (unsigned)getpid();
    struct held held[12]; int n = 0;
    CUmemAllocationProp prop; memset(&prop, 0, sizeof prop);
    prop.type = 1; prop.location.type = 1; prop.location.id = 0;
    p_set(ctx);
    double end = now() + seconds;
    while (now() < end) {
        if (n < 12 && (n == 0 || rand_r(&seed) % 2)) {
            size_t size = min_bytes + (size_t)((double)rand_r(&seed) / RAND_MAX * (max_bytes - min_bytes));
            int kind = rand_r(&seed) % 3;
            while (!(kinds >> kind & 1)) kind = rand_r(&seed) % 3;
            unsigned long long h = 0; CUresult rc;
            if (kind == 0) rc = p_alloc((CUdeviceptr *)&h, size);
            else if (kind == 1) rc = p_alloc_async((CUdeviceptr *)&h, size, NULL);
            else rc = p_create(&h, (size + (2u << 20) - 1) & ~((size_t)(2u << 20) - 1), &prop, 0);
            check("allocation", rc);
            if (rc == 0) { held[n].kind = kind; held[n].handle = h; n++; }
        } else {
            int i = rand_r(&seed) % n;
            give_back(held[i]);
            held[i] = held[--n];
            if (rand_r(&seed) % 8 == 0) check("cuStreamSynchronize", p_sync(NULL));
        }
    }
    while (n) give_back(held[--n]);
    check("cuStreamSynchronize", p_sync(NULL));
    return NULL;
}

#define GET(name, var) gpa(name, (void **)&var, 12080, 0, &st)

int main(int argc, char **argv) {
    if (argc < 5) return 2;
    int threads = atoi(argv[1]); seconds = atof(argv[2]);
    min_bytes = (size_t)atol(argv[3]) << 20; max_bytes = (size_t)atol(argv[4]) << 20;
    if (getenv("CHURN_KINDS")) kinds = atoi(getenv("CHURN_KINDS")) & 7;
    if (!kinds) kinds = 7;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) { printf("churn error dlopen\n"); return 1; }
    gpa = dlsym(lib, "cuGetProcAddress_v2");
    int st;
    GET("cuInit", p_init); GET("cuDevicePrimaryCtxRetain", p_retain); GET("cuCtxSetCurrent", p_set);
    GET("cuMemAlloc", p_alloc); GET("cuMemFree", p_free); GET("cuMemAllocAsync", p_alloc_async);
    GET("cuMemFreeAsync", p_free_async); GET("cuStreamSynchronize", p_sync);
    GET("cuMemCreate", p_create); GET("cuMemRelease", p_release);
    CUresult rc = p_init(0);
    if (!rc) rc = p_retain(&ctx, 0);
    if (rc) { printf("churn context rc=%d\n", rc); return rc == 2 ? 0 : 1; }
    printf("churn started\n"); fflush(stdout);
    pthread_t t[64];
    for (int i = 0; i < threads && i < 64; i++) pthread_create(&t[i], NULL, worker, (void *)(size_t)i);
    for (int i = 0; i < threads && i < 64; i++) pthread_join(t[i], NULL);
    printf("churn done\n");
    return 0;
}
