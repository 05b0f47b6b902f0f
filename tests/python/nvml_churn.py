"""pynvml's list calls, over and over, on GPU 0 while processes come and go: prints one
JSON line with, per call, how many times it answered, how many times it raised which
error, and what it saw (the PIDs of its entries, how many sample timestamps).

Arguments: SECONDS. Every call here is pynvml's own two-call pattern (a size query with a
NULL buffer, an allocation, the fetch), except the accounting PIDs (pynvml sizes them by
nvmlDeviceGetAccountingBufferSize). NVML_ERROR_NOT_FOUND (no sample newer than the
timestamp asked) is an answer, counted apart; every other error is a failure of the pattern.
"""
import json
import sys
import time

import pynvml as nv

seconds = float(sys.argv[1])
nv.nvmlInit()
h = nv.nvmlDeviceGetHandleByIndex(0)
last_seen = 0
calls = {
    "process_utilization_all": lambda: nv.nvmlDeviceGetProcessUtilization(h, 0),
    "process_utilization_since": lambda: nv.nvmlDeviceGetProcessUtilization(h, last_seen),
    "processes_utilization_info": lambda: nv.nvmlDeviceGetProcessesUtilizationInfo(h, 0),
    "compute_processes": lambda: nv.nvmlDeviceGetComputeRunningProcesses(h),
    "graphics_processes": lambda: nv.nvmlDeviceGetGraphicsRunningProcesses(h),
    "mps_processes": lambda: nv.nvmlDeviceGetMPSComputeRunningProcesses(h),
    "accounting_pids": lambda: nv.nvmlDeviceGetAccountingPids(h),
    "encoder_sessions": lambda: nv.nvmlDeviceGetEncoderSessions(h),
    "fbc_sessions": lambda: nv.nvmlDeviceGetFBCSessions(h),
}
report = {name: {"ok": 0, "not_found": 0, "errors": {}, "pids": set(), "stamps": set()} for name in calls}
end = time.monotonic() + seconds
while time.monotonic() < end:
    for name, call in calls.items():
        r = report[name]
        try:
            entries = call()
        except nv.NVMLError_NotFound:
            r["not_found"] += 1
            continue
        except nv.NVMLError as e:
            r["errors"][str(e)] = r["errors"].get(str(e), 0) + 1
            continue
        r["ok"] += 1
        for e in entries:
            pid = e if isinstance(e, int) else e.pid
            r["pids"].add(pid)
            if hasattr(e, "timeStamp"):
                r["stamps"].add(e.timeStamp)
                if name == "process_utilization_all":
                    last_seen = max(last_seen, e.timeStamp - 1)
for r in report.values():
    r["pids"] = sorted(r["pids"])
    r["stamps"] = len(r["stamps"])
print(json.dumps(report))
