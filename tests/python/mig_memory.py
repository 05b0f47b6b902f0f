"""pynvml's view of GPU 0 and its MIG devices, for fgpu's MIG tests (run under the shim):
one JSON array, the GPU first, then each MIG device by index, each with its UUID, its GPU
and compute instance IDs (MIG devices), its memory as nvmlDeviceGetMemoryInfo (v1: total,
used, free) and _v2 (total, reserved, used, free) give it, and its compute processes
(pid, used memory, GPU instance, compute instance)."""
import json

import pynvml as nv

nv.nvmlInit()
gpu = nv.nvmlDeviceGetHandleByIndex(0)


def view(handle, mig):
    v1 = nv.nvmlDeviceGetMemoryInfo(handle)
    v2 = nv.nvmlDeviceGetMemoryInfo(handle, nv.nvmlMemory_v2)
    procs = [[p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId] for p in nv.nvmlDeviceGetComputeRunningProcesses(handle)]
    out = dict(uuid=nv.nvmlDeviceGetUUID(handle), v1=[v1.total, v1.used, v1.free], v2=[v2.total, v2.reserved, v2.used, v2.free], procs=procs)
    if mig:
        out.update(gi=nv.nvmlDeviceGetGpuInstanceId(handle), ci=nv.nvmlDeviceGetComputeInstanceId(handle))
    return out


devices = [view(gpu, False)]
for index in range(nv.nvmlDeviceGetMaxMigDeviceCount(gpu)):
    try:
        mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(gpu, index)
    except nv.NVMLError:
        continue
    devices.append(view(mig, True))
print(json.dumps(devices))
