"""Helpers for the real-GPU validation (tests/gpu/run.sh).

Everything in this module runs in the *unhooked* parent process (no LD_PRELOAD):
the NVML monitor that provides the ground truth, the child-process protocol, and
the environment for hooked and unhooked children.

Child protocol (see wl_common.py): a workload prints
    @HOLD <tag> <json>     when it holds its memory; it then blocks on stdin
                           until the parent writes one line ("go").
    @RESULT <json>         once, with its results, before it exits.
Anything else on stdout is kept as noise; stderr goes to a file.
"""

import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time

MIB = 1 << 20
HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = os.environ.get("PYTHON") or sys.executable or "python3"


class CheckError(Exception):
    """A step of a check failed in a way that ends the check."""


class Skip(Exception):
    """The check cannot run here (framework missing): SKIP, not FAIL."""


def parse_size_mib(text):
    """'8G', '8GiB', '8GB', '8192M', '8589934592' -> MiB (float). Binary units."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.I)
    if not m:
        raise ValueError("cannot parse size %r (use e.g. 8G, 8GiB, 8192M)" % text)
    value = float(m.group(1))
    unit = m.group(2).upper()
    factor = {"": 1.0 / MIB, "K": 1.0 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0 * 1024}[unit]
    return value * factor


def env_float(name, default):
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return float(default)


def plain_env(extra=None):
    """Environment of an unhooked process: no LD_PRELOAD, no FGPU_* settings."""
    env = {k: v for k, v in os.environ.items()
           if k != "LD_PRELOAD" and not k.startswith("FGPU_")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    if extra:
        for k, v in extra.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
    return env


def hooked_env(lib, cap, ledger, log="warn", extra=None):
    env = plain_env(extra)
    env["LD_PRELOAD"] = lib
    env["FGPU_LIMIT"] = cap
    env["FGPU_LEDGER"] = ledger
    env["FGPU_LOG"] = log
    return env


def device_index():
    """NVML index of the GPU the workloads use (CUDA_VISIBLE_DEVICES=<n> or 0)."""
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return int(cvd) if cvd.isdigit() else 0


def _num(text):
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        return None


class Monitor:
    """Ground truth: NVML read by this unhooked process (pynvml, else nvidia-smi)."""

    def __init__(self, index=None):
        self.index = device_index() if index is None else index
        self.nv = None
        self.handle = None
        self.smi = shutil.which("nvidia-smi")
        if os.environ.get("FGPU_GPU_MONITOR", "auto") != "nvidia-smi":
            try:
                import pynvml  # nvidia-ml-py
                pynvml.nvmlInit()
                self.handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
                self.nv = pynvml
            except Exception:
                self.nv = None
        if self.nv is None and not self.smi:
            raise CheckError("no NVML monitor: neither pynvml nor nvidia-smi is available")
        self.source = "pynvml" if self.nv is not None else "nvidia-smi"

    def _smi(self, args):
        out = subprocess.run([self.smi, "-i", str(self.index)] + args,
                             env=plain_env(), capture_output=True, text=True, timeout=30)
        if out.returncode != 0:
            raise CheckError("monitor nvidia-smi %s failed: %s" % (" ".join(args), out.stderr.strip()[-300:]))
        return out.stdout

    def device(self):
        """{'total','used','free'} in MiB for the whole card."""
        if self.nv is not None:
            m = self.nv.nvmlDeviceGetMemoryInfo(self.handle)
            return {"total": m.total / MIB, "used": m.used / MIB, "free": m.free / MIB}
        line = self._smi(["--query-gpu=memory.total,memory.used,memory.free",
                          "--format=csv,noheader,nounits"]).strip().splitlines()[0]
        t, u, f = [_num(x) for x in line.split(",")]
        return {"total": t, "used": u, "free": f}

    def processes(self):
        """{pid: MiB or None} of the compute processes NVML lists (host PIDs)."""
        procs = {}
        if self.nv is not None:
            for p in self.nv.nvmlDeviceGetComputeRunningProcesses(self.handle):
                used = getattr(p, "usedGpuMemory", None)
                procs[int(p.pid)] = None if used is None else used / MIB
            return procs
        text = self._smi(["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"])
        for line in text.splitlines():
            parts = [x.strip() for x in line.split(",")]
            if len(parts) >= 2 and parts[0].isdigit():
                procs[int(parts[0])] = _num(parts[1])
        return procs

    def truth(self, pids, baseline_used):
        """Real memory of the given processes, context included.

        Per-process NVML figures when NVML lists these PIDs (same PID namespace);
        otherwise the card's used memory minus the idle baseline."""
        procs = self.processes()
        dev = self.device()
        delta = dev["used"] - baseline_used
        seen = {p: procs[p] for p in pids if p in procs and procs[p] is not None}
        if seen:
            return {"mib": round(sum(seen.values()), 1), "source": "nvml-pid",
                    "per_pid_mib": {str(k): round(v, 1) for k, v in seen.items()},
                    "device_delta_mib": round(delta, 1), "nvml_process_count": len(procs)}
        return {"mib": round(delta, 1), "source": "nvml-device-delta",
                "device_delta_mib": round(delta, 1), "nvml_process_count": len(procs)}

    def process_utilisation(self, pids, from_us, to_us):
        """Mean smUtil (percent of the GPU's time) per PID over the NVML sample periods
        stamped in (from_us, to_us]: nvmlDeviceGetProcessUtilization with lastSeenTimeStamp
        = from_us. A period in which a PID has no sample counts 0 for it (NVML reports only
        processes that ran). Returns ({pid: percent}, periods); needs pynvml."""
        if self.nv is None:
            raise CheckError("the compute checks read NVML's per-process samples and need pynvml (nvidia-ml-py)")
        try:
            samples = self.nv.nvmlDeviceGetProcessUtilization(self.handle, int(from_us))
        except self.nv.NVMLError as e:
            if "Not Found" in str(e):
                samples = []
            else:
                raise CheckError("nvmlDeviceGetProcessUtilization: %s" % e)
        kept = [s for s in samples if from_us < s.timeStamp <= to_us]
        periods = len({s.timeStamp for s in kept})
        sums = {pid: 0.0 for pid in pids}
        for s in kept:
            if int(s.pid) in sums:
                sums[int(s.pid)] += s.smUtil
        return ({pid: (total / periods if periods else None) for pid, total in sums.items()}, periods)

    def wait_idle(self, idle_used, timeout=10.0, slack=64.0):
        """Wait until earlier checks' memory is gone; returns the baseline used MiB."""
        end = time.time() + timeout
        used = self.device()["used"]
        while used > idle_used + slack and time.time() < end:
            time.sleep(0.2)
            used = self.device()["used"]
        return used


