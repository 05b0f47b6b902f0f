#include "front.h"

/* The bounds of the section above, set by the linker: an address in it is one of ours. */
extern const char __start_fgpu_front_entries[] HIDDEN;
extern const char __stop_fgpu_front_entries[] HIDDEN;
/* The front's own dlsym and dlvsym, reached without a relocation. */
extern const char fgpu_front_dlsym_self[] HIDDEN;
extern const char fgpu_front_dlvsym_self[] HIDDEN;

static void *find_nothing(void) { return NULL; }

/* ------------------------------------------------------------------------------------
 * dlsym and dlvsym. */

/* Whether `name` is one glibc has exported a lookup function under: 1 for dlsym's kind
 * (handle, name), 2 for dlvsym's (and a version), 0 for neither. __libc_dlsym, _dl_sym and
 * their versioned twins are glibc's before 2.34. */
static int lookup_function(const char *name) {
    if (name[0] != 'd' && name[0] != '_') return 0;
    if (same(name, "dlsym") || same(name, "__libc_dlsym") || same(name, "_dl_sym")) return 1;
    if (same(name, "dlvsym") || same(name, "__libc_dlvsym") || same(name, "_dl_vsym")) return 2;
    return 0;
}

static void *own_lookup_function(const char *name) {
    return (void *)(lookup_function(name) == 1 ? fgpu_front_dlsym_self : fgpu_front_dlvsym_self);
}

/* What glibc found for a hooked name (never RTLD_NEXT), as the answer. Our own entry point
 * (a lookup through RTLD_DEFAULT finds the preloaded front first) goes back as it is;
 * anything else is the driver's, and goes to the shim, which remembers it and answers with
 * its wrapper, as when the shim itself is preloaded. */
static void *hooked_answer(void *found, void *handle, const char *name, const char *version) {
    if (found == NULL) return NULL;
    if ((const char *)found >= __start_fgpu_front_entries && (const char *)found < __stop_fgpu_front_entries)
        return found;
    if (!loaded()) return NULL;
    if (version == NULL) {
        dlsym_fn shim = __atomic_load_n(&shim_dlsym, __ATOMIC_ACQUIRE);
        return shim != NULL ? shim(handle, name) : NULL;
    }
    dlvsym_fn shim = __atomic_load_n(&shim_dlvsym, __ATOMIC_ACQUIRE);
    return shim != NULL ? shim(handle, name, version) : NULL;
}

static void *dlsym_hooked(void *handle, const char *name) {
    dlsym_fn real = real_dlsym();
    return hooked_answer(real != NULL ? real(handle, name) : NULL, handle, name, NULL);
}

static void *dlvsym_hooked(void *handle, const char *name, const char *version) {
    dlvsym_fn real = real_dlvsym();
    return hooked_answer(real != NULL ? real(handle, name, version) : NULL, handle, name, version);
}

/* A lookup of a glibc lookup function through a handle (or RTLD_DEFAULT): the front's own,
 * where glibc finds one at all. */
static void *dlsym_lookup_function(void *handle, const char *name) {
    dlsym_fn real = real_dlsym();
    if (real == NULL || real(handle, name) == NULL) return NULL;
    return own_lookup_function(name);
}

static void *dlvsym_lookup_function(void *handle, const char *name, const char *version) {
    dlvsym_fn real = real_dlvsym();
    if (real == NULL || real(handle, name, version) == NULL) return NULL;
    return own_lookup_function(name);
}

/* An RTLD_NEXT lookup of a hooked name or of a lookup function (dlsym's and dlvsym's, the
 * version ignored). The next definition after the caller cannot be told without being the
 * caller, and whatever it is, it would be glibc's or the driver's: the answer is the
 * front's own, found through the front's own handle (which searches the front first). */
static void *next_answer(void *handle, const char *name) {
    static void *self;
    void *own = __atomic_load_n(&self, __ATOMIC_ACQUIRE);
    dlsym_fn real = real_dlsym();
    (void)handle;
    if (lookup_function(name)) return own_lookup_function(name);
    if (own == NULL && dlopen != NULL) {
        const char *path = own_path();
        own = path != NULL ? dlopen(path, RTLD_LAZY | RTLD_NOLOAD) : NULL;
        if (own != NULL) __atomic_store_n(&self, own, __ATOMIC_RELEASE);
    }
    return own != NULL && real != NULL ? real(own, name) : NULL;
}

/* Called by the exported dlsym with its arguments: where to continue with them. */
HIDDEN void *fgpu_front_dlsym_route(void *handle, const char *name) {
    dlsym_fn real = real_dlsym();
    if (real == NULL) return (void *)find_nothing;
    if (name == NULL) return (void *)real;
    if (lookup_function(name)) return handle == RTLD_NEXT ? (void *)next_answer : (void *)dlsym_lookup_function;
    if (hooked_index(name) < 0) return (void *)real;
    return handle == RTLD_NEXT ? (void *)next_answer : (void *)dlsym_hooked;
}

/* Called by the exported dlvsym with its arguments: where to continue with them. */
HIDDEN void *fgpu_front_dlvsym_route(void *handle, const char *name, const char *version) {
    dlvsym_fn real = real_dlvsym();
    (void)version;
    if (real == NULL) return (void *)find_nothing;
    if (name == NULL) return (void *)real;
    if (lookup_function(name)) return handle == RTLD_NEXT ? (void *)next_answer : (void *)dlvsym_lookup_function;
    if (hooked_index(name) < 0) return (void *)real;
    return handle == RTLD_NEXT ? (void *)next_answer : (void *)dlvsym_hooked;
}
