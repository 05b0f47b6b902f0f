"""Bookkeeping for tests/gpu/run.sh (runs unhooked, needs only the standard library).

    report.py env --lib L --bin B --cap C --out env.json
        machine, driver, CUDA and framework versions; the idle GPU memory
    report.py record NAME STATUS REASON --results R
        append a result that run.sh made itself (prerequisites, budget)
    report.py verdict NAME --stdout F --stderr F --rc RC --limit S --results R
        read check.py's JSON line, append it to R, print PASS/FAIL/SKIP
    report.py write --env env.json --results R --summary "N passed, M failed" --out FILE...
        the markdown report
"""

import argparse
import datetime
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DISTS = ("torch", "jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt", "jax-cuda12-plugin",
         "jax-cuda12-pjrt", "cuda-bindings", "cuda-python", "cuda-core", "nvidia-ml-py", "pynvml",
         "numpy", "triton")


def plain_env():
    return {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("FGPU_")}


def run(argv, timeout=30):
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=plain_env())
        return r.returncode, r.stdout, r.stderr
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, "", str(e)


def show_path(path):
    """A path as the report may show it: relative to the repository, else its name."""
    path = os.path.abspath(path)
    if path.startswith(REPO + os.sep):
        return os.path.relpath(path, REPO)
    return os.path.basename(path)


def file_info(path):
    if not path or not os.path.isfile(path):
        return None
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return {"path": show_path(path), "bytes": os.path.getsize(path), "sha256": h.hexdigest()}


def cmd_env(a):
    env = {"date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
           "python": platform.python_version(), "kernel": platform.release(),
           "glibc": " ".join(platform.libc_ver()), "cap": a.cap}
    try:
        with open("/etc/os-release") as f:
            m = re.search(r'^PRETTY_NAME="?([^"\n]*)', f.read(), re.M)
            env["os"] = m.group(1) if m else None
    except OSError:
        env["os"] = None
    smi = shutil.which("nvidia-smi")
    env["nvidia_smi"] = bool(smi)
    if smi:
        rc, out, err = run([smi, "--query-gpu=index,name,driver_version,memory.total,memory.used,persistence_mode,uuid",
                            "--format=csv,noheader,nounits"])
        if rc == 0 and out.strip():
            gpus = []
            for line in out.strip().splitlines():
                p = [x.strip() for x in line.split(",")]
                if len(p) >= 7:
                    gpus.append({"index": p[0], "name": p[1], "driver": p[2], "total_mib": p[3],
                                 "used_mib": p[4], "persistence": p[5], "uuid_prefix": p[6][:12]})
            env["gpus"] = gpus
        else:
            env["gpu_error"] = (err or out).strip()[-300:]
        rc, out, _ = run([smi])
        m = re.search(r"CUDA Version:\s*([0-9.]+)", out or "")
        env["cuda_driver_version"] = m.group(1) if m else None
    versions = {}
    cupy = []
    for d in importlib.metadata.distributions():
        name = (d.metadata.get("Name") or "").lower().replace("_", "-")
        if name in DISTS:
            versions[name] = d.version
        elif name.startswith("cupy"):
            cupy.append("%s %s" % (name, d.version))
    if cupy:
        versions["cupy"] = ", ".join(sorted(set(cupy)))
    env["versions"] = versions
    env["lib"] = file_info(a.lib)
    env["bin"] = file_info(a.bin)
    if env["bin"]:
        rc, out, err = run([a.bin, "--version"], timeout=10)
        env["bin_version"] = (out or err).strip().splitlines()[0][:120] if (out or err).strip() else None
    if os.path.isdir(os.path.join(REPO, ".git")) and shutil.which("git"):
        rc, out, _ = run(["git", "-C", REPO, "rev-parse", "--short=12", "HEAD"], timeout=10)
        env["commit"] = out.strip() if rc == 0 else None
        rc, out, _ = run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"], timeout=10)
        env["tree_dirty"] = bool(out.strip()) if rc == 0 else None
    idle = None
    try:  # in the units of the monitor that check.py uses
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from gpulib import Monitor
        mon = Monitor()
        idle = mon.device()["used"]
        env["monitor"] = mon.source
    except Exception as e:  # noqa: BLE001
        env["monitor_error"] = str(e)[:200]
    try:
        g = env.get("gpus") or []
        idx = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
        idx = idx if idx.isdigit() else "0"
        for gpu in g:
            if gpu["index"] == idx and idle is None:
                idle = float(gpu["used_mib"])
    except (ValueError, KeyError):
        idle = None
    env["idle_used_mib"] = idle
    with open(a.out, "w") as f:
        json.dump(env, f, indent=1)
    if a.print_idle:
        print("" if idle is None else "%.0f" % idle)


