"""One real-GPU check of fgpu; run by tests/gpu/run.sh, never under the shim itself.

    python3 tests/gpu/check.py NAME --lib LIBFGPU --workdir DIR --time-limit SECONDS
                               [--cap 8G] [--idle-used MIB]

Starts the workloads (wl_*.py) with LD_PRELOAD=libfgpu.so and a fresh FGPU_LEDGER,
reads the ground truth from NVML in this unhooked process while they hold their
memory, and prints exactly one JSON line:

    {"check": NAME, "status": "pass"|"fail"|"skip", "reason": "...",
     "criteria": [{"name", "ok", "detail"}], "figures": {...},
     "warnings": [...], "notes": [...], "stderr": {label: tail}, "elapsed_s": ...}

Tunables (environment, defaults in brackets):
  FGPU_GPU_CHUNK_MIB [256]    chunk size of the fill checks
  FGPU_GPU_NEAR_MIB [1024]    how far below the cap the out-of-memory may come
  FGPU_GPU_TOL_MIB [512]      nvidia-smi vs CUDA vs NVML agreement
  FGPU_GPU_RECLAIM_S [2.5]    two-process: kill -9 to B's successful allocation
  FGPU_GPU_RUNS [5]           overhead-torch runs with and without the shim
  FGPU_GPU_ALLOCS [2000]      allocations in the overhead loop
  FGPU_GPU_SMI_RUNS [10]      overhead-nvidia-smi runs with and without the shim
  FGPU_GPU_WORK_TOL [0.10], FGPU_GPU_WALL_TOL [0.20], FGPU_GPU_SMI_TOL [0.25]
                              allowed relative overheads
  FGPU_GPU_VIA [auto]         cuda-bindings | torch | cupy for the hold workloads
  FGPU_GPU_LOG [warn]         FGPU_LOG of the hooked processes
  FGPU_GPU_MONITOR [auto]     auto (pynvml, else nvidia-smi) | nvidia-smi
  FGPU_GPU_COMPUTE_TOL [5]    points around a compute share
  FGPU_GPU_COMPUTE_WINDOW_S [10]  the window the compute shares are measured over
"""

import argparse
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpulib import (MIB, PYTHON, CheckError, Child, Monitor, PeakSampler, Skip,  # noqa: E402
                    device_index, env_float, hooked_env, median, parse_size_mib, plain_env)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Terminated(Exception):
    pass


def has_module(name):
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def need(module, label=None):
    if not has_module(module):
        raise Skip("%s not importable" % (label or module))


def mib(x):
    return None if x is None else round(x / MIB, 1)


class Ctx:
    def __init__(self, a):
        self.name = a.name
        self.lib = os.path.abspath(a.lib)
        self.cap = a.cap
        self.cap_mib = parse_size_mib(a.cap)
        self.cap_bytes = int(round(self.cap_mib * MIB))
        self.work_root = os.path.abspath(a.workdir)
        self.workdir = os.path.join(self.work_root, a.name)
        os.makedirs(self.workdir, exist_ok=True)
        self.start = time.time()
        self.deadline = self.start + max(5.0, a.time_limit - 3.0)
        self.idle_used = a.idle_used
        self.log = os.environ.get("FGPU_GPU_LOG", "warn")
        self.children = []
        self.criteria = []
        self.figures = {}
        self.warnings = []
        self.notes = []
        self.summary = ""
        self._monitor = None
        self.baseline = None
        self._ledgers = 0

    # --- environment and processes ------------------------------------------
    def monitor(self):
        if self._monitor is None:
            self._monitor = Monitor()
            if self.idle_used is not None:
                self.baseline = self._monitor.wait_idle(self.idle_used)
                if self.baseline > self.idle_used + 64:
                    self.warnings.append("GPU not idle at start: %.0f MiB used, idle was %.0f MiB"
                                         % (self.baseline, self.idle_used))
            else:
                self.baseline = self._monitor.device()["used"]
            self.figures["monitor"] = self._monitor.source
        return self._monitor

    def truth(self, pids):
        return self.monitor().truth(pids, self.baseline)

    def ledger(self):
        self._ledgers += 1
        return os.path.join(self.workdir, "ledger-%d" % self._ledgers)

    def henv(self, ledger, extra=None):
        return hooked_env(self.lib, self.cap, ledger, self.log, extra)

    def spawn(self, label, script, args=(), ledger=None, extra=None, hooked=True):
        env = self.henv(ledger or self.ledger(), extra) if hooked else plain_env(extra)
        ch = Child(label, script, [str(x) for x in args], env, self.workdir)
        self.children.append(ch)
        return ch

    def step(self, seconds):
        return min(self.deadline, time.time() + seconds)

    def remaining(self):
        return self.deadline - time.time()

    def via(self):
        want = os.environ.get("FGPU_GPU_VIA", "auto")
        mods = {"cuda-bindings": ("cuda.bindings", "cuda.cuda"), "torch": ("torch",), "cupy": ("cupy",)}
        order = list(mods) if want == "auto" else [want]
        for name in order:
            if any(has_module(m) for m in mods.get(name, ())):
                return name
        raise Skip("none of cuda-bindings, torch, cupy is importable")

    # --- results -------------------------------------------------------------
    def crit(self, name, ok, detail=""):
        self.criteria.append({"name": name, "ok": bool(ok), "detail": detail})
        return ok

    def fig(self, key, value):
        if isinstance(value, float):
            value = round(value, 4 if abs(value) < 10 else 1)
        self.figures[key] = value

    def truth_fig(self, key, t):
        self.fig(key + "_mib", t["mib"])
        self.figures[key + "_source"] = t["source"]

    def within_cap(self, t):
        """Real usage <= cap; a device-wide reading gets 16 MiB of noise."""
        slack = 0.0 if t["source"] == "nvml-pid" else 16.0
        return t["mib"] <= self.cap_mib + slack

    def cleanup(self):
        for ch in self.children:
            ch.kill()


