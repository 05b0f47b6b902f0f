/* fgpu-bench client: stream-ordered allocation from many threads at once.
 *
 * THREADS threads, each with a stream of its own, allocate and free SIZE bytes
 * (cuMemAllocAsync + cuMemFreeAsync on their stream) for DURATION_MS milliseconds, all
 * through cuGetProcAddress_v2 as cudart does, from the device's default pool (release
 * threshold set to the maximum, as PyTorch and JAX set it, so the pool keeps its memory).
 *
 *   async_threads THREADS SIZE DURATION_MS
 *
 * Prints one line: "pairs P start_ns S end_ns E total_mem T". Exit 1 on error.
 *
 * Built by fgpu-bench with: cc -O2 -o async_threads async_threads.c -ldl -lpthread (with client.h
 * beside it)
 */
#define CLIENT "async_threads"
#include "client.h"
#include <pthread.h>
#include <string.h>

typedef unsigned long long CUdeviceptr;
typedef void *CUstream;
typedef void *CUmemoryPool;

static CUresult (*cuCtxSetCurrent)(CUcontext);
static CUresult (*cuStreamCreate)(CUstream *, unsigned);
static CUresult (*cuStreamSynchronize)(CUstream);
static CUresult (*cuMemAllocAsync)(CUdeviceptr *, size_t, CUstream);
static CUresult (*cuMemFreeAsync)(CUdeviceptr, CUstream);
static CUcontext ctx;
static size_t size;
static uint64_t start_at, end_at;
static uint64_t counts[64];

static void *worker(void *arg) {
    size_t me = (size_t)arg;
    CUstream stream;
    CUdeviceptr p;
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuStreamCreate(&stream, 0));
    for (int i = 0; i < 2000; i++) {
        CHECK(cuMemAllocAsync(&p, size, stream));
        CHECK(cuMemFreeAsync(p, stream));
    }
    while (now_ns() < start_at) {}
    uint64_t pairs = 0;
    do {
        for (int i = 0; i < 64; i++) {
            CHECK(cuMemAllocAsync(&p, size, stream));
            CHECK(cuMemFreeAsync(p, stream));
        }
        pairs += 64;
    } while (now_ns() < end_at);
    CHECK(cuStreamSynchronize(stream));
    counts[me] = pairs;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: async_threads THREADS SIZE DURATION_MS\n");
        return 2;
    }
    int threads = atoi(argv[1]);
    if (threads < 1 || threads > 64) threads = 8;
    size = strtoull(argv[2], NULL, 10);
    uint64_t duration = strtoull(argv[3], NULL, 10) * 1000000ull;
    open_driver();
    CUresult (*cuDeviceGetMemPool)(CUmemoryPool *, CUdevice) = sym("cuDeviceGetMemPool");
    CUresult (*cuMemPoolSetAttribute)(CUmemoryPool, int, void *) = sym("cuMemPoolSetAttribute");
    CUresult (*cuMemGetInfo)(size_t *, size_t *) = sym("cuMemGetInfo");
    cuCtxSetCurrent = sym("cuCtxSetCurrent");
    cuStreamCreate = sym("cuStreamCreate");
    cuStreamSynchronize = sym("cuStreamSynchronize");
    cuMemAllocAsync = sym("cuMemAllocAsync");
    cuMemFreeAsync = sym("cuMemFreeAsync");
    CUmemoryPool pool;
    CUdevice dev = first_device();
    ctx = primary_context(dev);
    CHECK(cuDeviceGetMemPool(&pool, dev));
    uint64_t keep_all = UINT64_MAX; /* CU_MEMPOOL_ATTR_RELEASE_THRESHOLD */
    CHECK(cuMemPoolSetAttribute(pool, 4, &keep_all));
    start_at = now_ns() + 200000000ull;
    end_at = start_at + duration;
    pthread_t t[64];
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, worker, (void *)(size_t)i);
    uint64_t pairs = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i], NULL);
        pairs += counts[i];
    }
    uint64_t end = now_ns();
    size_t free_mem = 0, total_mem = 0;
    CHECK(cuMemGetInfo(&free_mem, &total_mem));
    printf("pairs %llu start_ns %llu end_ns %llu total_mem %zu\n", (unsigned long long)pairs,
           (unsigned long long)start_at, (unsigned long long)end, total_mem);
    return 0;
}
