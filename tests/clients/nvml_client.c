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
 *   acctstats2 PID    nvmlDeviceGetAccountingStats_v2      "acctstats2 pid=PID rc=0 maxmem=... outpid=PID"
 *   detail MODE       nvmlDeviceGetRunningProcessDetailList, MODE 0 compute|1 graphics|2 MPS:
 *                     size query, then a buffer of the answered size
 *                                                          "detail 0 query_rc=7 query_count=1 rc=0 count=1 procs=PID:BYTES,..."
 *   detailsmall MODE N  the same with N entries and guard entries  "detailsmall 0 rc=7 count=1 overrun=0"
 *   putil             nvmlDeviceGetProcessesUtilizationInfo, size query then fetch (as util)
 *   enc, fbc          nvmlDeviceGetEncoderSessions / nvmlDeviceGetFBCSessions: size query
 *                     (count 0, NULL), then fetch       "enc query_rc=0 query_count=1 rc=0 count=1 pids=PID,..."
 *   encsmall N        encoder sessions with a buffer of N   "encsmall rc=7 count=1"
 *
 * The calls only newer drivers have (the last five groups) are looked up without failing when
 * the library lacks them; an operation on a missing one prints "OP missing".
 *   hold              print "holding", wait for EOF on stdin
 *
 * The fake library (FAKE_NVML) has one device, whose UUID is FGPU_FAKE_NVML_GPU_UUID (the
 * tests give the simulated GPU 0's, the GPU CUDA reports: each simulator state has UUIDs of
 * its own), and reports
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

typedef struct {
    unsigned pid, isRunning, gpuUtilization, memoryUtilization; unsigned long long maxMemoryUsage;
    unsigned sampleCount; unsigned long long sumGpuUtil, sumFbUtil, time, startTime;
} nvmlAccountingStats_v2_t;
typedef struct {
    unsigned pid; unsigned long long usedGpuMemory; unsigned gpuInstanceId, computeInstanceId;
    unsigned long long usedGpuCcProtectedMemory;
} nvmlProcessDetail_v1_t;
typedef struct { unsigned version, mode, numProcArrayEntries; nvmlProcessDetail_v1_t *procArray; } nvmlProcessDetailList_v1_t;
typedef struct {
    unsigned long long timeStamp; unsigned pid, smUtil, memUtil, encUtil, decUtil, jpgUtil, ofaUtil;
} nvmlProcessUtilizationInfo_v1_t;
typedef struct {
    unsigned version, processSamplesCount; unsigned long long lastSeenTimeStamp;
    nvmlProcessUtilizationInfo_v1_t *procUtilArray;
} nvmlProcessesUtilizationInfo_v1_t;
typedef struct {
    unsigned sessionId, pid, vgpuInstance, codecType, hResolution, vResolution, averageFps, averageLatency;
} nvmlEncoderSessionInfo_t;
typedef struct {
    unsigned sessionId, pid, vgpuInstance, displayOrdinal, sessionType, sessionFlags;
    unsigned hMaxResolution, vMaxResolution, hResolution, vResolution, averageFPS, averageLatency;
} nvmlFBCSessionInfo_t;

_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t");
_Static_assert(sizeof(nvmlAccountingStats_v2_t) == 64, "nvmlAccountingStats_v2_t");
_Static_assert(sizeof(nvmlProcessDetail_v1_t) == 32, "nvmlProcessDetail_v1_t");
_Static_assert(sizeof(nvmlProcessDetailList_v1_t) == 24, "nvmlProcessDetailList_v1_t");
_Static_assert(sizeof(nvmlProcessUtilizationInfo_v1_t) == 40, "nvmlProcessUtilizationInfo_v1_t");
_Static_assert(sizeof(nvmlProcessesUtilizationInfo_v1_t) == 24, "nvmlProcessesUtilizationInfo_v1_t");
_Static_assert(sizeof(nvmlEncoderSessionInfo_t) == 32, "nvmlEncoderSessionInfo_t");
_Static_assert(sizeof(nvmlFBCSessionInfo_t) == 48, "nvmlFBCSessionInfo_t");
_Static_assert(sizeof(nvmlProcessInfo_v1_t) == 16, "nvmlProcessInfo_v1_t");
_Static_assert(sizeof(nvmlProcessInfo_v2_t) == 24, "nvmlProcessInfo_v2_t");
_Static_assert(sizeof(nvmlProcessUtilizationSample_t) == 32, "nvmlProcessUtilizationSample_t");