# --------------------------------------------------------------------------------
# nvidia-smi under the shim
# --------------------------------------------------------------------------------
ROW = re.compile(r"^\|\s+(\d+)\s+(\S+)\s+(\S+)\s+(\d+)\s+(\S+)\s+(.+?)\s+(\d+)MiB\s*\|\s*$")
MEMCOL = re.compile(r"(\d+)MiB\s*/\s*(\d+)MiB")


def smi(args, env, timeout=30):
    exe = shutil.which("nvidia-smi")
    try:
        r = subprocess.run([exe] + args, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise CheckError("nvidia-smi %s hung for %d s%s" % (" ".join(args), timeout,
                                                            " under the shim" if env.get("LD_PRELOAD") else ""))
    if r.returncode != 0:
        raise CheckError("nvidia-smi %s exited %d: %s" % (" ".join(args), r.returncode,
                                                          (r.stderr or r.stdout).strip()[-300:]))
    return r.stdout


def parse_apps(text):
    apps = []
    for line in text.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) >= 2 and parts[0].isdigit():
            try:
                apps.append((int(parts[0]), float(parts[1])))
            except ValueError:
                apps.append((int(parts[0]), None))
    return apps


def parse_rows(text):
    return [(int(m.group(4)), float(m.group(7))) for m in map(ROW.match, text.splitlines()) if m]


def judge_process_list(c, name, hooked, unhooked, ours, outsider_pid, outsider_mib):
    """hooked/unhooked: [(pid, MiB)]; ours: the ledger's PIDs as this process sees them."""
    c.fig(name + "_hooked", ["%d:%s" % (p, m) for p, m in hooked])
    c.fig(name + "_unhooked", ["%d:%s" % (p, m) for p, m in unhooked])
    if not unhooked:
        c.notes.append("%s: NVML lists no processes here even without the shim "
                       "(PID namespace); process filtering not verifiable" % name)
        return
    upids = {p for p, _ in unhooked}
    if outsider_pid in upids:  # same PID namespace: compare PIDs exactly
        got = {p for p, _ in hooked}
        c.crit(name + "-only-ledger-processes", got == set(ours),
               "listed %s, ledger %s, outsider %d" % (sorted(got), sorted(ours), outsider_pid))
        return
    big = [m for _, m in hooked if m is not None and m >= outsider_mib]
    ok = len(hooked) == len(ours) and not big and len(unhooked) > len(hooked)
    c.crit(name + "-only-ledger-processes", ok,
           "host PIDs: %d listed under the shim (ledger has %d), %d without; "
           "entries >= outsider's %d MiB under the shim: %s"
           % (len(hooked), len(ours), len(unhooked), outsider_mib, big))


