"""Fake pynvml (self-test only): what gpulib.Monitor calls."""
import fakegpu as m


class _Mem:
    def __init__(self, total, used):
        self.total, self.used, self.free = total, used, total - used


class _Proc:
    def __init__(self, pid, used):
        self.pid, self.usedGpuMemory = pid, used


def nvmlInit():
    pass


def nvmlDeviceGetHandleByIndex(i):
    return i


def nvmlDeviceGetMemoryInfo(h):
    return _Mem(m.CARD, m.device_used())


def nvmlDeviceGetComputeRunningProcesses(h):
    return [_Proc(int(pid) + m.pid_offset(), p["used"]) for pid, p in m.procs().items()]


class NVMLError(Exception):
    pass


class _Sample:
    def __init__(self, pid, ts, sm):
        self.pid, self.timeStamp, self.smUtil, self.memUtil, self.encUtil, self.decUtil = pid, ts, sm, 0, 0, 0


def nvmlDeviceGetProcessUtilization(h, last_seen):
    samples = [_Sample(*x) for x in m.utilisation(last_seen)]
    if not samples:
        raise NVMLError("Not Found")
    return samples
