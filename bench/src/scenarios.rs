//! The scenarios: each runs its C client (or `/bin/true`) without and with the shim, in
//! interleaved rounds, and returns its samples. Every run gets its own directory (simulated
//! driver state and ledger), and every client reports the device memory it saw, so a run
//! where the shim was not in effect when asked for (or was when not) stops the benchmark.

use crate::plan::*;
use crate::setup::{Error, Setup};
use crate::statistics::Samples;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

/// CLOCK_MONOTONIC in nanoseconds, the clock the C clients use.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime(2) writes the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// "key value key value ..." from a client's output line.
pub fn fields(line: &str) -> impl Fn(&str) -> Result<u64, Error> + '_ {
    move |key: &str| {
        let mut words = line.split_whitespace();
        while let Some(word) = words.next() {
            if word == key {
                return words.next().and_then(|v| v.parse().ok()).ok_or_else(|| format!("bad value for {key} in {line:?}"));
            }
        }
        Err(format!("no {key} in client output {line:?}"))
    }
}

pub fn finish(child: Child, what: &str) -> Result<String, Error> {
    let out = child.wait_with_output().map_err(|e| format!("{what}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{what} failed ({}):\n{}{}", out.status, String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The shim must have been in effect exactly when asked for, or the comparison is void.
pub fn check_total(total: u64, shim: bool, what: &str) -> Result<(), Error> {
    let want = if shim { LIMIT_BYTES } else { SIM_MEMORY_BYTES };
    if total != want {
        return Err(format!(
            "{what} {} the shim saw a device of {total} bytes, expected {want}: the shim was {}in effect",
            if shim { "with" } else { "without" },
            if shim { "not " } else { "" }
        ));
    }
    Ok(())
}

/// ABBA order: round 0 = baseline first, round 1 = shim first, ...
pub fn order(round: usize) -> [bool; 2] {
    if round.is_multiple_of(2) {
        [false, true]
    } else {
        [true, false]
    }
}

/// The alloc/free pair, one process, alloc/free pairs for `plan.single_ms` a round:
/// nanoseconds of the thread's CPU time per pair (immune to being descheduled by other
/// work) and wall-clock nanoseconds per pair, without and with the shim, and
/// (`--pair-baseline`) with another build of fgpu in the same rounds.
pub fn single(setup: &Setup, plan: &Plan, baseline: Option<&Path>) -> Result<(Samples, Samples, Option<Samples>), Error> {
    let mut s = Samples::default();
    let mut wall = Samples::default();
    let mut base = Samples::default();
    for round in 0..plan.single_rounds {
        let mut sides: Vec<Option<&Path>> = order(round).iter().map(|&shim| shim.then_some(setup.front.as_path())).collect();
        if let Some(b) = baseline {
            sides.insert(round % 3, Some(b));
        }
        for preload in sides {
            let dir = setup.run_dir()?;
            let child = setup
                .command_preloading(&setup.alloc_pairs, &dir, preload)
                .args([ALLOC_SIZE.to_string(), plan.single_ms.to_string()])
                .spawn()
                .map_err(|e| format!("alloc_pairs: {e}"))?;
            let out = finish(child, "alloc_pairs")?;
            let f = fields(out.trim());
            check_total(f("total_mem")?, preload.is_some(), "alloc_pairs")?;
            let pairs = f("pairs")? as f64;
            let cpu = f("cpu_ns")? as f64 / pairs;
            if preload.is_some() && preload != Some(setup.front.as_path()) {
                base.with.push(cpu);
            } else {
                if preload.is_none() {
                    base.without.push(cpu);
                }
                s.push(preload.is_some(), cpu);
                wall.push(preload.is_some(), (f("end_ns")? - f("start_ns")?) as f64 / pairs);
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    Ok((s, wall, baseline.map(|_| base)))
}

/// One process, `threads` threads each allocating and freeing from the device's pool on a
/// stream of its own: total pairs per second (millions). With the shim, no lock of the
/// process may be held across the driver's allocation, or the threads take turns.
pub fn threads(setup: &Setup, plan: &Plan, threads: usize) -> Result<Samples, Error> {
    let mut s = Samples::default();
    for round in 0..plan.multi_rounds {
        for shim in order(round) {
            let dir = setup.run_dir()?;
            let child = setup
                .command(&setup.async_threads, &dir, shim)
                .args([threads.to_string(), ALLOC_SIZE.to_string(), plan.multi_ms.to_string()])
                .spawn()
                .map_err(|e| format!("async_threads: {e}"))?;
            let out = finish(child, "async_threads")?;
            let f = fields(out.trim());
            check_total(f("total_mem")?, shim, "async_threads")?;
            s.push(shim, f("pairs")? as f64 * 1e3 / (f("end_ns")? - f("start_ns")?) as f64);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    Ok(s)
}

/// What the 4-process scenario measured, without and with the shim.
pub struct Multi {
    /// Total pairs per second over the wall-clock window (millions).
    pub throughput: Samples,
    /// CPU nanoseconds per pair, all processes together: what a pair costs while the
    /// others run, whether or not they share the CPUs.
    pub cpu_per_pair: Samples,
}

/// `PROCESSES` clients sharing one simulated GPU (and, with the shim, one ledger), started
/// together: total pairs per second over the wall-clock window, and CPU time per pair.
pub fn multi(setup: &Setup, plan: &Plan) -> Result<Multi, Error> {
    let mut s = Samples::default();
    let mut cpu = Samples::default();
    for round in 0..plan.multi_rounds {
        for shim in order(round) {
            let dir = setup.run_dir()?;
            let mut children = Vec::new();
            for _ in 0..PROCESSES {
                let mut cmd = setup.command(&setup.alloc_pairs, &dir, shim);
                cmd.args([ALLOC_SIZE.to_string(), plan.multi_ms.to_string(), "sync".into()]).stdin(Stdio::piped());
                children.push(cmd.spawn().map_err(|e| format!("alloc_pairs: {e}"))?);
            }
            let mut readers = Vec::new();
            for child in children.iter_mut() {
                let mut reader = BufReader::new(child.stdout.take().expect("piped"));
                let mut line = String::new();
                reader.read_line(&mut line).map_err(|e| e.to_string())?;
                if line.trim() != "ready" {
                    let _ = child.kill();
                    let err = child.stderr.take().map(|mut e| {
                        let mut text = String::new();
                        let _ = std::io::Read::read_to_string(&mut e, &mut text);
                        text
                    });
                    return Err(format!("alloc_pairs (4 processes) did not get ready: {line}{}", err.unwrap_or_default()));
                }
                readers.push(reader);
            }
            // Everyone sleeps until the same instant, then runs for the same time.
            let start = monotonic_ns() + 20_000_000;
            for child in children.iter_mut() {
                let mut stdin = child.stdin.take().expect("piped");
                writeln!(stdin, "{start}").map_err(|e| e.to_string())?;
            }
            let (mut pairs, mut end, mut cpu_ns) = (0u64, start, 0u64);
            for (mut child, mut reader) in children.into_iter().zip(readers) {
                let mut line = String::new();
                reader.read_line(&mut line).map_err(|e| e.to_string())?;
                let status = child.wait().map_err(|e| e.to_string())?;
                if !status.success() {
                    let mut text = String::new();
                    if let Some(mut e) = child.stderr.take() {
                        let _ = std::io::Read::read_to_string(&mut e, &mut text);
                    }
                    return Err(format!("alloc_pairs (4 processes) failed ({status}): {text}"));
                }
                let f = fields(line.trim());
                check_total(f("total_mem")?, shim, "alloc_pairs")?;
                pairs += f("pairs")?;
                cpu_ns += f("cpu_ns")?;
                end = end.max(f("end_ns")?);
            }
            // Millions of pairs per second.
            s.push(shim, pairs as f64 * 1e3 / (end - start) as f64);
            cpu.push(shim, cpu_ns as f64 / pairs.max(1) as f64);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    Ok(Multi { throughput: s, cpu_per_pair: cpu })
}

/// `/bin/true` spawned and waited for: with no preload, with an empty library preloaded
/// (what any preload costs here), with the local build of the shim and with each shipped
/// build (and `FGPU_LIMIT` set, as in an image with the front in /etc/ld.so.preload). Every
/// round runs each once, in an order that rotates and reverses from round to round, so
/// every library takes every position equally often. Microseconds per start-up and minor
/// page faults of each process; also whether any of them created the ledger or a file.
pub struct Startup {
    /// Index 0: no preload, 1: the empty library, 2: the local build, 3..: `Setup::preloads`.
    pub names: Vec<(String, String)>,
    pub times: Vec<Vec<f64>>,
    /// User + system CPU time of the child, microseconds: not inflated by waiting for a CPU.
    pub cpu: Vec<Vec<f64>>,
    pub faults: Vec<Vec<f64>>,
    pub quiet: bool,
}

/// The order of the variants in round `round` of `n`: rotations, then the same reversed.
pub fn rotation(round: usize, n: usize) -> Vec<usize> {
    let k = round % n;
    let mut order: Vec<usize> = (0..n).map(|i| (i + k) % n).collect();
    if (round / n) % 2 == 1 {
        order.reverse();
    }
    order
}

/// One spawn of `/bin/true`, as wait4(2) saw it.
pub struct Spawned {
    /// Wall-clock microseconds from before the spawn to after the wait.
    pub wall_us: f64,
    /// The child's user + system CPU time, microseconds.
    pub cpu_us: f64,
    pub minor_faults: f64,
}

/// Spawns the command and waits for it with wait4(2).
pub fn spawn_timed(cmd: &mut Command) -> Result<Spawned, Error> {
    let t = Instant::now();
    let child = cmd.spawn().map_err(|e| format!("/bin/true: {e}"))?;
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: rusage is plain data; all zeroes is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: wait4(2) on our own child, writing into locals we own. `child` is not
        // waited for again (dropping a std Child neither waits nor kills).
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r == pid {
            break;
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(format!("wait4 /bin/true: {err}"));
        }
    }
    let us = t.elapsed().as_secs_f64() * 1e6;
    drop(child);
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        return Err(format!("/bin/true failed: wait status {status:#x}"));
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    Ok(Spawned { wall_us: us, cpu_us: tv(usage.ru_utime) + tv(usage.ru_stime), minor_faults: usage.ru_minflt as f64 })
}

pub fn startup(setup: &Setup, spawns: usize) -> Result<Startup, Error> {
    let dir = setup.run_dir()?;
    let truth = Path::new("/bin/true");
    let mut names =
        vec![("none".to_string(), "no preload".to_string()), ("empty".to_string(), "empty .so".to_string()), ("local".to_string(), "local build".to_string())];
    let mut libs: Vec<Option<&Path>> = vec![None, Some(&setup.empty_preload), Some(&setup.front)];
    for p in &setup.preloads {
        names.push((p.name.clone(), p.label.clone()));
        libs.push(Some(&p.path));
    }
    let mut commands: Vec<Command> = libs
        .iter()
        .map(|lib| {
            let mut cmd = setup.command(truth, &dir, false);
            cmd.env_remove("LD_LIBRARY_PATH").stdout(Stdio::null()).stderr(Stdio::null());
            if let Some(lib) = lib {
                cmd.env("LD_PRELOAD", lib);
            }
            cmd
        })
        .collect();
    // Warm the page cache and the loader's paths on every side first.
    for cmd in commands.iter_mut() {
        for _ in 0..10 {
            spawn_timed(cmd)?;
        }
    }
    let n = commands.len();
    let mut times = vec![Vec::with_capacity(spawns); n];
    let mut cpu = vec![Vec::with_capacity(spawns); n];
    let mut faults = vec![Vec::with_capacity(spawns); n];
    for i in 0..spawns {
        for variant in rotation(i, n) {
            let spawned = spawn_timed(&mut commands[variant])
                .map_err(|e| format!("{} ({}): {e}", names[variant].1, libs[variant].map(|p| p.display().to_string()).unwrap_or_default()))?;
            times[variant].push(spawned.wall_us);
            cpu[variant].push(spawned.cpu_us);
            faults[variant].push(spawned.minor_faults);
        }
    }
    let quiet = std::fs::read_dir(&dir).map(|d| d.count() == 0).unwrap_or(false);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Startup { names, times, cpu, faults, quiet })
}

/// First-call cost: the first cuDeviceTotalMem after cuInit (where the shim reads its
/// configuration, creates the ledger, joins it and registers the device), and the time
/// from spawning the process to the end of that call.
pub struct Init {
    pub first_us: Samples,
    pub later_ns: Samples,
    pub ready_us: Samples,
}

pub fn init(setup: &Setup, plan: &Plan) -> Result<Init, Error> {
    let mut r = Init { first_us: Samples::default(), later_ns: Samples::default(), ready_us: Samples::default() };
    for i in 0..plan.init_runs {
        for shim in order(i) {
            let dir = setup.run_dir()?;
            let mut cmd = setup.command(&setup.first_call, &dir, shim);
            let spawned = monotonic_ns();
            let child = cmd.arg(spawned.to_string()).spawn().map_err(|e| format!("first_call: {e}"))?;
            let out = finish(child, "first_call")?;
            let f = fields(out.trim());
            check_total(f("total_mem")?, shim, "first_call")?;
            r.first_us.push(shim, f("first_ns")? as f64 / 1e3);
            r.later_ns.push(shim, f("later_ns")? as f64);
            r.ready_us.push(shim, f("ready_ns")? as f64 / 1e3);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    Ok(r)
}

/// What the launch rows measured.
pub struct Launches {
    /// In one process with the shim and no compute share: the driver's own cuLaunchKernel
    /// (without) against the one the program gets, the shim's (with).
    pub plain: Samples,
    /// The same with FGPU_COMPUTE=50%, far above what the 1 ns kernels use.
    pub shared: Samples,
    /// The same pair in a process without the shim (both pointers are the driver's): what
    /// the method reads when there is nothing to find.
    pub control: Samples,
    /// Whole processes: no shim (without) against the shim with a share (with), all
    /// launches of each.
    pub processes: Samples,
    /// With `--launch-baseline`: `plain` and `shared` again, in processes that preload the
    /// baseline build instead, in the same rounds.
    pub baseline_plain: Option<Samples>,
    pub baseline_shared: Option<Samples>,
}

/// Kernel launches (`bench/clients/launches.c`): nanoseconds of the thread's CPU time per
/// launch. Three processes a round, their order rotating: no shim, the shim without a
/// compute share, the shim with one (five with `baseline`: the baseline build without and
/// with a share, in the same rotation). Each alternates bursts of launches through the
/// driver's own cuLaunchKernel and through the program's (the shim's), so the shim's cost
/// is read inside one process, paired burst by burst. The sides with a share run with
/// `FGPU_LOG=debug`, whose one line at its first launch proves the limiter was in effect.
pub fn launches(setup: &Setup, plan: &Plan, baseline: Option<&Path>) -> Result<Launches, Error> {
    let mut out = Launches {
        plain: Samples::default(),
        shared: Samples::default(),
        control: Samples::default(),
        processes: Samples::default(),
        baseline_plain: baseline.map(|_| Samples::default()),
        baseline_shared: baseline.map(|_| Samples::default()),
    };
    // Sides: 0 no shim, 1 the shim, 2 the shim with a share, 3 and 4 the same two with the
    // baseline build.
    let n_sides = if baseline.is_some() { 5 } else { 3 };
    for round in 0..plan.launch_rounds {
        let mut sides: Vec<usize> = (0..n_sides).collect();
        sides.rotate_left(round % n_sides);
        let mut whole = [0f64; 5];
        for side in sides {
            let dir = setup.run_dir()?;
            let preload = match side {
                0 => None,
                1 | 2 => Some(setup.front.as_path()),
                _ => baseline,
            };
            let shared = side == 2 || side == 4;
            let mut cmd = setup.command_preloading(&setup.launches, &dir, preload);
            cmd.args([plan.launch_warmup_ms.to_string(), plan.launch_ms.to_string()]);
            if shared {
                cmd.env("FGPU_COMPUTE", SHARE).env("FGPU_LOG", "debug");
            }
            let output = cmd.output().map_err(|e| format!("launches: {e}"))?;
            let stdout = String::from_utf8_lossy(&output.stdout);
            let stderr = String::from_utf8_lossy(&output.stderr);
            let which = if side >= 3 { " (--launch-baseline build)" } else { "" };
            if !output.status.success() {
                return Err(format!("launches{which} failed ({}):\n{stdout}{stderr}", output.status));
            }
            if shared && !stderr.contains(&format!("compute share {SHARE}")) {
                return Err(format!("launches{which} with FGPU_COMPUTE={SHARE}: the limiter did not say it was in effect:\n{stderr}"));
            }
            let f = fields(stdout.trim());
            check_total(f("total_mem")?, preload.is_some(), "launches")?;
            let n = f("launches")? as f64;
            let pair = match side {
                0 => &mut out.control,
                1 => &mut out.plain,
                2 => &mut out.shared,
                3 => out.baseline_plain.as_mut().expect("baseline"),
                _ => out.baseline_shared.as_mut().expect("baseline"),
            };
            pair.push(false, f("direct_cpu_ns")? as f64 / n);
            pair.push(true, f("hooked_cpu_ns")? as f64 / n);
            whole[side] = f("cpu_ns")? as f64 / (2.0 * n);
            let _ = std::fs::remove_dir_all(&dir);
        }
        out.processes.push(false, whole[0]);
        out.processes.push(true, whole[2]);
    }
    Ok(out)
}