def check_nvidia_smi(c):
    if not shutil.which("nvidia-smi"):
        raise Skip("nvidia-smi not found")
    via = c.via()
    c.fig("via", via)
    tol = env_float("FGPU_GPU_TOL_MIB", 512)
    mon = c.monitor()
    card = mon.device()
    c.fig("card_total_mib", card["total"])
    outsider_mib, holder_mib = 3072, 1024

    out = c.spawn("outsider", "wl_hold.py", ["--via", via, "--mib", outsider_mib], hooked=False)
    out.expect_hold(c.step(60), "held")
    t_out = c.truth([out.pid])
    c.truth_fig("outsider_real", t_out)

    L = c.ledger()
    holder = c.spawn("holder", "wl_hold.py", ["--via", via, "--mib", holder_mib], ledger=L)
    _, hd = holder.expect_hold(c.step(60), "held")
    probe = c.spawn("probe", "wl_hold.py", ["--via", via, "--mib", 0], ledger=L)
    _, pd = probe.expect_hold(c.step(60), "held")
    c.crit("holder-allocated", hd.get("first") == "ok", "holder's %d MiB: %s" % (holder_mib, hd.get("first")))

    t_all = c.truth([out.pid, holder.pid, probe.pid])
    t_ledger = c.truth([holder.pid, probe.pid])
    if t_ledger["source"] != "nvml-pid":
        t_ledger = dict(t_ledger, mib=round(t_all["mib"] - t_out["mib"], 1), source="nvml-device-delta")
    c.truth_fig("ledger_real", t_ledger)

    env = c.henv(L)
    text_h = smi([], env)
    csv_h = smi(["-i", str(mon.index), "--query-gpu=memory.total,memory.used,memory.free",
                 "--format=csv,noheader,nounits"], env)
    apps_h = smi(["-i", str(mon.index), "--query-compute-apps=pid,used_memory",
                  "--format=csv,noheader,nounits"], env)
    apps_u = smi(["-i", str(mon.index), "--query-compute-apps=pid,used_memory",
                  "--format=csv,noheader,nounits"], plain_env())
    text_u = smi([], plain_env())
    for ch in (probe, holder, out):
        ch.finish(c.step(20))

    # the text view
    mem_h = MEMCOL.findall(text_h)
    mem_u = MEMCOL.findall(text_u)
    shown = [int(t) for _, t in mem_h]
    card_shown = [int(t) for _, t in mem_u]
    c.fig("text_total_mib_hooked", shown)
    c.fig("text_total_mib_unhooked", card_shown)
    cap_i = int(round(c.cap_mib))
    c.crit("text-shows-cap", bool(shown) and all(t == cap_i for t in shown),
           "memory column totals %s MiB under the shim (cap %d, card %s)" % (shown, cap_i, card_shown))

    # the CSV query against CUDA and the monitor
    try:
        total, used, free = [float(x) for x in csv_h.strip().splitlines()[0].split(",")[:3]]
    except (ValueError, IndexError):
        raise CheckError("cannot parse nvidia-smi CSV %r" % csv_h.strip()[:200])
    c.fig("csv_total_mib", total)
    c.fig("csv_used_mib", used)
    c.fig("csv_free_mib", free)
    c.crit("csv-total-is-cap", abs(total - c.cap_mib) < 1, "memory.total %.0f MiB, cap %.0f" % (total, c.cap_mib))
    cuda_free, cuda_total = pd["free"] / MIB, pd["total"] / MIB
    c.fig("cuda_free_mib", cuda_free)
    c.fig("cuda_total_mib", cuda_total)
    c.fig("cuda_api", "cuMemGetInfo" if via == "cuda-bindings" else
          ("torch.cuda.mem_get_info" if via == "torch" else "cudaMemGetInfo (CuPy)"))
    c.crit("cuda-total-is-cap", pd["total"] == c.cap_bytes,
           "%s total %d bytes, cap %d" % (c.figures["cuda_api"], pd["total"], c.cap_bytes))
    c.fig("csv_free_minus_cuda_free_mib", free - cuda_free)
    c.crit("csv-free-agrees-with-cuda", abs(free - cuda_free) <= tol,
           "nvidia-smi free %.0f MiB, CUDA free %.0f MiB (tolerance %.0f)" % (free, cuda_free, tol))
    c.fig("csv_used_minus_real_mib", used - t_ledger["mib"])
    c.crit("csv-used-agrees-with-monitor", abs(used - t_ledger["mib"]) <= tol,
           "nvidia-smi used %.0f MiB, monitor (holder + probe, contexts included) %.0f MiB (tolerance %.0f)"
           % (used, t_ledger["mib"], tol))

    ours = [holder.pid, probe.pid]
    judge_process_list(c, "csv", parse_apps(apps_h), parse_apps(apps_u), ours, out.pid, outsider_mib)
    judge_process_list(c, "text", parse_rows(text_h), parse_rows(text_u), ours, out.pid, outsider_mib)
    c.summary = "nvidia-smi total %.0f MiB, used %.0f, free %.0f; CUDA free %.0f" % (total, used, free, cuda_free)


