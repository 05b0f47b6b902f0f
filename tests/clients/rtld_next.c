/*
 * Regression for dlsym(RTLD_NEXT) under the shim. Built three ways:
 *   -DROLE_FIRST  -> libfgpu_rtld_first.so:  fgpu_marker() = 1, probe_next() looks up the
 *                    next fgpu_marker with RTLD_NEXT, which must be the second library's
 *   -DROLE_SECOND -> libfgpu_rtld_second.so: fgpu_marker() = 2
 *   (neither)     -> the program, linked against both in that order; prints "next=N".
 * If the shim forwarded RTLD_NEXT with an ordinary call, glibc would resolve relative to the
 * shim (loaded before both) and return the first library's marker: "next=1".
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

#if defined(ROLE_FIRST)
int fgpu_marker(void) { return 1; }
int probe_next(void) {
    int (*next)(void) = (int (*)(void))dlsym(RTLD_NEXT, "fgpu_marker");
    return next ? next() : -1;
}
#elif defined(ROLE_SECOND)
int fgpu_marker(void) { return 2; }
#else
int probe_next(void);
int main(void) {
    printf("next=%d\n", probe_next());
    return 0;
}
#endif
