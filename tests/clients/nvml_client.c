/*
 * nvml_client: a scriptable NVML client for fgpu's tests, and (built with -DFAKE_NVML
 * -shared) a tiny stand-in libnvidia-ml.so.1 for the calls the simulator cannot exercise.
 *
 * The client reaches NVML the two ways C programs do:
 *   default    dlopen("libnvidia-ml.so.1") + dlsym(handle, name)   (nvidia-smi, ctypes)
 *   LINKED     compiled with -DLINKED and linked with -lnvidia-ml: plain exported symbols
 *
 * It runs the operations given as arguments and prints one line per operation:
 *   device N          select device N                     "device rc=0"
 *   count             nvmlDeviceGetCount_v2                "count rc=0 n=1"
 *   mem               nvmlDeviceGetMemoryInfo (v1)         "mem rc=0 total=... free=... used=..."
 *   mem2              nvmlDeviceGetMemoryInfo_v2           "mem2 rc=0 version=... total=... reserved=... free=... used=..."
 *   mem2bad           _v2 with a wrong version field       "mem2bad rc=25"
 *   list KIND V       KIND compute|graphics|mps, V 1|2|3: size query (count 0, NULL), then a
 *                     buffer of the answered size          "list compute 3 query_rc=7 query_count=2 rc=0 count=2 procs=PID:BYTES,... instances=ok"
 *   small KIND V N    count N with a buffer of N entries (+ guard entries that must stay
 *                     untouched)                           "small compute 3 rc=7 count=2 overrun=0"
 *   util              nvmlDeviceGetProcessUtilization, size query then fetch
 *                                                          "util query_rc=7 query_count=1 rc=0 count=1 pids=PID,..."
 *   acctpids          nvmlDeviceGetAccountingPids, size query then fetch (same format)
 *   acctstats PID     nvmlDeviceGetAccountingStats         "acctstats pid=PID rc=0 maxmem=..."
 *   hold              print "holding", wait for EOF on stdin
 *
 * The fake library (FAKE_NVML) has one device, the simulator's GPU 0 by UUID, and reports
 * the processes listed in FGPU_FAKE_NVML_PROCS ("PID:BYTES,PID:BYTES") in every process
 * list, utilisation sample and accounting record: processes of any tenant, as a real
 * driver would.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned pid; unsigned long long usedGpuMemory; } nvmlProcessInfo_v1_t;
typedef struct { unsigned pid; unsigned long long usedGpuMemory; unsigned gpuInstanceId, computeInstanceId; } nvmlProcessInfo_v2_t;
typedef struct { unsigned pid; unsigned long long timeStamp; unsigned smUtil, memUtil, encUtil, decUtil; } nvmlProcessUtilizationSample_t;
typedef struct {
    unsigned gpuUtilization, memoryUtilization; unsigned long long maxMemoryUsage, time, startTime;
    unsigned isRunning, reserved[5];
} nvmlAccountingStats_t;

_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t");
_Static_assert(sizeof(nvmlProcessInfo_v1_t) == 16, "nvmlProcessInfo_v1_t");
_Static_assert(sizeof(nvmlProcessInfo_v2_t) == 24, "nvmlProcessInfo_v2_t");
_Static_assert(sizeof(nvmlProcessUtilizationSample_t) == 32, "nvmlProcessUtilizationSample_t");

#define NVML_SUCCESS 0
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_MEMORY_V2 ((unsigned)(sizeof(nvmlMemory_v2_t) | (2u << 24)))
#define NO_INSTANCE 0xFFFFFFFFu

#ifdef FAKE_NVML
/* ------------------------------------------------------------------------------------ */
/* The stand-in libnvidia-ml.so.1.                                                       */

#define FAKE_HANDLE ((nvmlDevice_t)(uintptr_t)0x4e564d4c)
#define FAKE_UUID "GPU-7f2f4a87-663d-b312-36f4-6ad9417f4505" /* the simulator's GPU 0 */
#define FAKE_TOTAL (80ULL << 30)

static int fake_procs(unsigned *pids, unsigned long long *bytes, int max) {
    const char *spec = getenv("FGPU_FAKE_NVML_PROCS");
    int n = 0;
    while (spec && *spec && n < max) {
        char *end;
        pids[n] = (unsigned)strtoul(spec, &end, 10);
        bytes[n] = *end == ':' ? strtoull(end + 1, &end, 10) : 0;
        n++;
        spec = *end == ',' ? end + 1 : end;
        if (*end != ',') break;
    }
    return n;
}