# --------------------------------------------------------------------------------
# fill to the cap: PyTorch, CuPy, cuda-bindings
# --------------------------------------------------------------------------------
def fill_check(c, script, extra, api, oom_ok, oom_text):
    chunk = int(env_float("FGPU_GPU_CHUNK_MIB", 256))
    near = env_float("FGPU_GPU_NEAR_MIB", 1024)
    c.monitor()
    ch = c.spawn("workload", script, ["--chunk-mib", chunk, "--max-mib", int(2 * c.cap_mib)], extra=extra)
    with PeakSampler(c.monitor(), lambda: [ch.pid], c.baseline) as ps:
        _, init = ch.expect_hold(c.step(90), "init")
        t_init = c.truth([ch.pid])
        ch.go()
        _, full = ch.expect_hold(c.step(90), "full")
        t_full = c.truth([ch.pid])
        ch.go()
        res = ch.finish(c.step(45)) or {}
    c.truth_fig("context_real", t_init)
    c.truth_fig("full_real", t_full)
    c.fig("monitor_samples", ps.samples)
    c.fig("reported_total_mib", mib(init["total"]))
    c.fig("reported_free_at_start_mib", mib(init["free"]))
    c.fig("reported_free_at_oom_mib", mib(full["free"]))
    c.fig("chunks_of_%d_mib" % chunk, full["chunks"])
    c.fig("gap_below_cap_mib", c.cap_mib - t_full["mib"])
    for k in ("props_total", "device_total_mem"):
        if k in init:
            c.fig(k + "_mib", mib(init[k]))
    for k in ("torch", "torch_cuda", "backend", "alloc_conf", "cupy", "cuda_runtime", "cuda_driver",
              "driver_version", "device_name"):
        if k in init:
            c.fig(k, init[k])
    for k in ("allocated", "reserved", "pool_total"):
        if k in full:
            c.fig("framework_%s_at_oom_mib" % k, mib(full[k]))

    c.crit("%s-total-is-cap" % api, init["total"] == c.cap_bytes,
           "total %d bytes (%.0f MiB), cap %d" % (init["total"], init["total"] / MIB, c.cap_bytes))
    if "props_total" in init and init["props_total"] != c.cap_bytes:
        c.warnings.append("device properties report %.0f MiB total, not the cap" % (init["props_total"] / MIB))
    c.crit("out-of-memory-at-cap", oom_ok(full),
           "%s after %d x %d MiB" % (oom_text(full), full["chunks"], chunk))
    c.crit("out-of-memory-near-cap", t_full["mib"] >= c.cap_mib - near,
           "real %.0f MiB at the error, cap %.0f (may be at most %.0f below)" % (t_full["mib"], c.cap_mib, near))
    peak = max(ps.peak or 0.0, t_init["mib"], t_full["mib"])
    c.fig("peak_real_mib", peak)
    c.crit("real-usage-within-cap", c.within_cap(t_full) and c.within_cap(dict(t_full, mib=peak)),
           "real %.0f MiB at the error, sampled peak %.0f, cap %.0f (%s)" % (t_full["mib"], peak, c.cap_mib, t_full["source"]))
    rec = res.get("recovered") or {}
    c.crit("allocates-again-after-free", rec.get("ok") is True,
           "1 GiB after freeing everything: %s" % json.dumps(rec)[:200])
    if "free_after_release" in res:
        c.fig("reported_free_after_release_mib", mib(res["free_after_release"]))
    c.summary = "error at %.0f MiB real (cap %.0f), context %.0f MiB, peak %.0f" % (
        t_full["mib"], c.cap_mib, t_init["mib"], peak)


def torch_oom_ok(full):
    return bool(full.get("oom")) and full["oom"]["type"] == "OutOfMemoryError"


def torch_oom_text(full):
    if full.get("oom"):
        return "%s.%s: %s" % (full["oom"]["module"], full["oom"]["type"], full["oom"]["message"][:120])
    if full.get("other_error"):
        return "not an OutOfMemoryError: %s: %s" % (full["other_error"]["type"], full["other_error"]["message"][:120])
    return "no error"


def make_torch_check(conf):
    def check(c):
        need("torch")
        extra = {"PYTORCH_CUDA_ALLOC_CONF": conf, "PYTORCH_NO_CUDA_MEMORY_CACHING": None}
        fill_check(c, "wl_torch_fill.py", extra, "mem_get_info", torch_oom_ok, torch_oom_text)
    return check


def check_cupy(c):
    need("cupy")
    fill_check(c, "wl_cupy_fill.py", {}, "memGetInfo", lambda f: bool(f.get("oom")),
               lambda f: ("cupy OutOfMemoryError: %s" % f["oom"]["message"][:120]) if f.get("oom") else
               ("other error: %s" % json.dumps(f.get("other_error"))[:160] if f.get("other_error") else "no error"))


def check_cuda_bindings(c):
    if not (has_module("cuda.bindings") or has_module("cuda.cuda")):
        raise Skip("cuda-bindings not importable")
    fill_check(c, "wl_cudadrv_fill.py", {}, "cuMemGetInfo", lambda f: f.get("oom") is True,
               lambda f: "cuMemAlloc returned %s" % ("CUDA_SUCCESS every time" if f.get("error_code") is None
                                                      else "CUresult %s" % f["error_code"]))
    dtm = c.figures.get("device_total_mem_mib")
    c.crit("cuDeviceTotalMem-is-cap", dtm is not None and abs(dtm - c.cap_mib) < 0.1,
           "cuDeviceTotalMem %s MiB, cap %.0f" % (dtm, c.cap_mib))


