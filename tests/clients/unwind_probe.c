/* Calls libfgpu.so's fgpu_selftest_unwind (found through dlsym, so the shim must be
 * preloaded): a panic raised and caught inside the shim. Prints "caught 1" when the
 * shim's unwinder works; exits 3 when the shim is not loaded. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

int main(void) {
    int (*selftest)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "fgpu_selftest_unwind");
    if (!selftest) {
        puts("missing");
        return 3;
    }
    printf("caught %d\n", selftest());
    return 0;
}
