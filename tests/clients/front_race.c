/* front_race: many threads make a process's first hooked call at the same moment, so the
 * front (libfgpu.so) loads the shim while the others wait for it.
 *
 * cuInit is looked up first (not a hooked name: nothing is loaded), then 16 threads,
 * released together by a barrier, each look up cuDeviceTotalMem_v2 (hooked) through the
 * driver's handle. Prints "same S rc R total T": S = 1 if every thread got the same
 * non-null address, R and T what that function answers for device 0.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>

#define THREADS 16

static void *lib;
static pthread_barrier_t start;
static void *got[THREADS];

static void *worker(void *arg) {
    long i = (long)arg;
    pthread_barrier_wait(&start);
    got[i] = dlsym(lib, "cuDeviceTotalMem_v2");
    return NULL;
}

int main(void) {
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) { printf("dlopen failed: %s\n", dlerror()); return 1; }
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(lib, "cuInit");
    if (init == NULL || init(0) != 0) { printf("cuInit failed\n"); return 1; }
    pthread_t threads[THREADS];
    pthread_barrier_init(&start, NULL, THREADS);
    for (long i = 0; i < THREADS; i++) pthread_create(&threads[i], NULL, worker, (void *)i);
    for (int i = 0; i < THREADS; i++) pthread_join(threads[i], NULL);
    int same = got[0] != NULL;
    for (int i = 1; i < THREADS; i++) same = same && got[i] == got[0];
    size_t total = 0;
    int rc = -1;
    if (got[0] != NULL) rc = ((int (*)(size_t *, int))got[0])(&total, 0);
    printf("same %d rc %d total %zu\n", same, rc, total);
    return 0;
}