# --------------------------------------------------------------------------------
# JAX preallocation
# --------------------------------------------------------------------------------
XLA_VARS = ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION",
            "XLA_PYTHON_CLIENT_ALLOCATOR", "TF_FORCE_GPU_ALLOW_GROWTH", "JAX_PLATFORMS", "JAX_PLATFORM_NAME")


def check_jax(c):
    need("jax")
    frac = 0.75
    extra = {k: None for k in XLA_VARS}
    mon = c.monitor()
    card = mon.device()["total"]
    c.fig("card_total_mib", card)
    c.fig("unhooked_prealloc_would_be_mib", frac * card)
    ch = c.spawn("workload", "wl_jax_prealloc.py", [], extra=extra)
    with PeakSampler(mon, lambda: [ch.pid], c.baseline) as ps:
        kind, _, data = ch.next(c.step(120))
        if kind == "result" and data.get("no_gpu"):
            ch.finish(c.step(10))
            probe = subprocess.run([PYTHON, "-c", "import jax; print(len(jax.devices('gpu')))"],
                                   env=plain_env(dict(extra, XLA_PYTHON_CLIENT_PREALLOCATE="false")),
                                   capture_output=True, text=True, timeout=max(5, min(60, c.remaining())))
            if probe.returncode == 0:
                raise CheckError("JAX finds the GPU without the shim (%s) but not under it: %s"
                                 % (probe.stdout.strip(), data["no_gpu"]["message"]))
            raise Skip("JAX has no GPU backend here: %s" % data["no_gpu"]["message"][:160])
        if kind != "hold":
            err = (data or {}).get("error") if isinstance(data, dict) else None
            raise CheckError("JAX workload did not reach its hold (%s): %s" % (kind, err or ch.stderr_tail(3)))
        t = c.truth([ch.pid])
        ch.go()
        ch.finish(c.step(30))
    for k in ("jax", "jaxlib", "device", "platform_version"):
        if data.get(k):
            c.fig(k, data[k])
    stats = data.get("stats") or {}
    for k, v in stats.items():
        c.fig("xla_%s_mib" % k, mib(v))
    c.truth_fig("real", t)
    c.fig("real_fraction_of_cap", t["mib"] / c.cap_mib)
    c.crit("jax-computes", data.get("correct") is True, "2048x2048 matrix product correct: %s" % data.get("correct"))
    if "bytes_limit" in stats:
        lim = stats["bytes_limit"] / MIB
        c.fig("xla_limit_fraction_of_cap", lim / c.cap_mib)
        c.crit("xla-limit-is-share-of-cap", 0.70 * c.cap_mib <= lim <= 0.80 * c.cap_mib,
               "XLA bytes_limit %.0f MiB = %.3f of the cap (expected about %.2f)" % (lim, lim / c.cap_mib, frac))
    else:
        c.warnings.append("device.memory_stats() has no bytes_limit; judged on real usage only")
    c.crit("preallocated-share-of-cap", t["mib"] >= 0.70 * c.cap_mib,
           "real %.0f MiB = %.3f of the cap (card would give %.0f MiB)" % (t["mib"], t["mib"] / c.cap_mib, frac * card))
    peak = max(ps.peak or 0.0, t["mib"])
    c.fig("peak_real_mib", peak)
    c.crit("real-usage-within-cap", c.within_cap(t) and c.within_cap(dict(t, mib=peak)),
           "real %.0f MiB, sampled peak %.0f, cap %.0f" % (t["mib"], peak, c.cap_mib))
    c.summary = "preallocated %.0f MiB real = %.2f of the cap" % (t["mib"], t["mib"] / c.cap_mib)


