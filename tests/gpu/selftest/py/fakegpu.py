"""A fake GPU for the harness self-test (tests/gpu/selftest/README.md).

State: {pid: {"used": bytes, "ledger": FGPU_LEDGER or null, "share": percent or null,
"computing": since}} in a JSON file, locked with flock; entries of dead or zombie
processes are dropped on every access.

Compute: a process that runs kernels (`compute_start`) takes the fake GPU's time as a
well-behaved limiter would give it: a process under the shim with FGPU_COMPUTE gets its
share, the others split what is left. With FAKEGPU_NO_CAP=1 nobody is under the shim and
all split the GPU evenly."""

import fcntl
import json
import os
import re
import tempfile

MIB = 1 << 20
STATE = os.environ.get("FAKEGPU_STATE") or os.path.join(tempfile.gettempdir(), "fakegpu-state.json")
CARD = 143771 * MIB
IDLE = 512 * MIB
CTX = 500 * MIB


def _parse(cap):
    m = re.fullmatch(r"(\d+)([GM]?)(?:i?B)?", cap)
    return int(m.group(1)) * {"G": 1 << 30, "M": 1 << 20, "": 1}[m.group(2)]


def hooked():
    if os.environ.get("FAKEGPU_NO_CAP"):
        return False
    return bool(os.environ.get("LD_PRELOAD")) and bool(os.environ.get("FGPU_LIMIT"))


def cap():
    return _parse(os.environ["FGPU_LIMIT"]) if hooked() else None


def ledger():
    return os.environ.get("FGPU_LEDGER") if hooked() else None


def _alive(pid):
    try:
        os.kill(int(pid), 0)
        with open("/proc/%s/stat" % pid) as st:
            return st.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except (ProcessLookupError, FileNotFoundError, PermissionError):
        return False


class _Locked:
    def __enter__(self):
        self.f = open(STATE + ".lock", "a+")
        fcntl.flock(self.f, fcntl.LOCK_EX)
        try:
            with open(STATE) as g:
                self.s = json.load(g)
        except (OSError, ValueError):
            self.s = {}
        for pid in [p for p in self.s if not _alive(p)]:
            del self.s[pid]
        return self.s

    def __exit__(self, *exc):
        with open(STATE + ".tmp", "w") as g:
            json.dump(self.s, g)
        os.replace(STATE + ".tmp", STATE)
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()


def procs():
    with _Locked() as s:
        return dict(s)


def init():
    with _Locked() as s:
        me = s.setdefault(str(os.getpid()), {"used": 0, "ledger": ledger()})
        me["used"] = max(me["used"], CTX)


def _ledger_used(s, led):
    return sum(p["used"] for p in s.values() if p["ledger"] == led)


def mem_info():
    with _Locked() as s:
        real_free = CARD - IDLE - sum(p["used"] for p in s.values())
        if not hooked():
            return real_free, CARD
        return max(0, min(cap() - _ledger_used(s, ledger()), real_free)), cap()


def total():
    return cap() if hooked() else CARD


def alloc(n):
    with _Locked() as s:
        me = s.setdefault(str(os.getpid()), {"used": CTX, "ledger": ledger()})
        if hooked() and _ledger_used(s, ledger()) + n > cap():
            return False
        me["used"] += n
        return True


def free(n):
    with _Locked() as s:
        me = s.get(str(os.getpid()))
        if me:
            me["used"] = max(CTX, me["used"] - n)


def device_used():
    with _Locked() as s:
        return IDLE + sum(p["used"] for p in s.values())


def pid_offset():
    return int(os.environ.get("FAKEGPU_PID_OFFSET", "0"))


PERIOD_US = 1_000_000 // 6


def share():
    """This process's compute share in percent, when it is under the shim with one."""
    text = os.environ.get("FGPU_COMPUTE", "") if hooked() else ""
    m = re.fullmatch(r"\s*([0-9.]+)%\s*", text)
    return float(m.group(1)) if m else None


def compute_start():
    import time
    with _Locked() as s:
        me = s.setdefault(str(os.getpid()), {"used": CTX, "ledger": ledger()})
        me["share"] = share()
        me["computing"] = time.time()


def utilisation(last_seen_us):
    """NVML-style per-process samples, one per 1/6 s period ending after last_seen_us."""
    import time
    now_us = int(time.time() * 1e6)
    running = {pid: p for pid, p in procs().items() if p.get("computing")}
    capped = {pid: p["share"] for pid, p in running.items() if p.get("share") is not None}
    free = [pid for pid in running if pid not in capped]
    left = max(0.0, 100.0 - sum(capped.values()))
    out = []
    t = (last_seen_us // PERIOD_US + 1) * PERIOD_US
    while t <= now_us:
        for pid, p in running.items():
            if p["computing"] * 1e6 < t - PERIOD_US:
                util = capped.get(pid, left / len(free) if free else 0.0)
                out.append((int(pid) + pid_offset(), t, int(round(util))))
        t += PERIOD_US
    return out
