#include "front.h"

/* ------------------------------------------------------------------------------------
 * glibc's own dlsym and dlvsym.
 *
 * The front defines both, so every call of either by name, its own included, lands in the
 * front, and the answer to a lookup of either is the front's. glibc's are read from the
 * dynamic symbol table of the loaded libc.so.6 (glibc >= 2.34) or libdl.so.2 (before),
 * which dl_iterate_phdr shows; no lookup function is called. The default version of the
 * name is taken, else any. core/src/sys.rs (glibc_symbol) does the same for the shim and
 * the fgpu command. */

struct symbol_search {
    const char *library;
    const char *name;
    void *found;
};

/* Whether `path`'s last component is `name`. */
static int file_name_is(const char *path, const char *name) {
    const char *last = path;
    for (const char *p = path; *p != '\0'; p++)
        if (*p == '/') last = p + 1;
    return same(last, name);
}

/* Whether symbol `index` of the table is the function sought (of its default version when
 * `default_only`). */
static int symbol_matches(const ElfW(Sym) *symtab, const char *strtab, const ElfW(Half) *versym, uint32_t index, const char *name, int default_only) {
    const ElfW(Sym) *sym = &symtab[index];
    if (sym->st_shndx == SHN_UNDEF || ELF64_ST_TYPE(sym->st_info) != STT_FUNC || sym->st_value == 0) return 0;
    if (default_only && versym != NULL && (versym[index] & 0x8000) != 0) return 0;
    return same(strtab + sym->st_name, name);
}

/* dl_iterate_phdr callback: `name` in the first loaded object called `library`. */
static int search_object(struct dl_phdr_info *info, size_t size, void *data) {
    struct symbol_search *search = data;
    const ElfW(Dyn) *dyn = NULL;
    const char *strtab = NULL;
    const ElfW(Sym) *symtab = NULL;
    const uint32_t *gnu = NULL, *sysv = NULL;
    const ElfW(Half) *versym = NULL;
    uintptr_t base = (uintptr_t)info->dlpi_addr;
    (void)size;
    if (info->dlpi_name == NULL || !file_name_is(info->dlpi_name, search->library)) return 0;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC) dyn = (const ElfW(Dyn) *)(base + info->dlpi_phdr[i].p_vaddr);
    if (dyn == NULL) return 1;
    for (; dyn->d_tag != DT_NULL; dyn++) {
        /* The loader relocates these addresses in place on x86_64 and aarch64; one left as
         * on disk is below the load address. */
        uintptr_t at = (uintptr_t)dyn->d_un.d_ptr;
        if (at < base) at += base;
        switch (dyn->d_tag) {
        case DT_STRTAB: strtab = (const char *)at; break;
        case DT_SYMTAB: symtab = (const ElfW(Sym) *)at; break;
        case DT_GNU_HASH: gnu = (const uint32_t *)at; break;
        case DT_HASH: sysv = (const uint32_t *)at; break;
        case DT_VERSYM: versym = (const ElfW(Half) *)at; break;
        default: break;
        }
    }
    if (strtab == NULL || symtab == NULL) return 1;
    for (int default_only = 1; default_only >= 0; default_only--) {
        if (gnu != NULL) {
            /* DT_GNU_HASH: buckets, first symbol, bloom words (ElfW(Addr) each), shift; the
             * bloom filter, the buckets, then one chain word per symbol from the first on;
             * a chain ends at a word with bit 0 set. */
            uint32_t hash = 5381, buckets = gnu[0], first = gnu[1];
            for (const char *c = search->name; *c != '\0'; c++) hash = hash * 33 + (unsigned char)*c;
            const uint32_t *bucket = gnu + 4 + gnu[2] * (sizeof(ElfW(Addr)) / 4);
            const uint32_t *chain = bucket + buckets;
            uint32_t index = buckets != 0 ? bucket[hash % buckets] : 0;
            for (; buckets != 0 && index >= first; index++) {
                uint32_t word = chain[index - first];
                if ((word | 1) == (hash | 1) && symbol_matches(symtab, strtab, versym, index, search->name, default_only)) {
                    search->found = (void *)(base + symtab[index].st_value);
                    return 1;
                }
                if (word & 1) break;
            }
        } else if (sysv != NULL) {
            /* DT_HASH: nbucket, nchain, the buckets, then one chain word per symbol. */
            uint32_t hash = 0, buckets = sysv[0], chains = sysv[1], steps = 0;
            for (const char *c = search->name; *c != '\0'; c++) {
                hash = (hash << 4) + (unsigned char)*c;
                uint32_t high = hash & 0xf0000000u;
                hash = (hash ^ (high >> 24)) & ~high;
            }
            uint32_t index = buckets != 0 ? sysv[2 + hash % buckets] : 0;
            for (; index != 0 && index < chains && steps <= chains; index = sysv[2 + buckets + index], steps++) {
                if (symbol_matches(symtab, strtab, versym, index, search->name, default_only)) {
                    search->found = (void *)(base + symtab[index].st_value);
                    return 1;
                }
            }
        }
    }
    return 1;
}

/* glibc's own `name`, or NULL. */
static void *glibc_symbol(const char *name) {
    struct symbol_search search;
    search.name = name;
    search.found = NULL;
    search.library = "libc.so.6";
    dl_iterate_phdr(search_object, &search);
    if (search.found != NULL) return search.found;
    search.library = "libdl.so.2";
    dl_iterate_phdr(search_object, &search);
    return search.found;
}

static dlsym_fn real_dlsym_cache;
static dlvsym_fn real_dlvsym_cache;

HIDDEN dlsym_fn real_dlsym(void) {
    dlsym_fn f = __atomic_load_n(&real_dlsym_cache, __ATOMIC_ACQUIRE);
    if (f != NULL) return f;
    f = (dlsym_fn)glibc_symbol("dlsym");
    if (f != NULL) __atomic_store_n(&real_dlsym_cache, f, __ATOMIC_RELEASE);
    return f;
}

HIDDEN dlvsym_fn real_dlvsym(void) {
    dlvsym_fn f = __atomic_load_n(&real_dlvsym_cache, __ATOMIC_ACQUIRE);
    if (f != NULL) return f;
    f = (dlvsym_fn)glibc_symbol("dlvsym");
    if (f != NULL) __atomic_store_n(&real_dlvsym_cache, f, __ATOMIC_RELEASE);
    return f;
}