# --------------------------------------------------------------------------------
# two processes, one ledger
# --------------------------------------------------------------------------------
def check_two_process(c):
    via = c.via()
    c.fig("via", via)
    take = 5120
    reclaim_s = env_float("FGPU_GPU_RECLAIM_S", 2.5)
    c.monitor()
    L = c.ledger()
    a = c.spawn("A", "wl_hold.py", ["--via", via, "--mib", take], ledger=L)
    _, ad = a.expect_hold(c.step(60), "held")
    c.crit("A-takes-5G", ad.get("first") == "ok", "A's %d MiB: %s" % (take, ad.get("first")))
    t_a = c.truth([a.pid])
    c.truth_fig("A_real", t_a)

    b = c.spawn("B", "wl_hold.py", ["--via", via, "--mib", take, "--retry-after-go", "--retry-s", 10], ledger=L)
    _, bd = b.expect_hold(c.step(60), "held")
    t_ab = c.truth([a.pid, b.pid])
    c.truth_fig("A_plus_B_real", t_ab)
    c.fig("B_free_seen_mib", mib(bd["free_before"]))
    c.fig("B_total_seen_mib", mib(bd["total_before"]))
    c.crit("B-refused-5G", bd.get("first") == "oom", "B's %d MiB while A holds: %s" % (take, bd.get("first")))
    c.crit("B-sees-A", bd["free_before"] <= c.cap_bytes - take * MIB and bd["total_before"] == c.cap_bytes,
           "B sees total %.0f MiB, free %.0f MiB while A holds %d MiB"
           % (bd["total_before"] / MIB, bd["free_before"] / MIB, take))
    c.crit("shared-usage-within-cap", c.within_cap(t_ab),
           "A + B real %.0f MiB, cap %.0f (%s)" % (t_ab["mib"], c.cap_mib, t_ab["source"]))
    if bd.get("first") != "oom":
        b.finish(c.step(10))
        return

    t_kill = time.time()
    a.kill(signal.SIGKILL)  # and reap it, as a container's init would
    b.go()
    _, rd = b.expect_hold(c.step(30), "retried")
    t_b = c.truth([b.pid])
    b.finish(c.step(10))
    c.truth_fig("B_real_after", t_b)
    latency = (rd["t_success"] - t_kill) if rd.get("ok") else None
    c.fig("reclaim_latency_s", latency)
    c.fig("B_attempts", rd.get("attempts"))
    c.crit("B-takes-share-after-kill-9", rd.get("ok") is True and latency <= reclaim_s,
           "B got %d MiB %s after kill -9 of A (limit %.1f s)"
           % (take, ("%.2f s" % latency) if latency is not None else "never (10 s)", reclaim_s))
    c.crit("usage-within-cap-after", c.within_cap(t_b), "B real %.0f MiB, cap %.0f" % (t_b["mib"], c.cap_mib))
    c.summary = "B refused while A held; B got 5G %.2f s after kill -9" % latency if latency is not None else ""


# --------------------------------------------------------------------------------
# overhead
# --------------------------------------------------------------------------------
def ratio(on, off):
    return None if not off else on / off


def check_overhead_torch(c):
    need("torch")
    runs = int(env_float("FGPU_GPU_RUNS", 5))
    work_tol = env_float("FGPU_GPU_WORK_TOL", 0.10)
    wall_tol = env_float("FGPU_GPU_WALL_TOL", 0.20)
    allocs = int(env_float("FGPU_GPU_ALLOCS", 2000))
    extra = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "PYTORCH_CUDA_ALLOC_CONF": None}
    L = c.ledger()
    c.fig("workload", "100 bf16 8192x8192 matmuls, then %d torch.empty/del of 1-64 MiB, caching disabled" % allocs)
    sets = {True: [], False: []}
    failures = []

    def one(hooked, label):
        t0 = time.perf_counter()
        ch = c.spawn(label, "wl_torch_overhead.py", ["--allocs", allocs], ledger=L, extra=extra, hooked=hooked)
        res = ch.finish(c.step(90))
        wall = time.perf_counter() - t0
        if not res or "error" in res:
            failures.append("%s: %s" % (label, (res or {}).get("error") or ch.stderr_tail(3)))
            return None
        res["wall_s"] = wall
        return res

    one(False, "warmup")  # file cache and GPU clocks; not counted
    per_pair = None
    for i in range(runs):
        if per_pair is not None and c.remaining() < per_pair * 1.5 + 5:
            c.notes.append("stopped after %d pairs to stay inside the time limit" % i)
            break
        t0 = time.time()
        for hooked in ((False, True) if i % 2 == 0 else (True, False)):
            r = one(hooked, "%s-%d" % ("on" if hooked else "off", i))
            if r is not None:
                sets[hooked].append(r)
        per_pair = time.time() - t0
    c.crit("all-runs-succeeded", not failures, "; ".join(failures)[:400] or "%d + %d runs" % (len(sets[True]), len(sets[False])))
    n = min(len(sets[True]), len(sets[False]))
    c.fig("runs_each", n)
    if n < 3:
        raise CheckError("only %d runs each; need at least 3" % n)
    active = all(r["total"] == c.cap_bytes for r in sets[True]) and all(r["total"] != c.cap_bytes for r in sets[False])
    c.crit("shim-active-only-in-hooked-runs", active,
           "mem_get_info total hooked %s MiB, unhooked %s MiB"
           % (sorted({mib(r["total"]) for r in sets[True]}), sorted({mib(r["total"]) for r in sets[False]})))
    c.fig("caching_disabled", all(r.get("caching_disabled") for r in sets[True] + sets[False]))
    med = {}
    for key in ("wall_s", "import_s", "init_s", "matmul_s", "alloc_s", "work_s"):
        for hooked in (False, True):
            med[(key, hooked)] = median([r[key] for r in sets[hooked]])
            c.fig("%s_median_%s" % (key[:-2], "shim" if hooked else "plain") + "_s", med[(key, hooked)])
        c.fig("%s_ratio" % key[:-2], ratio(med[(key, True)], med[(key, False)]))
    c.fig("runs_plain_work_s", [round(r["work_s"], 4) for r in sets[False]])
    c.fig("runs_shim_work_s", [round(r["work_s"], 4) for r in sets[True]])
    c.fig("runs_plain_wall_s", [round(r["wall_s"], 3) for r in sets[False]])
    c.fig("runs_shim_wall_s", [round(r["wall_s"], 3) for r in sets[True]])
    on, off = med[("work_s", True)], med[("work_s", False)]
    c.crit("workload-overhead", on <= off * (1 + work_tol) + 0.02,
           "median work %.3f s with the shim, %.3f s without (ratio %.3f, allowed %.2f + 20 ms)"
           % (on, off, on / off, 1 + work_tol))
    on, off = med[("wall_s", True)], med[("wall_s", False)]
    c.crit("process-wall-overhead", on <= off * (1 + wall_tol) + 0.5,
           "median process wall %.2f s with the shim, %.2f s without (ratio %.3f, allowed %.2f + 0.5 s)"
           % (on, off, on / off, 1 + wall_tol))
    c.summary = "work ratio %.3f, alloc-loop ratio %.3f, process ratio %.3f" % (
        c.figures["work_ratio"], c.figures["alloc_ratio"], c.figures["wall_ratio"])


