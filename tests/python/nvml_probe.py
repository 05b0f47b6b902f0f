"""What pynvml (nvidia-ml-py, NVML through ctypes) reports, as one JSON object on stdout.

Every NVML call that reveals memory or processes, in every layout pynvml offers, plus the
raw size-query calls (count 0 with a NULL array, and a buffer one entry too small) made
through the same ctypes function pointers pynvml uses. Used by tests/integration/nvml.rs.

    python nvml_probe.py            all devices
"""

import ctypes
import json
import os
import sys

import pynvml as nv


class ProcessInfoV1(ctypes.Structure):
    """nvmlProcessInfo_v1_t (16 bytes); pynvml only ships the 24-byte v2/v3 layout."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


assert ctypes.sizeof(ProcessInfoV1) == 16
assert ctypes.sizeof(nv.c_nvmlProcessInfo_v2_t) == 24

LISTS = {
    "compute": "nvmlDeviceGetComputeRunningProcesses",
    "graphics": "nvmlDeviceGetGraphicsRunningProcesses",
    "mps": "nvmlDeviceGetMPSComputeRunningProcesses",
}
LAYOUT = {"v1": ("", ProcessInfoV1), "v2": ("_v2", nv.c_nvmlProcessInfo_v2_t), "v3": ("_v3", nv.c_nvmlProcessInfo_v2_t)}


def error_code(call):
    try:
        return {"value": call()}
    except nv.NVMLError as e:
        return {"error": e.value}


def entries(procs):
    return [[p.pid, p.usedGpuMemory] for p in procs]


def raw_list(handle, base, version):
    """The list by hand: size query with NULL, then a buffer one entry short, then the fetch."""
    suffix, struct = LAYOUT[version]
    fn = nv._nvmlGetFunctionPointer(base + suffix)
    count = ctypes.c_uint(0)
    rc_null = fn(handle, ctypes.byref(count), None)
    needed = count.value
    out = {"null_rc": rc_null, "null_count": needed}
    if needed >= 1:
        short = (struct * (needed - 1 + 1))()  # room for needed-1 entries (never 0-sized)
        count = ctypes.c_uint(needed - 1)
        out["short_rc"] = fn(handle, ctypes.byref(count), short)
        out["short_count"] = count.value
    buf = (struct * (needed + 4))()
    count = ctypes.c_uint(needed + 4)
    out["rc"] = fn(handle, ctypes.byref(count), buf)
    out["procs"] = [[buf[i].pid, buf[i].usedGpuMemory] for i in range(count.value)] if out["rc"] == 0 else []
    if version != "v1":
        out["instances_ok"] = all(
            buf[i].gpuInstanceId == 0xFFFFFFFF and buf[i].computeInstanceId == 0xFFFFFFFF for i in range(count.value)
        )
    return out


def device(index):
    h = nv.nvmlDeviceGetHandleByIndex(index)
    m1 = nv.nvmlDeviceGetMemoryInfo(h)
    m2 = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
    dev = {
        "index": index,
        "uuid": nv.nvmlDeviceGetUUID(h),
        "mem_v1": {"total": m1.total, "free": m1.free, "used": m1.used},
        "mem_v2": {"version": m2.version, "total": m2.total, "reserved": m2.reserved, "free": m2.free, "used": m2.used},
        # pynvml's own calls (what gpustat, nvitop and frameworks use)
        "pynvml": {
            "compute": entries(nv.nvmlDeviceGetComputeRunningProcesses(h)),
            "compute_v2": entries(nv.nvmlDeviceGetComputeRunningProcesses_v2(h)),
            "compute_v3": entries(nv.nvmlDeviceGetComputeRunningProcesses_v3(h)),
            "graphics": entries(nv.nvmlDeviceGetGraphicsRunningProcesses(h)),
            "graphics_v2": entries(nv.nvmlDeviceGetGraphicsRunningProcesses_v2(h)),
            "mps": entries(nv.nvmlDeviceGetMPSComputeRunningProcesses(h)),
            "mps_v2": entries(nv.nvmlDeviceGetMPSComputeRunningProcesses_v2(h)),
        },
        "raw": {kind: {v: raw_list(h, base, v) for v in LAYOUT} for kind, base in LISTS.items()},
        "utilization": error_code(lambda: [s.pid for s in nv.nvmlDeviceGetProcessUtilization(h, 0)]),
        "accounting_pids": error_code(lambda: list(nv.nvmlDeviceGetAccountingPids(h))),
    }
    return dev


def main():
    nv.nvmlInit()
    n = nv.nvmlDeviceGetCount()
    json.dump({"pid": os.getpid(), "count": n, "devices": [device(i) for i in range(n)]}, sys.stdout)
    sys.stdout.write("\n")
    nv.nvmlShutdown()


if __name__ == "__main__":
    main()
