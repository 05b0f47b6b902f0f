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