def check_overhead_nvidia_smi(c):
    exe = shutil.which("nvidia-smi")
    if not exe:
        raise Skip("nvidia-smi not found")
    runs = int(env_float("FGPU_GPU_SMI_RUNS", 10))
    tol = env_float("FGPU_GPU_SMI_TOL", 0.25)
    L = c.ledger()
    envs = {True: c.henv(L), False: plain_env()}
    total_h = smi(["-i", str(device_index()), "--query-gpu=memory.total", "--format=csv,noheader,nounits"], envs[True])
    c.crit("shim-active", total_h.strip() == str(int(round(c.cap_mib))),
           "memory.total under the shim: %s MiB" % total_h.strip())
    times = {True: [], False: []}
    errors = []

    def once(hooked):
        t0 = time.perf_counter()
        try:
            r = subprocess.run([exe], env=envs[hooked], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True, timeout=30)
        except subprocess.TimeoutExpired:
            raise CheckError("nvidia-smi hung for 30 s%s" % (" under the shim" if hooked else ""))
        dt = time.perf_counter() - t0
        if r.returncode != 0:
            errors.append("rc %d: %s" % (r.returncode, r.stderr.strip()[-200:]))
        return dt

    once(False)
    once(True)
    for i in range(runs):
        if c.remaining() < 10:
            c.notes.append("stopped after %d pairs to stay inside the time limit" % i)
            break
        for hooked in ((False, True) if i % 2 == 0 else (True, False)):
            times[hooked].append(once(hooked))
    c.crit("all-runs-succeeded", not errors, "; ".join(errors)[:300] or "%d + %d runs" % (len(times[True]), len(times[False])))
    if min(len(times[True]), len(times[False])) < 3:
        raise CheckError("fewer than 3 runs each")
    on, off = median(times[True]), median(times[False])
    c.fig("runs_each", len(times[True]))
    c.fig("median_plain_s", off)
    c.fig("median_shim_s", on)
    c.fig("ratio", on / off)
    c.fig("runs_plain_s", [round(x, 4) for x in times[False]])
    c.fig("runs_shim_s", [round(x, 4) for x in times[True]])
    c.crit("startup-overhead", on <= off * (1 + tol) + 0.05,
           "median %.3f s with the shim, %.3f s without (ratio %.3f, allowed %.2f + 50 ms)" % (on, off, on / off, 1 + tol))
    c.summary = "nvidia-smi median %.3f s vs %.3f s, ratio %.3f" % (on, off, on / off)


# --------------------------------------------------------------------------------
# compute share
# --------------------------------------------------------------------------------
def compute_window(c, jobs):
    """Starts `jobs` [(label, share or None for unhooked, graphs)], waits until all run,
    lets them settle, and measures each one's share of the GPU's time over the window
    from NVML's per-process samples, read by this unhooked process."""
    need("torch")
    tol = env_float("FGPU_GPU_COMPUTE_TOL", 5)
    window = env_float("FGPU_GPU_COMPUTE_WINDOW_S", 10)
    mon = c.monitor()
    if mon.nv is None:
        raise Skip("the compute checks need pynvml (NVML's per-process samples)")
    seconds = window + 5
    children = []
    for label, share, graphs in jobs:
        args = ["--seconds", seconds] + (["--graphs"] if graphs else [])
        extra = {"FGPU_COMPUTE": share} if share else None
        children.append(c.spawn(label, "wl_torch_compute.py", args, extra=extra, hooked=share is not None))
    for ch in children:
        ch.expect_hold(c.step(60), "running")
    time.sleep(2.0)
    t0 = time.time()
    time.sleep(window)
    t1 = time.time()
    time.sleep(1.0)  # the last period's samples
    shares, periods = mon.process_utilisation([ch.pid for ch in children], t0 * 1e6, t1 * 1e6)
    results = [ch.finish(c.step(seconds + 10)) for ch in children]
    c.fig("window_s", round(t1 - t0, 2))
    c.fig("sample_periods", periods)
    if periods < 5:
        raise CheckError("NVML gave %d sample periods in a %.0f s window" % (periods, window))
    if all(shares[ch.pid] == 0 for ch in children):
        raise CheckError("NVML's samples name none of the workloads' PIDs (another PID namespace?)")
    out = {}
    for (label, share, graphs), ch, res in zip(jobs, children, results):
        got = shares[ch.pid] or 0.0
        out[label] = got
        c.fig("%s_percent" % label, got)
        c.fig("%s_iterations" % label, (res or {}).get("iterations"))
        c.crit("%s-ran" % label, bool(res) and "error" not in res and res.get("iterations", 0) > 0,
               "%s: %s" % (label, (res or {}).get("error") or "%s iterations" % (res or {}).get("iterations")))
    return out, tol


