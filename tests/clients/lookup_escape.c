/*
 * lookup_escape: every way a capped program can ask the dynamic loader for a driver
 * function (or for the loader's own lookup functions, to ask them instead), each followed
 * by what the function does: six 512 MiB cuMemAlloc_v2 calls, or nvmlDeviceGetMemoryInfo.
 * Under a 1 GiB cap at most one allocation may pass, and NVML must show the cap, whatever
 * route handed out the function.
 *
 *   lookup_escape ROUTE     prints "route ROUTE", then "alloc rc=N" per allocation, or
 *                           "nvml total=BYTES", or "absent" when the route finds nothing
 *                           (a name this glibc does not export).
 *
 * Built twice: as the program, and with -DROLE_LIBRARY as libfgpu_lookup_next.so, a library
 * that needs libcuda.so.1 and asks for the next cuMemAlloc_v2 after itself with RTLD_NEXT
 * (the next definition after a library placed before the driver is the driver's own).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*alloc_fn)(unsigned long long *, size_t);
typedef void *(*dlsym_fn)(void *, const char *);
typedef void *(*dlvsym_fn)(void *, const char *, const char *);

#if defined(ROLE_LIBRARY)
int cuDriverGetVersion(int *);
void *fgpu_next_alloc(int versioned) {
    int v;
    cuDriverGetVersion(&v); /* a real use of libcuda.so.1, so the link keeps it needed */
    return versioned ? dlvsym(RTLD_NEXT, "cuMemAlloc_v2", "GLIBC_2.2.5") : dlsym(RTLD_NEXT, "cuMemAlloc_v2");
}
#else

#if defined(__x86_64__)
#define OLD_GLIBC "GLIBC_2.2.5"
#else
#define OLD_GLIBC "GLIBC_2.17"
#endif

/* `name` (dlsym or dlvsym) through `handle`, by dlsym, or by dlvsym at glibc's versions. */
static void *loader_function(void *handle, const char *name, int versioned) {
    if (!versioned) return dlsym(handle, name);
    void *f = dlvsym(handle, name, "GLIBC_2.34");
    return f != NULL ? f : dlvsym(handle, name, OLD_GLIBC);
}

static void *must_open(const char *name, int flags) {
    void *h = dlopen(name, flags);
    if (!h) {
        fprintf(stderr, "dlopen %s: %s\n", name, dlerror());
        exit(3);
    }
    return h;
}

/* Six allocations of 512 MiB through `alloc`, after a context made through the handle. */
static int allocate(void *cuda, alloc_fn alloc) {
    if (alloc == NULL) {
        printf("absent\n");
        return 0;
    }
    int (*init)(unsigned) = dlsym(cuda, "cuInit");
    int (*get)(int *, int) = dlsym(cuda, "cuDeviceGet");
    int (*retain)(void **, int) = dlsym(cuda, "cuDevicePrimaryCtxRetain");
    int (*current)(void *) = dlsym(cuda, "cuCtxSetCurrent");
    int device;
    void *ctx;
    if (!init || !get || !retain || !current || init(0) || get(&device, 0) || retain(&ctx, device) || current(ctx)) {
        printf("setup failed\n");
        return 4;
    }
    for (int i = 0; i < 6; i++) {
        unsigned long long p = 0;
        printf("alloc rc=%d\n", alloc(&p, 512ull << 20));
    }
    return 0;
}

typedef struct { unsigned long long total, free, used; } nvml_memory;