def append(results, obj):
    with open(results, "a") as f:
        f.write(json.dumps(obj) + "\n")


def line_for(obj):
    word = {"pass": "PASS", "fail": "FAIL", "skip": "SKIP"}[obj["status"]]
    if obj["status"] == "pass":
        return "PASS %s" % obj["check"]
    return "%s %s: %s" % (word, obj["check"], obj.get("reason") or "no reason given")


def cmd_record(a):
    obj = {"check": a.name, "status": a.status, "reason": a.reason, "criteria": [], "figures": {},
           "warnings": [], "notes": [], "stderr": {}}
    append(a.results, obj)
    print(line_for(obj))


def tail(path, n=5):
    try:
        with open(path, errors="replace") as f:
            lines = [l.rstrip() for l in f if l.strip()]
        return " | ".join(lines[-n:])[-600:]
    except OSError:
        return ""


def cmd_verdict(a):
    obj = None
    try:
        with open(a.stdout, errors="replace") as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        cand = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(cand, dict) and cand.get("check") == a.name and cand.get("status") in ("pass", "fail", "skip"):
                        obj = cand
    except OSError:
        pass
    if obj is None:
        if a.rc in (124, 137):
            reason = "timed out after %s s" % a.limit
        else:
            reason = "check.py exited %d without a result" % a.rc
        err = tail(a.stderr)
        obj = {"check": a.name, "status": "fail", "reason": reason + (": " + err if err else ""),
               "criteria": [], "figures": {}, "warnings": [], "notes": [], "stderr": {}}
    obj["rc"] = a.rc
    obj["limit_s"] = a.limit
    append(a.results, obj)
    print(line_for(obj))


# --------------------------------------------------------------------------------
def sanitize(text):
    """No absolute paths of the machine that ran it in the report."""
    text = re.sub(r"[^\s'\"`|(]*/fgpu-gpu\.[A-Za-z0-9]{6}", "<work>", text)
    text = text.replace(REPO + os.sep, "").replace(REPO, ".")
    home = os.path.expanduser("~")
    if len(home) > 1:
        text = text.replace(home + os.sep, "~/")
    return text


def cell(x):
    if isinstance(x, float):
        x = ("%.4f" % x) if abs(x) < 10 else ("%.1f" % x)
    elif isinstance(x, (list, dict)):
        x = json.dumps(x)
    elif x is None:
        x = "-"
    return str(x).replace("|", "\\|").replace("\n", " ")