class PeakSampler:
    """Samples the monitor in the background; keeps the highest reading."""

    def __init__(self, monitor, pids_fn, baseline_used, period=0.1):
        self.monitor = monitor
        self.pids_fn = pids_fn
        self.baseline = baseline_used
        self.period = period
        self.peak = None
        self.samples = 0
        self.errors = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join(timeout=5)

    def _run(self):
        while not self._stop.is_set():
            try:
                t = self.monitor.truth(self.pids_fn(), self.baseline)
                self.samples += 1
                if self.peak is None or t["mib"] > self.peak:
                    self.peak = t["mib"]
            except Exception:
                self.errors += 1
            self._stop.wait(self.period)


class Child:
    """A workload process speaking the @HOLD/@RESULT protocol."""

    def __init__(self, label, script, args, env, workdir):
        self.label = label
        self.stderr_path = os.path.join(workdir, "%s.stderr" % label)
        self._err = open(self.stderr_path, "w")
        argv = [PYTHON, os.path.join(HERE, script)] + list(args)
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=self._err, env=env, text=True, bufsize=1, cwd=HERE)
        self.pid = self.p.pid
        self.result = None
        self.waiting = False  # it printed @HOLD and waits for a line on stdin
        self.noise = []
        self.q = queue.Queue()
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self):
        try:
            for line in self.p.stdout:
                self.q.put(line.rstrip("\n"))
        except Exception:
            pass
        self.q.put(None)

    def _event(self, deadline):
        while True:
            remaining = deadline - time.time()
            if remaining <= 0:
                return ("timeout", None, None)
            try:
                line = self.q.get(timeout=remaining)
            except queue.Empty:
                return ("timeout", None, None)
            if line is None:
                return ("eof", None, None)
            if line.startswith("@HOLD "):
                self.waiting = True
                parts = line.split(" ", 2)
                data = json.loads(parts[2]) if len(parts) > 2 and parts[2] else {}
                return ("hold", parts[1], data)
            if line.startswith("@RESULT "):
                self.result = json.loads(line[len("@RESULT "):])
                return ("result", None, self.result)
            self.noise.append(line)
            del self.noise[:-20]

    def next(self, deadline):
        """Next protocol event: ('hold', tag, data), ('result', None, data),
        ('eof', None, None) or ('timeout', None, None)."""
        return self._event(deadline)

    def expect_hold(self, deadline, tag=None):
        """Wait for the next @HOLD; returns (tag, data). Raises CheckError otherwise."""
        kind, got, data = self._event(deadline)
        if kind == "hold":
            if tag is not None and got != tag:
                raise CheckError("%s: expected hold %r, got %r" % (self.label, tag, got))
            return got, data
        if kind == "result":
            err = data.get("error") if isinstance(data, dict) else None
            raise CheckError("%s ended before holding: %s" % (self.label, err or json.dumps(data)[:300]))
        if kind == "eof":
            self.p.wait(timeout=5)
            raise CheckError("%s exited (rc %s) before holding: %s"
                             % (self.label, self.p.returncode, self.stderr_tail(3) or "no stderr"))
        raise CheckError("%s: no @HOLD before the deadline" % self.label)

    def go(self, word="go"):
        self.waiting = False
        try:
            self.p.stdin.write(word + "\n")
            self.p.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def finish(self, deadline):
        """Release it and read until it exits; returns its @RESULT (or None)."""
        if self.waiting:
            self.go()
        while True:
            kind, _, data = self._event(deadline)
            if kind == "hold":
                self.go()
                continue
            if kind in ("eof", "timeout"):
                break
        try:
            self.p.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            self.kill()
        return self.result

    def alive(self):
        return self.p.poll() is None

    def kill(self, sig=9):
        if self.p.poll() is None:
            try:
                os.kill(self.p.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def stderr_tail(self, n=8):
        try:
            self._err.flush()
            with open(self.stderr_path, errors="replace") as f:
                lines = [l.rstrip() for l in f if l.strip()]
            return " | ".join(lines[-n:])
        except OSError:
            return ""


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    if n == 0:
        return None
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2.0
