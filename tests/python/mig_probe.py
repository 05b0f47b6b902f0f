"""pynvml driving MIG on GPU 0: one JSON line per step, each with "op" and "rc" (0, or the
NVML error code the step raised).

Steps (arguments, in order):
  profiles              every GPU instance profile index: its info (v2: name, counts,
                        engines, memory), placements, remaining capacity; and for each
                        profile, the compute instance profiles of an instance of it (made
                        and destroyed for the purpose, where one fits)
  mode                  current and pending MIG mode
  setmode 0|1           nvmlDeviceSetMigMode: rc and the activation status
  create ID [START]     a GPU instance of profile ID (at START): its ID and placement
  ci GI PROFILE [START] a compute instance of PROFILE in GPU instance GI
  dci GI CI             destroys compute instance CI of GPU instance GI
  dgi GI                destroys GPU instance GI
  capacity ID           remaining capacity of GPU instance profile ID
  devices               the MIG device handles: index, UUID, name, GI and CI IDs, parent,
                        memory, attributes and their compute processes
  parent                GPU 0's utilisation, samples, accounting, memory and processes
  byuuid UUID           nvmlDeviceGetHandleByUUID: whether it is a MIG handle, and its IDs
"""
import json
import sys
from ctypes import byref, c_uint

import pynvml as nv

nv.nvmlInit()
h = nv.nvmlDeviceGetHandleByIndex(0)


def emit(op, **kv):
    print(json.dumps(dict(op=op, **kv), default=lambda v: v.value), flush=True)


def rc_of(f):
    try:
        return 0, f()
    except nv.NVMLError as e:
        return e.value, None


def gi_by_id(gi_id):
    return nv.nvmlDeviceGetGpuInstanceById(h, gi_id)


def text(b):
    return b.decode() if isinstance(b, bytes) else b


def gi_profiles():
    out = []
    for index in range(nv.NVML_GPU_INSTANCE_PROFILE_COUNT):
        rc, info = rc_of(lambda: nv.nvmlDeviceGetGpuInstanceProfileInfo(h, index))
        if rc:
            out.append(dict(index=index, rc=rc))
            continue
        count = c_uint(0)
        nv.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, None, byref(count))
        placements = (nv.c_nvmlGpuInstancePlacement_t * count.value)()
        nv.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, placements, byref(count))
        out.append(dict(index=index, rc=0, id=info.id, name=text(info.name), slices=info.sliceCount, count=info.instanceCount,
                        sms=info.multiprocessorCount, ce=info.copyEngineCount, dec=info.decoderCount, enc=info.encoderCount,
                        jpeg=info.jpegCount, ofa=info.ofaCount, memory_mib=info.memorySizeMB, p2p=info.isP2pSupported,
                        placements=[[p.start, p.size] for p in placements[:count.value]],
                        capacity=nv.nvmlDeviceGetGpuInstanceRemainingCapacity(h, info.id)))
    return out


def ci_profiles(gi):
    out = []
    for index in range(nv.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        rc, info = rc_of(lambda: nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, index, 0))
        if rc:
            continue
        count = c_uint(0)
        nv.nvmlGpuInstanceGetComputeInstancePossiblePlacements(gi, info.id, None, byref(count))
        placements = (nv.c_nvmlComputeInstancePlacement_t * count.value)()
        nv.nvmlGpuInstanceGetComputeInstancePossiblePlacements(gi, info.id, placements, byref(count))
        out.append(dict(index=index, id=info.id, name=text(info.name), slices=info.sliceCount, count=info.instanceCount,
                        sms=info.multiprocessorCount, ce=info.sharedCopyEngineCount, dec=info.sharedDecoderCount,
                        enc=info.sharedEncoderCount, jpeg=info.sharedJpegCount, ofa=info.sharedOfaCount,
                        placements=[[p.start, p.size] for p in placements[:count.value]]))
    return out


def processes(handle):
    rc, procs = rc_of(lambda: nv.nvmlDeviceGetComputeRunningProcesses(handle))
    return rc, [[p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId] for p in (procs or [])]