nvmlReturn_t nvmlInit(void) { return NVML_SUCCESS; }
nvmlReturn_t nvmlInit_v2(void) { return NVML_SUCCESS; }
nvmlReturn_t nvmlInitWithFlags(unsigned flags) { (void)flags; return NVML_SUCCESS; }
nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }
const char *nvmlErrorString(nvmlReturn_t rc) { (void)rc; return "fake NVML"; }
nvmlReturn_t nvmlDeviceGetCount(unsigned *n) { *n = 1; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *n) { *n = 1; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned i, nvmlDevice_t *h) { if (i) return NVML_ERROR_INVALID_ARGUMENT; *h = FAKE_HANDLE; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t *h) { return nvmlDeviceGetHandleByIndex(i, h); }
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *h) {
    if (strcmp(uuid, FAKE_UUID)) return NVML_ERROR_NOT_FOUND;
    *h = FAKE_HANDLE; return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t h, char *buf, unsigned len) {
    if (h != FAKE_HANDLE || len < sizeof FAKE_UUID) return NVML_ERROR_INVALID_ARGUMENT;
    memcpy(buf, FAKE_UUID, sizeof FAKE_UUID); return NVML_SUCCESS;
}
static unsigned long long fake_used(void) {
    unsigned pids[64]; unsigned long long bytes[64], used = 0;
    int n = fake_procs(pids, bytes, 64);
    for (int k = 0; k < n; k++) used += bytes[k];
    return used;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t h, nvmlMemory_t *m) {
    if (h != FAKE_HANDLE || !m) return NVML_ERROR_INVALID_ARGUMENT;
    m->total = FAKE_TOTAL; m->used = fake_used(); m->free = m->total - m->used; return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t h, nvmlMemory_v2_t *m) {
    if (h != FAKE_HANDLE || !m) return NVML_ERROR_INVALID_ARGUMENT;
    if (m->version != NVML_MEMORY_V2) return 25;
    m->total = FAKE_TOTAL; m->reserved = 0; m->used = fake_used(); m->free = m->total - m->used; return NVML_SUCCESS;
}

#define FAKE_LIST(name, type, fill_extra) \
    nvmlReturn_t name(nvmlDevice_t h, unsigned *count, type *infos) { \
        if (h != FAKE_HANDLE || !count) return NVML_ERROR_INVALID_ARGUMENT; \
        unsigned pids[64]; unsigned long long bytes[64]; int n = fake_procs(pids, bytes, 64); \
        unsigned cap = *count; *count = n; \
        if (n == 0) return NVML_SUCCESS; \
        if (!infos || cap < (unsigned)n) return NVML_ERROR_INSUFFICIENT_SIZE; \
        for (int k = 0; k < n; k++) { memset(&infos[k], 0, sizeof infos[k]); infos[k].pid = pids[k]; infos[k].usedGpuMemory = bytes[k]; fill_extra; } \
        return NVML_SUCCESS; \
    }