#define NVML_SUCCESS 0
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_MEMORY_V2 ((unsigned)(sizeof(nvmlMemory_v2_t) | (2u << 24)))
#define NO_INSTANCE 0xFFFFFFFFu
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define PROCESS_DETAIL_LIST_V1 ((unsigned)(sizeof(nvmlProcessDetailList_v1_t) | (1u << 24)))
#define PROCESSES_UTILIZATION_INFO_V1 ((unsigned)(sizeof(nvmlProcessesUtilizationInfo_v1_t) | (1u << 24)))

#ifdef FAKE_NVML
/* ------------------------------------------------------------------------------------ */
/* The stand-in libnvidia-ml.so.1.                                                       */

#define FAKE_HANDLE ((nvmlDevice_t)(uintptr_t)0x4e564d4c)
#define FAKE_UUID "GPU-00000000-0000-0000-0000-000000000000" /* without FGPU_FAKE_NVML_GPU_UUID */
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
static const char *fake_gpu_uuid(void) {
    const char *u = getenv("FGPU_FAKE_NVML_GPU_UUID");
    return u && *u ? u : FAKE_UUID;
}
/* FGPU_FAKE_NVML_UUID makes the one handle a MIG device handle ("MIG-..."): on a MIG
 * instance CUDA reports that instance's UUID, the one its NVML handle has. */