def check_compute_torch(c):
    out, tol = compute_window(c, [("A", "30%", False), ("B", "70%", False)])
    for label, want in (("A", 30.0), ("B", 70.0)):
        c.crit("%s-at-%d" % (label, want), abs(out[label] - want) <= tol,
               "%s took %.1f %% of the GPU's time, its share is %d %% (+-%g)" % (label, out[label], want, tol))
    c.summary = "30 %% job %.1f %%, 70 %% job %.1f %%" % (out["A"], out["B"])


def check_compute_graphs(c):
    out, tol = compute_window(c, [("graphs", "30%", True), ("uncapped", None, False)])
    c.crit("graphs-at-30", abs(out["graphs"] - 30.0) <= tol,
           "the job replaying CUDA graphs took %.1f %% of the GPU's time, its share is 30 %% (+-%g)" % (out["graphs"], tol))
    c.crit("uncapped-at-least-65", out["uncapped"] >= 65.0 - tol,
           "the unhooked job beside it took %.1f %% (at least 65 - %g)" % (out["uncapped"], tol))
    c.summary = "graphs job %.1f %%, uncapped job %.1f %%" % (out["graphs"], out["uncapped"])


CHECKS = {
    "nvidia-smi": check_nvidia_smi,
    "torch-default": make_torch_check(None),
    "torch-expandable": make_torch_check("expandable_segments:True"),
    "torch-async": make_torch_check("backend:cudaMallocAsync"),
    "jax": check_jax,
    "cupy": check_cupy,
    "cuda-bindings": check_cuda_bindings,
    "two-process": check_two_process,
    "overhead-torch": check_overhead_torch,
    "overhead-nvidia-smi": check_overhead_nvidia_smi,
    "compute-torch": check_compute_torch,
    "compute-graphs": check_compute_graphs,
}


def sanitize(text, c):
    for path, name in ((c.lib, "<libfgpu.so>"), (c.work_root, "<work>"), (REPO, "<repo>"),
                       (os.path.expanduser("~"), "~")):
        if path and len(path) > 1:
            text = text.replace(path, name)
    return text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("name", choices=sorted(CHECKS))
    ap.add_argument("--lib", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--time-limit", type=float, default=60)
    ap.add_argument("--cap", default="8G")
    ap.add_argument("--idle-used", type=float, default=None)
    a = ap.parse_args()
    c = Ctx(a)

    def on_term(signum, frame):
        raise Terminated("terminated by signal %d (time limit)" % signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGALRM, on_term)
    signal.alarm(int(max(5, a.time_limit - 1)))
    status, reason = "fail", ""
    try:
        CHECKS[a.name](c)
        failed = [x for x in c.criteria if not x["ok"]]
        if failed:
            reason = "; ".join("%s (%s)" % (x["name"], x["detail"]) for x in failed)
        elif not c.criteria:
            reason = "no criterion was evaluated"
        else:
            status, reason = "pass", c.summary
    except Skip as e:
        status, reason = "skip", str(e)
    except (CheckError, Terminated) as e:
        reason = str(e)
    except Exception as e:  # noqa: BLE001 - a bug in the check itself
        reason = "check crashed: %s: %s | %s" % (type(e).__name__, e, traceback.format_exc(limit=3)[-500:])
    finally:
        signal.alarm(0)
        try:
            c.cleanup()
        except Exception:  # noqa: BLE001
            pass
    stderr = {}
    for ch in c.children:
        tail = ch.stderr_tail(6)
        if tail and (status == "fail" or "fgpu" in tail.lower()):
            stderr[ch.label] = tail[-600:]
    out = {"check": a.name, "status": status, "reason": reason, "criteria": c.criteria,
           "figures": c.figures, "warnings": c.warnings, "notes": c.notes, "stderr": stderr,
           "cap": c.cap, "elapsed_s": round(time.time() - c.start, 1)}
    print(sanitize(json.dumps(out), c), flush=True)


if __name__ == "__main__":
    main()