#define V2_EXTRA infos[k].gpuInstanceId = NO_INSTANCE; infos[k].computeInstanceId = NO_INSTANCE
FAKE_LIST(nvmlDeviceGetComputeRunningProcesses, nvmlProcessInfo_v1_t, (void)0)
FAKE_LIST(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_v2_t, V2_EXTRA)
FAKE_LIST(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_v2_t, V2_EXTRA)
FAKE_LIST(nvmlDeviceGetGraphicsRunningProcesses, nvmlProcessInfo_v1_t, (void)0)
FAKE_LIST(nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlProcessInfo_v2_t, V2_EXTRA)
FAKE_LIST(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlProcessInfo_v2_t, V2_EXTRA)
FAKE_LIST(nvmlDeviceGetMPSComputeRunningProcesses, nvmlProcessInfo_v1_t, (void)0)
FAKE_LIST(nvmlDeviceGetMPSComputeRunningProcesses_v2, nvmlProcessInfo_v2_t, V2_EXTRA)
FAKE_LIST(nvmlDeviceGetMPSComputeRunningProcesses_v3, nvmlProcessInfo_v2_t, V2_EXTRA)

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t h, nvmlProcessUtilizationSample_t *samples, unsigned *count, unsigned long long last) {
    if (h != FAKE_HANDLE || !count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned pids[64]; unsigned long long bytes[64]; int n = fake_procs(pids, bytes, 64);
    if (n == 0) { *count = 0; return NVML_ERROR_NOT_FOUND; }
    unsigned cap = *count; *count = n;
    if (!samples || cap < (unsigned)n) return NVML_ERROR_INSUFFICIENT_SIZE;
    for (int k = 0; k < n; k++) {
        samples[k].pid = pids[k]; samples[k].timeStamp = last + 1 + k;
        samples[k].smUtil = 10 + k; samples[k].memUtil = 20 + k; samples[k].encUtil = 0; samples[k].decUtil = 0;
    }
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetAccountingPids(nvmlDevice_t h, unsigned *count, unsigned *out) {
    if (h != FAKE_HANDLE || !count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned pids[64]; unsigned long long bytes[64]; int n = fake_procs(pids, bytes, 64);
    unsigned cap = *count; *count = n;
    if (n == 0) return NVML_SUCCESS;
    if (!out || cap < (unsigned)n) return NVML_ERROR_INSUFFICIENT_SIZE;
    for (int k = 0; k < n; k++) out[k] = pids[k];
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetAccountingBufferSize(nvmlDevice_t h, unsigned *size) { (void)h; *size = 4000; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetAccountingStats(nvmlDevice_t h, unsigned pid, nvmlAccountingStats_t *stats) {
    if (h != FAKE_HANDLE || !stats) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned pids[64]; unsigned long long bytes[64]; int n = fake_procs(pids, bytes, 64);
    for (int k = 0; k < n; k++) {
        if (pids[k] == pid) {
            memset(stats, 0, sizeof *stats);
            stats->maxMemoryUsage = bytes[k]; stats->isRunning = 1; return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

#else
/* ------------------------------------------------------------------------------------ */
/* The client.                                                                           */

#define FNS(X) \
    X(nvmlInit_v2, nvmlReturn_t, (void)) \
    X(nvmlShutdown, nvmlReturn_t, (void)) \
    X(nvmlDeviceGetCount_v2, nvmlReturn_t, (unsigned *)) \
    X(nvmlDeviceGetHandleByIndex_v2, nvmlReturn_t, (unsigned, nvmlDevice_t *)) \
    X(nvmlDeviceGetMemoryInfo, nvmlReturn_t, (nvmlDevice_t, nvmlMemory_t *)) \
    X(nvmlDeviceGetMemoryInfo_v2, nvmlReturn_t, (nvmlDevice_t, nvmlMemory_v2_t *)) \
    X(nvmlDeviceGetComputeRunningProcesses, nvmlReturn_t, (nvmlDevice_t, unsigned *, nvmlProcessInfo_v1_t *)) \
    X(nvmlDeviceGetComputeRunningProcesses_v2, nvmlReturn_t, (nvmlDevice_t, unsigned *, nvmlProcessInfo_v2_t *)) \
    X(nvmlDeviceGetComputeRunningProcesses_v3, nvmlReturn_t, (nvmlDevice_t, unsigned *, nvmlProcessInfo_v2_t *)) \
    X(nvmlDeviceGetGraphicsRunningProcesses, nvmlReturn_t, (nvmlDevice_t, unsigned *, nvmlProcessInfo_v1_t *)) \
    X(nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlReturn_t, (nvmlDevice_t, unsigned *, nvmlProcessInfo_v2_t *)) \
    X(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlReturn_t, (nvmlDevice_t, unsigned *, nvmlProcessInfo_v2_t *)) \
    X(nvmlDeviceGetMPSComputeRunningProcesses, nvmlReturn_t, (nvmlDevice_t, unsigned *, nvmlProcessInfo_v1_t *)) \
    X(nvmlDeviceGetMPSComputeRunningProcesses_v2, nvmlReturn_t, (nvmlDevice_t, unsigned *, nvmlProcessInfo_v2_t *)) \
    X(nvmlDeviceGetMPSComputeRunningProcesses_v3, nvmlReturn_t, (nvmlDevice_t, unsigned *, nvmlProcessInfo_v2_t *)) \
    X(nvmlDeviceGetProcessUtilization, nvmlReturn_t, (nvmlDevice_t, nvmlProcessUtilizationSample_t *, unsigned *, unsigned long long)) \
    X(nvmlDeviceGetAccountingPids, nvmlReturn_t, (nvmlDevice_t, unsigned *, unsigned *)) \
    X(nvmlDeviceGetAccountingStats, nvmlReturn_t, (nvmlDevice_t, unsigned, nvmlAccountingStats_t *))

#ifdef LINKED
#define DECL(name, ret, args) extern ret name args;
FNS(DECL)
#define CALL(f) f
#else
#define DECL(name, ret, args) static ret(*p_##name) args;
FNS(DECL)
#define CALL(f) p_##f
#endif

static int resolve(void) {
#ifndef LINKED
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) { printf("dlopen failed: %s\n", dlerror()); return 1; }
#define RESOLVE(name, ret, args) \
    p_##name = (ret(*) args)dlsym(lib, #name); \
    if (!p_##name) { printf("dlsym %s failed\n", #name); return 1; }
    FNS(RESOLVE)
#endif
    return 0;
}

/* One process list call, whatever the kind and layout: a v1 entry is 16 bytes, v2/v3 24. */
typedef nvmlReturn_t (*list_fn)(nvmlDevice_t, unsigned *, void *);

static list_fn pick(const char *kind, int v) {
#define PICK(k, n1, n2, n3) \
    if (!strcmp(kind, k)) return v == 1 ? (list_fn)CALL(n1) : v == 2 ? (list_fn)CALL(n2) : (list_fn)CALL(n3);
    PICK("compute", nvmlDeviceGetComputeRunningProcesses, nvmlDeviceGetComputeRunningProcesses_v2, nvmlDeviceGetComputeRunningProcesses_v3)
    PICK("graphics", nvmlDeviceGetGraphicsRunningProcesses, nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlDeviceGetGraphicsRunningProcesses_v3)
    PICK("mps", nvmlDeviceGetMPSComputeRunningProcesses, nvmlDeviceGetMPSComputeRunningProcesses_v2, nvmlDeviceGetMPSComputeRunningProcesses_v3)
    return NULL;
}

static size_t entry_size(int v) { return v == 1 ? sizeof(nvmlProcessInfo_v1_t) : sizeof(nvmlProcessInfo_v2_t); }

static void print_entries(const unsigned char *buf, unsigned n, int v) {
    int instances_ok = 1;
    printf(" procs=");
    for (unsigned k = 0; k < n; k++) {
        if (v == 1) {
            const nvmlProcessInfo_v1_t *e = (const nvmlProcessInfo_v1_t *)buf + k;
            printf("%s%u:%llu", k ? "," : "", e->pid, e->usedGpuMemory);
        } else {
            const nvmlProcessInfo_v2_t *e = (const nvmlProcessInfo_v2_t *)buf + k;
            printf("%s%u:%llu", k ? "," : "", e->pid, e->usedGpuMemory);
            if (e->gpuInstanceId != NO_INSTANCE || e->computeInstanceId != NO_INSTANCE) instances_ok = 0;
        }
    }
    if (v != 1) printf(" instances=%s", instances_ok ? "ok" : "bad");
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (resolve()) return 2;
    nvmlReturn_t rc = CALL(nvmlInit_v2)();
    printf("nvmlinit rc=%d\n", rc);
    if (rc) return 1;
    nvmlDevice_t dev = NULL;
    rc = CALL(nvmlDeviceGetHandleByIndex_v2)(0, &dev);
    if (rc) { printf("handle rc=%d\n", rc); return 1; }
    for (int i = 1; i < argc; i++) {
        const char *op = argv[i];
        if (!strcmp(op, "device")) { rc = CALL(nvmlDeviceGetHandleByIndex_v2)(atoi(argv[++i]), &dev); printf("device rc=%d\n", rc); }
        else if (!strcmp(op, "count")) { unsigned n = 0; rc = CALL(nvmlDeviceGetCount_v2)(&n); printf("count rc=%d n=%u\n", rc, n); }
        else if (!strcmp(op, "mem")) {
            nvmlMemory_t m; memset(&m, 0, sizeof m);
            rc = CALL(nvmlDeviceGetMemoryInfo)(dev, &m);
            printf("mem rc=%d total=%llu free=%llu used=%llu\n", rc, m.total, m.free, m.used);
        }
        else if (!strcmp(op, "mem2") || !strcmp(op, "mem2bad")) {
            nvmlMemory_v2_t m; memset(&m, 0, sizeof m);
            m.version = strcmp(op, "mem2") ? 0x01000028u : NVML_MEMORY_V2;
            rc = CALL(nvmlDeviceGetMemoryInfo_v2)(dev, &m);
            if (!strcmp(op, "mem2")) printf("mem2 rc=%d version=%u total=%llu reserved=%llu free=%llu used=%llu\n", rc, m.version, m.total, m.reserved, m.free, m.used);
            else printf("mem2bad rc=%d\n", rc);
        }
        else if (!strcmp(op, "list")) {
            const char *kind = argv[++i]; int v = atoi(argv[++i]);
            list_fn f = pick(kind, v);
            if (!f) { printf("unknown list %s %d\n", kind, v); return 2; }
            unsigned qn = 0;
            nvmlReturn_t qrc = f(dev, &qn, NULL);
            unsigned n = qn + 4;
            unsigned char *buf = calloc(n, entry_size(v));
            rc = f(dev, &n, buf);
            printf("list %s %d query_rc=%d query_count=%u rc=%d count=%u", kind, v, qrc, qn, rc, n);
            if (!rc) print_entries(buf, n, v);
            printf("\n");
            free(buf);
        }
        else if (!strcmp(op, "small")) {
            const char *kind = argv[++i]; int v = atoi(argv[++i]); unsigned cap = atoi(argv[++i]);
            list_fn f = pick(kind, v);
            if (!f) { printf("unknown list %s %d\n", kind, v); return 2; }
            size_t es = entry_size(v), guard = 4 * es;
            unsigned char *buf = malloc(cap * es + guard);
            memset(buf, 0xA5, cap * es + guard);
            unsigned n = cap;
            rc = f(dev, &n, cap ? (void *)buf : NULL);
            int overrun = 0;
            for (size_t b = cap * es; b < cap * es + guard; b++) if (buf[b] != 0xA5) overrun = 1;
            printf("small %s %d rc=%d count=%u overrun=%d\n", kind, v, rc, n, overrun);
            free(buf);
        }
        else if (!strcmp(op, "util")) {
            unsigned qn = 0;
            nvmlReturn_t qrc = CALL(nvmlDeviceGetProcessUtilization)(dev, NULL, &qn, 0);
            unsigned n = qn;
            nvmlProcessUtilizationSample_t *s = calloc(n + 1, sizeof *s);
            rc = CALL(nvmlDeviceGetProcessUtilization)(dev, s, &n, 0);
            printf("util query_rc=%d query_count=%u rc=%d count=%u pids=", qrc, qn, rc, n);
            for (unsigned k = 0; !rc && k < n; k++) printf("%s%u", k ? "," : "", s[k].pid);
            printf("\n");
            free(s);
        }
        else if (!strcmp(op, "acctpids")) {
            unsigned qn = 0;
            nvmlReturn_t qrc = CALL(nvmlDeviceGetAccountingPids)(dev, &qn, NULL);
            unsigned n = qn;
            unsigned *p = calloc(n + 1, sizeof *p);
            rc = CALL(nvmlDeviceGetAccountingPids)(dev, &n, p);
            printf("acctpids query_rc=%d query_count=%u rc=%d count=%u pids=", qrc, qn, rc, n);
            for (unsigned k = 0; !rc && k < n; k++) printf("%s%u", k ? "," : "", p[k]);
            printf("\n");
            free(p);
        }
        else if (!strcmp(op, "acctstats")) {
            unsigned pid = (unsigned)atoi(argv[++i]);
            nvmlAccountingStats_t st; memset(&st, 0, sizeof st);
            rc = CALL(nvmlDeviceGetAccountingStats)(dev, pid, &st);
            printf("acctstats pid=%u rc=%d maxmem=%llu\n", pid, rc, st.maxMemoryUsage);
        }
        else if (!strcmp(op, "hold")) { printf("holding\n"); fflush(stdout); char c; while (read(0, &c, 1) > 0) {} }
        else { printf("unknown op %s\n", op); return 2; }
    }
    CALL(nvmlShutdown)();
    return 0;
}
#endif
