/* The front's own header: what its files share. front.c tells what the front is. */
#ifndef FGPU_FRONT_H
#define FGPU_FRONT_H

#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#define HIDDEN __attribute__((visibility("hidden")))

/* Families of entry points, for the value a refused call returns. */
#define FAMILY_CUDA 0
#define FAMILY_NVML 1
#define FAMILY_OTHER 2

/* dlopen and dlerror are weak and, in the release build (linked against glibc 2.17's
 * libraries, where they live in libdl.so.2, which the front does not link), unversioned:
 * on glibc >= 2.34 they bind to libc.so.6, before 2.34 to libdl.so.2 if the process has
 * it. A process that can reach a hooked function has: dlsym, libcuda.so.1 and
 * libnvidia-ml.so.1 all need libdl.so.2 there. Without it the shim cannot be loaded and
 * the front refuses. Not linking libdl.so.2 (nor libpthread.so.0) is what keeps the
 * release build from loading two more files into every process on new systems. glibc's
 * dlsym and dlvsym are never called by name: the front defines both (see real_dlsym). */
#pragma weak dlopen
#pragma weak dlerror

typedef void *(*dlsym_fn)(void *handle, const char *name);
typedef void *(*dlvsym_fn)(void *handle, const char *name, const char *version);

static inline int compare(const char *a, const char *b) {
    while (*a != '\0' && *a == *b) {
        a++;
        b++;
    }
    return (int)(unsigned char)*a - (int)(unsigned char)*b;
}

static inline int same(const char *a, const char *b) { return compare(a, b) == 0; }

/* front.c: the table's index of a hooked name, or -1. */
HIDDEN int hooked_index(const char *name);
/* front.c: loads the shim if nobody has yet; 1 if it is loaded. */
HIDDEN int loaded(void);
/* front.c: the path this library was loaded from, or NULL. */
HIDDEN const char *own_path(void);
/* front.c: the shim's dlsym and dlvsym, once it is loaded. */
extern HIDDEN dlsym_fn shim_dlsym;
extern HIDDEN dlvsym_fn shim_dlvsym;
/* glibc.c: glibc's own dlsym and dlvsym, or NULL. */
HIDDEN dlsym_fn real_dlsym(void);
HIDDEN dlvsym_fn real_dlvsym(void);

#endif
