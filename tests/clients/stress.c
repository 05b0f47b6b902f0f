/*
 * stress THREADS SECONDS MAX_MIB: THREADS threads allocate and free random sizes of up to
 * MAX_MIB through the cuGetProcAddress path until SECONDS have passed. Prints
 * "stress allocs=A refusals=R frees=F" and exits 0; any error other than
 * CUDA_ERROR_OUT_OF_MEMORY prints "stress error rc=N" and exits 1.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
static CUresult (*gpa)(const char *, void **, int, unsigned long long, int *);
static CUresult (*p_init)(unsigned);
static CUresult (*p_retain)(CUcontext *, int);
static CUresult (*p_set)(CUcontext);
static CUresult (*p_alloc)(CUdeviceptr *, size_t);
static CUresult (*p_free)(CUdeviceptr);
static CUcontext ctx;
static double seconds;
static size_t max_bytes;
static long allocs, refusals, frees;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }

static void *worker(void *arg) {
    unsigned seed = (unsigned)(size_t)arg ^ (unsigned)getpid();
    CUdeviceptr held[16]; int n = 0; long a = 0, r = 0, f = 0;
    p_set(ctx);
    double end = now() + seconds;
    while (now() < end) {
        if (n < 16 && (n == 0 || rand_r(&seed) % 2)) {
            size_t size = ((size_t)rand_r(&seed) % max_bytes) + 1;
            CUresult rc = p_alloc(&held[n], size);
            if (rc == 0) { n++; a++; }
            else if (rc == 2) r++;
            else { printf("stress error rc=%d\n", rc); exit(1); }
        } else {
            int i = rand_r(&seed) % n;
            CUresult rc = p_free(held[i]);
            if (rc) { printf("stress error rc=%d\n", rc); exit(1); }
            held[i] = held[--n]; f++;
        }
    }
    while (n) { p_free(held[--n]); f++; }
    pthread_mutex_lock(&lock); allocs += a; refusals += r; frees += f; pthread_mutex_unlock(&lock);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 4) return 2;
    int threads = atoi(argv[1]); seconds = atof(argv[2]); max_bytes = (size_t)atol(argv[3]) << 20;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) { printf("stress error dlopen\n"); return 1; }
    gpa = dlsym(lib, "cuGetProcAddress_v2");
    int st;
    gpa("cuInit", (void **)&p_init, 12080, 0, &st);
    gpa("cuDevicePrimaryCtxRetain", (void **)&p_retain, 12080, 0, &st);
    gpa("cuCtxSetCurrent", (void **)&p_set, 12080, 0, &st);
    gpa("cuMemAlloc", (void **)&p_alloc, 12080, 0, &st);
    gpa("cuMemFree", (void **)&p_free, 12080, 0, &st);
    CUresult rc = p_init(0);
    if (!rc) rc = p_retain(&ctx, 0);
    if (rc) { printf("stress context rc=%d\n", rc); return rc == 2 ? 0 : 1; }
    printf("stress started\n"); fflush(stdout);
    pthread_t t[64];
    for (int i = 0; i < threads && i < 64; i++) pthread_create(&t[i], NULL, worker, (void *)(size_t)i);
    for (int i = 0; i < threads && i < 64; i++) pthread_join(t[i], NULL);
    printf("stress allocs=%ld refusals=%ld frees=%ld\n", allocs, refusals, frees);
    return 0;
}