static int nvml_total(void *nvml, void *get_memory) {
    int (*init)(void) = dlsym(nvml, "nvmlInit_v2");
    int (*handle)(unsigned, void **) = dlsym(nvml, "nvmlDeviceGetHandleByIndex_v2");
    int (*memory)(void *, nvml_memory *) = (int (*)(void *, nvml_memory *))get_memory;
    void *dev;
    nvml_memory m;
    if (!init || !handle || init() || handle(0, &dev) || memory(dev, &m)) {
        printf("nvml failed\n");
        return 4;
    }
    printf("nvml total=%llu\n", m.total);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    const char *route = argv[1];
    printf("route %s\n", route);
    void *cuda = must_open("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    void *libc = must_open("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    void *found = NULL;
    /* Through glibc's lookup functions, asked for by name. */
    struct { const char *route; void *handle; const char *name; int versioned; } loaders[] = {
        { "dlvsym-next-dlsym", RTLD_NEXT, "dlsym", 1 },
        { "dlvsym-default-dlsym", RTLD_DEFAULT, "dlsym", 1 },
        { "dlvsym-libc-dlsym", libc, "dlsym", 1 },
        { "dlsym-libc-dlsym", libc, "dlsym", 0 },
        { "dlsym-next-dlsym", RTLD_NEXT, "dlsym", 0 },
        { "dlsym-private-dlsym", RTLD_DEFAULT, "__libc_dlsym", 0 },
        { "dlsym-private-dl-sym", RTLD_DEFAULT, "_dl_sym", 0 },
    };
    for (size_t i = 0; i < sizeof loaders / sizeof loaders[0]; i++) {
        if (strcmp(route, loaders[i].route) != 0) continue;
        dlsym_fn lookup = (dlsym_fn)loader_function(loaders[i].handle, loaders[i].name, loaders[i].versioned);
        if (lookup == NULL) {
            printf("absent\n");
            return 0;
        }
        return allocate(cuda, (alloc_fn)lookup(cuda, "cuMemAlloc_v2"));
    }
    struct { const char *route; void *handle; int versioned; } vloaders[] = {
        { "dlvsym-next-dlvsym", RTLD_NEXT, 1 },
        { "dlvsym-libc-dlvsym", libc, 1 },
        { "dlsym-libc-dlvsym", libc, 0 },
    };
    for (size_t i = 0; i < sizeof vloaders / sizeof vloaders[0]; i++) {
        if (strcmp(route, vloaders[i].route) != 0) continue;
        dlvsym_fn lookup = (dlvsym_fn)loader_function(vloaders[i].handle, "dlvsym", vloaders[i].versioned);
        if (lookup == NULL) {
            printf("absent\n");
            return 0;
        }
        /* The driver's functions are unversioned: dlvsym never finds them, but it finds
         * glibc's dlsym, which does. */
        dlsym_fn plain = (dlsym_fn)lookup(libc, "dlsym", "GLIBC_2.34");
        if (plain == NULL) plain = (dlsym_fn)lookup(libc, "dlsym", OLD_GLIBC);
        if (plain == NULL) {
            printf("absent\n");
            return 0;
        }
        return allocate(cuda, (alloc_fn)plain(cuda, "cuMemAlloc_v2"));
    }
    /* The driver's functions themselves, with a version. */
    if (!strcmp(route, "dlvsym-handle")) found = dlvsym(cuda, "cuMemAlloc_v2", OLD_GLIBC);
    if (!strcmp(route, "dlvsym-default")) found = dlvsym(RTLD_DEFAULT, "cuMemAlloc_v2", "FGPU_ANY");
    if (!strcmp(route, "dlvsym-next")) found = dlvsym(RTLD_NEXT, "cuMemAlloc_v2", OLD_GLIBC);
    if (!strcmp(route, "dlsym-next")) found = dlsym(RTLD_NEXT, "cuMemAlloc_v2");
    /* RTLD_NEXT from a library that needs the driver: the next after it is the driver's. */
    if (!strncmp(route, "library-next", 12)) {
        void *library = must_open("libfgpu_lookup_next.so", RTLD_NOW | RTLD_LOCAL);
        void *(*next)(int) = (void *(*)(int))dlsym(library, "fgpu_next_alloc");
        found = next ? next(route[12] == '-') : NULL;
    }
    if (found != NULL) return allocate(cuda, (alloc_fn)found);
    /* NVML's memory answer, with a version and through glibc's dlsym asked for by version. */
    if (!strncmp(route, "nvml-", 5)) {
        void *nvml = must_open("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
        void *get = NULL;
        if (!strcmp(route, "nvml-dlvsym")) get = dlvsym(nvml, "nvmlDeviceGetMemoryInfo", OLD_GLIBC);
        if (!strcmp(route, "nvml-dlvsym-next-dlsym")) {
            dlsym_fn lookup = (dlsym_fn)loader_function(RTLD_NEXT, "dlsym", 1);
            get = lookup ? lookup(nvml, "nvmlDeviceGetMemoryInfo") : NULL;
        }
        if (get == NULL) {
            printf("absent\n");
            return 0;
        }
        return nvml_total(nvml, get);
    }
    printf("absent\n");
    return 0;
}
#endif