def cmd_write(a):
    try:
        with open(a.env) as f:
            env = json.load(f)
    except (OSError, ValueError):
        env = {}
    results = []
    try:
        with open(a.results) as f:
            results = [json.loads(l) for l in f if l.strip()]
    except (OSError, ValueError):
        pass
    v = env.get("versions", {})
    gpus = env.get("gpus") or [{}]
    g = gpus[0]
    L = []
    w = L.append
    w("# GPU validation")
    w("")
    w("Written by `tests/gpu/run.sh` on a real GPU (see `tests/gpu/README.md`). Ground truth is")
    w("NVML read by an unhooked monitor process while each workload holds its memory, never the")
    w("shim's own figures.")
    w("")
    w("**Result: %s** (%s)" % (a.summary, env.get("date_utc", "date unknown")))
    w("")
    w("## Machine and software")
    w("")
    w("| item | value |")
    w("|---|---|")
    rows = [
        ("date", env.get("date_utc")),
        ("GPU", "%s (%s MiB)" % (g.get("name"), g.get("total_mib")) if g else None),
        ("GPUs on the machine", len(env.get("gpus") or [])),
        ("driver", g.get("driver")),
        ("CUDA (driver)", env.get("cuda_driver_version")),
        ("persistence mode", g.get("persistence")),
        ("idle memory used", "%s MiB (%s)" % (env.get("idle_used_mib"), env.get("monitor", "nvidia-smi"))),
        ("OS / kernel / glibc", "%s / %s / %s" % (env.get("os"), env.get("kernel"), env.get("glibc"))),
        ("Python", env.get("python")),
    ]
    for k in ("torch", "jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt", "jax-cuda12-plugin",
              "cupy", "cuda-bindings", "cuda-python", "nvidia-ml-py", "numpy"):
        if k in v:
            rows.append((k, v[k]))
    for r in results:  # versions the workloads reported themselves
        f = r.get("figures", {})
        if r.get("check") == "torch-default" and f.get("torch_cuda"):
            rows.append(("torch CUDA runtime", f["torch_cuda"]))
        if r.get("check") == "cupy" and f.get("cuda_runtime"):
            rows.append(("CuPy CUDA runtime", f["cuda_runtime"]))
    lib = env.get("lib") or {}
    rows += [
        ("libfgpu.so", "%s, %s bytes, sha256 %s" % (lib.get("path"), lib.get("bytes"), lib.get("sha256")) if lib else "missing"),
        ("fgpu binary", env.get("bin_version") or ("present" if env.get("bin") else "not carried")),
        ("tree commit", "%s%s" % (env.get("commit"), " (uncommitted changes)" if env.get("tree_dirty") else "")),
        ("cap", env.get("cap")),
    ]
    for k, val in rows:
        w("| %s | %s |" % (cell(k), cell(val)))
    w("")
    w("## Checks")
    w("")
    w("| check | result | seconds | detail |")
    w("|---|---|---|---|")
    for r in results:
        secs = r.get("elapsed_s")
        w("| %s | %s | %s | %s |" % (cell(r["check"]), r["status"].upper(), "-" if secs is None else "%.1f" % secs,
                                     cell((r.get("reason") or "")[:400])))
    w("")
    w("## Details")
    for r in results:
        w("")
        w("### %s: %s" % (r["check"], r["status"].upper()))
        w("")
        if r.get("reason"):
            w(cell(r["reason"]))
            w("")
        if r.get("criteria"):
            w("| criterion | ok | detail |")
            w("|---|---|---|")
            for c in r["criteria"]:
                w("| %s | %s | %s |" % (cell(c["name"]), "yes" if c["ok"] else "**NO**", cell(c.get("detail"))))
            w("")
        if r.get("figures"):
            w("| figure | value |")
            w("|---|---|")
            for k, val in r["figures"].items():
                w("| %s | %s |" % (cell(k), cell(val)))
            w("")
        for k in ("warnings", "notes"):
            for x in r.get(k) or []:
                w("- %s: %s" % (k[:-1], cell(x)))
        for label, t in (r.get("stderr") or {}).items():
            w("- stderr of %s: `%s`" % (cell(label), t.replace("`", "'")))
    w("")
    text = sanitize("\n".join(L) + "\n")
    for path in a.out:
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)
        with open(path, "w") as f:
            f.write(text)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("env")
    p.add_argument("--lib", default="")
    p.add_argument("--bin", default="")
    p.add_argument("--cap", default="8G")
    p.add_argument("--out", required=True)
    p.add_argument("--print-idle", action="store_true")
    p = sub.add_parser("record")
    p.add_argument("name")
    p.add_argument("status", choices=("pass", "fail", "skip"))
    p.add_argument("reason")
    p.add_argument("--results", required=True)
    p = sub.add_parser("verdict")
    p.add_argument("name")
    p.add_argument("--stdout", required=True)
    p.add_argument("--stderr", required=True)
    p.add_argument("--rc", type=int, required=True)
    p.add_argument("--limit", required=True)
    p.add_argument("--results", required=True)
    p = sub.add_parser("write")
    p.add_argument("--env", required=True)
    p.add_argument("--results", required=True)
    p.add_argument("--summary", required=True)
    p.add_argument("--out", action="append", required=True)
    a = ap.parse_args()
    {"env": cmd_env, "record": cmd_record, "verdict": cmd_verdict, "write": cmd_write}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