args = sys.argv[1:]
k = 0
while k < len(args):
    op = args[k]
    if op == "profiles":
        gis = gi_profiles()
        cis = {}
        for p in gis:
            if p["rc"]:
                continue
            rc, gi = rc_of(lambda: nv.nvmlDeviceCreateGpuInstance(h, p["id"]))
            if rc:
                cis[p["id"]] = dict(rc=rc)
                continue
            cis[p["id"]] = ci_profiles(gi)
            nv.nvmlGpuInstanceDestroy(gi)
        emit(op, rc=0, gi=gis, ci=cis)
    elif op == "mode":
        rc, m = rc_of(lambda: nv.nvmlDeviceGetMigMode(h))
        emit(op, rc=rc, mode=m, max_mig=nv.nvmlDeviceGetMaxMigDeviceCount(h))
    elif op == "setmode":
        k += 1
        rc, status = rc_of(lambda: nv.nvmlDeviceSetMigMode(h, int(args[k])))
        emit(op, rc=rc, activation=status)
    elif op == "create":
        pid = int(args[k + 1])
        start = int(args[k + 2]) if k + 2 < len(args) and args[k + 2].isdigit() else None
        k += 1 if start is None else 2
        if start is None:
            rc, gi = rc_of(lambda: nv.nvmlDeviceCreateGpuInstance(h, pid))
        else:
            p = nv.c_nvmlGpuInstancePlacement_t()
            p.start, p.size = start, 0
            size = [q["placements"][0][1] for q in gi_profiles() if q["rc"] == 0 and q["id"] == pid]
            p.size = size[0] if size else 1
            rc, gi = rc_of(lambda: nv.nvmlDeviceCreateGpuInstanceWithPlacement(h, pid, byref(p)))
        info = nv.nvmlGpuInstanceGetInfo(gi) if gi else None
        emit(op, rc=rc, gi=info.id if info else None, start=info.placement.start if info else None, size=info.placement.size if info else None)
    elif op == "ci":
        gi_id, prof = int(args[k + 1]), int(args[k + 2])
        start = int(args[k + 3]) if k + 3 < len(args) and args[k + 3].isdigit() else None
        k += 2 if start is None else 3
        rc, gi = rc_of(lambda: gi_by_id(gi_id))
        ci = None
        if not rc:
            if start is None:
                rc, ci = rc_of(lambda: nv.nvmlGpuInstanceCreateComputeInstance(gi, prof))
            else:
                p = nv.c_nvmlComputeInstancePlacement_t()
                p.start, p.size = start, 1
                fn = nv._nvmlGetFunctionPointer("nvmlGpuInstanceCreateComputeInstanceWithPlacement")
                handle = nv.c_nvmlComputeInstance_t()
                rc = fn(gi, c_uint(prof), byref(p), byref(handle))
                ci = handle if rc == 0 else None
        info = nv.nvmlComputeInstanceGetInfo(ci) if ci else None
        emit(op, rc=rc, ci=info.id if info else None, start=info.placement.start if info else None)
    elif op == "dci":
        gi_id, ci_id = int(args[k + 1]), int(args[k + 2])
        k += 2

        def destroy():
            return nv.nvmlComputeInstanceDestroy(nv.nvmlGpuInstanceGetComputeInstanceById(gi_by_id(gi_id), ci_id))
        rc, _ = rc_of(destroy)
        emit(op, rc=rc)
    elif op == "dgi":
        k += 1
        gi_id = int(args[k])
        rc, _ = rc_of(lambda: nv.nvmlGpuInstanceDestroy(gi_by_id(gi_id)))
        emit(op, rc=rc)
    elif op == "capacity":
        k += 1
        pid = int(args[k])
        rc, n = rc_of(lambda: nv.nvmlDeviceGetGpuInstanceRemainingCapacity(h, pid))
        emit(op, rc=rc, capacity=n)
    elif op == "devices":
        out = []
        for index in range(nv.nvmlDeviceGetMaxMigDeviceCount(h)):
            rc, m = rc_of(lambda: nv.nvmlDeviceGetMigDeviceHandleByIndex(h, index))
            if rc:
                continue
            mem = nv.nvmlDeviceGetMemoryInfo(m, nv.nvmlMemory_v2)
            a = nv.nvmlDeviceGetAttributes(m)
            prc, procs = processes(m)
            out.append(dict(index=nv.nvmlDeviceGetIndex(m), uuid=nv.nvmlDeviceGetUUID(m), name=nv.nvmlDeviceGetName(m),
                            is_mig=nv.nvmlDeviceIsMigDeviceHandle(m), gi=nv.nvmlDeviceGetGpuInstanceId(m),
                            ci=nv.nvmlDeviceGetComputeInstanceId(m),
                            parent_index=nv.nvmlDeviceGetIndex(nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)),
                            total=mem.total, used=mem.used, free=mem.free, sms=a.multiprocessorCount,
                            gi_slices=a.gpuInstanceSliceCount, ci_slices=a.computeInstanceSliceCount,
                            memory_mib=a.memorySizeMB, procs_rc=prc, procs=procs))
        emit(op, rc=0, devices=out)
    elif op == "parent":
        util_rc, _ = rc_of(lambda: nv.nvmlDeviceGetUtilizationRates(h))
        samples_rc, _ = rc_of(lambda: nv.nvmlDeviceGetProcessUtilization(h, 0))
        acct_rc, _ = rc_of(lambda: nv.nvmlDeviceGetAccountingPids(h))
        mem = nv.nvmlDeviceGetMemoryInfo(h, nv.nvmlMemory_v2)
        prc, procs = processes(h)
        emit(op, rc=0, utilization_rc=util_rc, samples_rc=samples_rc, accounting_rc=acct_rc,
             accounting_mode=nv.nvmlDeviceGetAccountingMode(h), total=mem.total, used=mem.used, procs_rc=prc, procs=procs)
    elif op == "byuuid":
        k += 1
        rc, m = rc_of(lambda: nv.nvmlDeviceGetHandleByUUID(args[k]))
        emit(op, rc=rc, is_mig=nv.nvmlDeviceIsMigDeviceHandle(m) if m else None,
             gi=nv.nvmlDeviceGetGpuInstanceId(m) if m and nv.nvmlDeviceIsMigDeviceHandle(m) else None)
    else:
        emit(op, rc=-1, error="unknown step")
        sys.exit(2)
    k += 1
