"""pynvml reading GPU 0's utilisation samples: prints one JSON line.

Arguments: FROM_US TO_US PERIODS. Reads nvmlDeviceGetProcessUtilization with
lastSeenTimeStamp = FROM_US and reports per pid the smUtil of its sample ("sm_mean") and
the sample's timestamp ("stamp_of"): NVML gives one sample per running process, its
utilisation over the sample periods since lastSeenTimeStamp, stamped with the end of the
newest. Run right after TO_US, that is the PERIODS periods of the window; a script started
late (a loaded host) gets a later stamp, so the caller compares over FROM_US..stamp
("late_by_us": how far the newest stamp is past TO_US). Also reports the timestamps seen,
what the r550 call nvmlDeviceGetProcessesUtilizationInfo gives for the same window, what a
size query with a NULL buffer and a short buffer answer, what a query after the newest
sample answers, and nvmlDeviceGetUtilizationRates.
"""
import ctypes
import json
import sys

import pynvml as nv

from_us, to_us, periods = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
nv.nvmlInit()
h = nv.nvmlDeviceGetHandleByIndex(0)
out = {}


def mean_by_pid(samples):
    means, stamps = {}, set()
    for s in samples:
        if from_us < s.timeStamp:
            means[str(s.pid)] = means.get(str(s.pid), 0) + s.smUtil
            stamps.add(s.timeStamp)
    return means, len(stamps)


# Both calls over the same periods: again if a period completed between them.
for _ in range(5):
    samples = nv.nvmlDeviceGetProcessUtilization(h, from_us)
    try:
        info = nv.nvmlDeviceGetProcessesUtilizationInfo(h, from_us)
    except nv.NVMLError as e:
        info, out["info_error"] = [], str(e)
        break
    if max((s.timeStamp for s in samples), default=0) == max((s.timeStamp for s in info), default=0):
        break
out["sm_mean"], out["stamps"] = mean_by_pid(samples)
out["stamp_of"] = {str(s.pid): s.timeStamp for s in samples if from_us < s.timeStamp}
out["late_by_us"] = max([s.timeStamp - to_us for s in samples], default=0)
out["samples_per_pid"] = max([sum(1 for t in samples if t.pid == s.pid) for s in samples], default=0)
out["periods"] = periods
out["timestamps_increase"] = all(a.timeStamp <= b.timeStamp for a, b in zip(samples, samples[1:]))
out["info_sm_mean"], _ = mean_by_pid(info)

# The raw C contract: NULL buffer and short buffer.
fn = nv._nvmlGetFunctionPointer("nvmlDeviceGetProcessUtilization")
count = ctypes.c_uint(0)
out["null_rc"] = fn(h, None, ctypes.byref(count), ctypes.c_ulonglong(from_us))
out["null_count"] = count.value
short = ctypes.c_uint(1)
buf = (nv.c_nvmlProcessUtilizationSample_t * 1)()
out["short_rc"] = fn(h, buf, ctypes.byref(short), ctypes.c_ulonglong(from_us))
out["short_count"] = short.value
newest = max((s.timeStamp for s in samples), default=0)
count = ctypes.c_uint(0)
out["after_newest_rc"] = fn(h, None, ctypes.byref(count), ctypes.c_ulonglong(newest + 10**9))
out["gpu_util"] = nv.nvmlDeviceGetUtilizationRates(h).gpu
print(json.dumps(out))
