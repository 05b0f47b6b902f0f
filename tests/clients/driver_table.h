/* The driver entry points a test client uses, reached the three ways a program can reach
 * them: linked (-DLINKED, against libcuda.so.1), through dlsym on a dlopen'ed libcuda.so.1,
 * or through cuGetProcAddress_v2 by base name and flags, as cudart does.
 *
 * Before including this file, define FNS(X) as one X(var, exported, base, flags, ret,
 * args) per entry point, and under LINKED #define the names cuda.h maps to versioned
 * symbols. It declares each entry point, CALL(var) to call it, and
 * resolve(mode) ("dlsym", else cuGetProcAddress_v2 asking for CUDA version
 * resolve_version, 12080 unless the client changes it), which prints the first one it
 * cannot find and returns 1. */
#ifndef FGPU_TEST_DRIVER_TABLE_H
#define FGPU_TEST_DRIVER_TABLE_H

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#ifdef LINKED
#define DECL(var, exported, base, flags, ret, args) extern ret var args;
FNS(DECL)
#define CALL(f) f
#else
#define DECL(var, exported, base, flags, ret, args) static ret(*p_##var) args;
FNS(DECL)
#define CALL(f) p_##f
#endif

static int resolve_version = 12080;

static int resolve(const char *mode) {
#ifndef LINKED
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) { printf("dlopen failed: %s\n", dlerror()); return 1; }
    CUresult (*gpa)(const char *, void **, int, unsigned long long, int *) = dlsym(lib, "cuGetProcAddress_v2");
    int procaddr = strcmp(mode, "dlsym") != 0;
#define RESOLVE(var, exported, base, flags, ret, args) { \
        void *p = NULL; int st = 0; \
        if (procaddr) { if (gpa) gpa(base, &p, resolve_version, flags, &st); } else p = dlsym(lib, exported); \
        if (!p) { printf("cannot resolve %s\n", exported); return 1; } \
        p_##var = (ret(*) args)p; }
    FNS(RESOLVE)
#else
    (void)mode;
#endif
    return 0;
}

#endif