static const char *fake_uuid(void) {
    const char *u = getenv("FGPU_FAKE_NVML_UUID");
    return u && *u ? u : fake_gpu_uuid();
}
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *h) {
    if (strcmp(uuid, fake_uuid()) && strcmp(uuid, fake_gpu_uuid())) return NVML_ERROR_NOT_FOUND;
    *h = FAKE_HANDLE; return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t h, char *buf, unsigned len) {
    const char *u = fake_uuid();
    if (h != FAKE_HANDLE || len < strlen(u) + 1) return NVML_ERROR_INVALID_ARGUMENT;
    memcpy(buf, u, strlen(u) + 1); return NVML_SUCCESS;
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
nvmlReturn_t nvmlDeviceGetAccountingStats_v2(nvmlDevice_t h, nvmlAccountingStats_v2_t *stats) {
    if (h != FAKE_HANDLE || !stats) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned pids[64]; unsigned long long bytes[64]; int n = fake_procs(pids, bytes, 64);
    for (int k = 0; k < n; k++) {
        if (pids[k] == stats->pid) {
            unsigned pid = stats->pid;
            memset(stats, 0, sizeof *stats);
            stats->pid = pid; stats->maxMemoryUsage = bytes[k]; stats->isRunning = 1; return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}
nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t h, nvmlProcessDetailList_v1_t *list) {
    if (h != FAKE_HANDLE || !list || list->mode > 2) return NVML_ERROR_INVALID_ARGUMENT;
    if (list->version != PROCESS_DETAIL_LIST_V1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned pids[64]; unsigned long long bytes[64]; int n = fake_procs(pids, bytes, 64);
    unsigned cap = list->numProcArrayEntries; list->numProcArrayEntries = n;
    if (n == 0) return NVML_SUCCESS;
    if (!list->procArray || cap < (unsigned)n) return NVML_ERROR_INSUFFICIENT_SIZE;
    for (int k = 0; k < n; k++) {
        nvmlProcessDetail_v1_t *e = &list->procArray[k];
        e->pid = pids[k]; e->usedGpuMemory = bytes[k]; e->gpuInstanceId = NO_INSTANCE; e->computeInstanceId = NO_INSTANCE;
        e->usedGpuCcProtectedMemory = 0;
    }
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t h, nvmlProcessesUtilizationInfo_v1_t *info) {
    if (h != FAKE_HANDLE || !info) return NVML_ERROR_INVALID_ARGUMENT;
    if (info->version != PROCESSES_UTILIZATION_INFO_V1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned pids[64]; unsigned long long bytes[64]; int n = fake_procs(pids, bytes, 64);
    if (n == 0) { info->processSamplesCount = 0; return NVML_ERROR_NOT_FOUND; }
    unsigned cap = info->processSamplesCount; info->processSamplesCount = n;
    if (!info->procUtilArray || cap < (unsigned)n) return NVML_ERROR_INSUFFICIENT_SIZE;
    for (int k = 0; k < n; k++) {
        nvmlProcessUtilizationInfo_v1_t *s = &info->procUtilArray[k];
        memset(s, 0, sizeof *s);
        s->pid = pids[k]; s->timeStamp = info->lastSeenTimeStamp + 1 + k; s->smUtil = 10 + k; s->memUtil = 20 + k;
    }
    return NVML_SUCCESS;
}
/* Session lists: a count of 0 is a size query answered NVML_SUCCESS. */
#define FAKE_SESSIONS(name, type) \
    nvmlReturn_t name(nvmlDevice_t h, unsigned *count, type *infos) { \
        if (h != FAKE_HANDLE || !count) return NVML_ERROR_INVALID_ARGUMENT; \
        unsigned pids[64]; unsigned long long bytes[64]; int n = fake_procs(pids, bytes, 64); \
        unsigned cap = *count; *count = n; \
        if (n == 0 || cap == 0) return NVML_SUCCESS; \
        if (!infos) return NVML_ERROR_INVALID_ARGUMENT; \
        if (cap < (unsigned)n) return NVML_ERROR_INSUFFICIENT_SIZE; \
        for (int k = 0; k < n; k++) { memset(&infos[k], 0, sizeof infos[k]); infos[k].sessionId = 100 + k; infos[k].pid = pids[k]; } \
        return NVML_SUCCESS; \
    }
FAKE_SESSIONS(nvmlDeviceGetEncoderSessions, nvmlEncoderSessionInfo_t)
FAKE_SESSIONS(nvmlDeviceGetFBCSessions, nvmlFBCSessionInfo_t)

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

/* Newer calls, which the simulator does not have: looked up through dlsym in both variants,
 * and allowed to be missing. */
#define OPT_FNS(X) \
    X(nvmlDeviceGetAccountingStats_v2, nvmlReturn_t, (nvmlDevice_t, nvmlAccountingStats_v2_t *)) \
    X(nvmlDeviceGetRunningProcessDetailList, nvmlReturn_t, (nvmlDevice_t, nvmlProcessDetailList_v1_t *)) \
    X(nvmlDeviceGetProcessesUtilizationInfo, nvmlReturn_t, (nvmlDevice_t, nvmlProcessesUtilizationInfo_v1_t *)) \
    X(nvmlDeviceGetEncoderSessions, nvmlReturn_t, (nvmlDevice_t, unsigned *, nvmlEncoderSessionInfo_t *)) \
    X(nvmlDeviceGetFBCSessions, nvmlReturn_t, (nvmlDevice_t, unsigned *, nvmlFBCSessionInfo_t *))
#define OPT_DECL(name, ret, args) static ret(*o_##name) args;
OPT_FNS(OPT_DECL)
#define OPT(f) o_##f

static int resolve(void) {
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) { printf("dlopen failed: %s\n", dlerror()); return 1; }
#ifndef LINKED
#define RESOLVE(name, ret, args) \
    p_##name = (ret(*) args)dlsym(lib, #name); \
    if (!p_##name) { printf("dlsym %s failed\n", #name); return 1; }
    FNS(RESOLVE)
#endif
#define OPT_RESOLVE(name, ret, args) o_##name = (ret(*) args)dlsym(lib, #name);
    OPT_FNS(OPT_RESOLVE)
    return 0;
}

#define NEED(op, f) if (!OPT(f)) { printf("%s missing\n", op); continue; }

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
        else if (!strcmp(op, "acctstats2")) {
            unsigned pid = (unsigned)atoi(argv[++i]);
            NEED(op, nvmlDeviceGetAccountingStats_v2)
            nvmlAccountingStats_v2_t st; memset(&st, 0, sizeof st); st.pid = pid;
            rc = OPT(nvmlDeviceGetAccountingStats_v2)(dev, &st);
            printf("acctstats2 pid=%u rc=%d maxmem=%llu outpid=%u\n", pid, rc, st.maxMemoryUsage, st.pid);
        }
        else if (!strcmp(op, "detail") || !strcmp(op, "detailsmall")) {
            int small = !strcmp(op, "detailsmall");
            unsigned mode = (unsigned)atoi(argv[++i]), cap = small ? (unsigned)atoi(argv[++i]) : 0;
            NEED(op, nvmlDeviceGetRunningProcessDetailList)
            nvmlProcessDetailList_v1_t list; memset(&list, 0, sizeof list);
            list.version = PROCESS_DETAIL_LIST_V1; list.mode = mode;
            if (small) {
                size_t guard = 4;
                nvmlProcessDetail_v1_t *buf = malloc((cap + guard) * sizeof *buf);
                memset(buf, 0xA5, (cap + guard) * sizeof *buf);
                list.numProcArrayEntries = cap; list.procArray = cap ? buf : NULL;
                rc = OPT(nvmlDeviceGetRunningProcessDetailList)(dev, &list);
                int overrun = 0;
                for (const unsigned char *b = (const unsigned char *)(buf + cap); b < (const unsigned char *)(buf + cap + guard); b++) if (*b != 0xA5) overrun = 1;
                printf("detailsmall %u rc=%d count=%u overrun=%d\n", mode, rc, list.numProcArrayEntries, overrun);
                free(buf);
                continue;
            }
            nvmlReturn_t qrc = OPT(nvmlDeviceGetRunningProcessDetailList)(dev, &list);
            unsigned qn = list.numProcArrayEntries, n = qn + 4;
            nvmlProcessDetail_v1_t *buf = calloc(n, sizeof *buf);
            list.numProcArrayEntries = n; list.procArray = buf;
            rc = OPT(nvmlDeviceGetRunningProcessDetailList)(dev, &list);
            printf("detail %u query_rc=%d query_count=%u rc=%d count=%u", mode, qrc, qn, rc, list.numProcArrayEntries);
            if (!rc) {
                printf(" procs=");
                for (unsigned k = 0; k < list.numProcArrayEntries; k++) printf("%s%u:%llu", k ? "," : "", buf[k].pid, buf[k].usedGpuMemory);
            }
            printf("\n");
            free(buf);
        }
        else if (!strcmp(op, "putil")) {
            NEED(op, nvmlDeviceGetProcessesUtilizationInfo)
            nvmlProcessesUtilizationInfo_v1_t info; memset(&info, 0, sizeof info);
            info.version = PROCESSES_UTILIZATION_INFO_V1;
            nvmlReturn_t qrc = OPT(nvmlDeviceGetProcessesUtilizationInfo)(dev, &info);
            unsigned qn = info.processSamplesCount;
            nvmlProcessUtilizationInfo_v1_t *s = calloc(qn + 1, sizeof *s);
            info.processSamplesCount = qn; info.procUtilArray = s;
            rc = OPT(nvmlDeviceGetProcessesUtilizationInfo)(dev, &info);
            printf("putil query_rc=%d query_count=%u rc=%d count=%u pids=", qrc, qn, rc, info.processSamplesCount);
            for (unsigned k = 0; !rc && k < info.processSamplesCount; k++) printf("%s%u", k ? "," : "", s[k].pid);
            printf("\n");
            free(s);
        }
        else if (!strcmp(op, "enc") || !strcmp(op, "fbc")) {
            int enc = !strcmp(op, "enc");
            if (enc) { NEED(op, nvmlDeviceGetEncoderSessions) } else { NEED(op, nvmlDeviceGetFBCSessions) }
            unsigned qn = 0;
            nvmlReturn_t qrc = enc ? OPT(nvmlDeviceGetEncoderSessions)(dev, &qn, NULL) : OPT(nvmlDeviceGetFBCSessions)(dev, &qn, NULL);
            unsigned n = qn;
            nvmlEncoderSessionInfo_t *es = calloc(n + 1, sizeof *es);
            nvmlFBCSessionInfo_t *fs = calloc(n + 1, sizeof *fs);
            rc = enc ? OPT(nvmlDeviceGetEncoderSessions)(dev, &n, es) : OPT(nvmlDeviceGetFBCSessions)(dev, &n, fs);
            printf("%s query_rc=%d query_count=%u rc=%d count=%u pids=", op, qrc, qn, rc, n);
            for (unsigned k = 0; !rc && k < n; k++) printf("%s%u", k ? "," : "", enc ? es[k].pid : fs[k].pid);
            printf("\n");
            free(es); free(fs);
        }
        else if (!strcmp(op, "encsmall")) {
            unsigned cap = (unsigned)atoi(argv[++i]), n = cap;
            NEED(op, nvmlDeviceGetEncoderSessions)
            nvmlEncoderSessionInfo_t *es = calloc(cap + 1, sizeof *es);
            rc = OPT(nvmlDeviceGetEncoderSessions)(dev, &n, es);
            printf("encsmall rc=%d count=%u\n", rc, n);
            free(es);
        }
        else if (!strcmp(op, "hold")) { printf("holding\n"); fflush(stdout); char c; while (read(0, &c, 1) > 0) {} }
        else { printf("unknown op %s\n", op); return 2; }
    }
    CALL(nvmlShutdown)();
    return 0;
}
#endif
