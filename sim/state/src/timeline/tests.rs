use super::*;
use crate::temp_state::{TempSim, TempState};
use crate::*;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

const MS: u64 = 1_000_000;

fn state(name: &str, timeslice_ns: u64) -> TempSim {
    TempState::new(&format!("timeline-{name}")).open_with(&SimConfig { timeslice_ns, ..SimConfig::default() })
}

/// The history of `dev` between `from` and `to` as (incarnation, start, end), merged runs.
fn runs(s: &SimState, dev: usize, from: u64, to: u64) -> Vec<(u32, u64, u64)> {
    s.with_timeline(dev, |e, st, _| {
        let mut v: Vec<(u32, u64, u64)> = Vec::new();
        s.intervals(e, st, from, to, |inc, a, b| match v.last_mut() {
            Some(l) if l.0 == inc && l.2 == a => l.2 = b,
            _ => v.push((inc, a, b)),
        });
        v
    })
}

#[test]
fn two_contexts_alternate_in_time_slices() {
    let s = state("alternate", 2 * MS);
    let slot = s.register().unwrap();
    let a = s.timeline_open(0, slot, 0xA).unwrap();
    let b = s.timeline_open(0, slot, 0xB).unwrap();
    let t0 = now_ns();
    for _ in 0..20 {
        s.timeline_submit(a, Work::Kernel(MS), |_, _| ()).unwrap();
        s.timeline_submit(b, Work::Kernel(MS), |_, _| ()).unwrap();
    }
    s.timeline_wait(a, 20).unwrap();
    s.timeline_wait(b, 20).unwrap();
    let t1 = now_ns();
    let w = s.device_busy(0, t0, t1);
    assert!(w.complete);
    let busy_a = w.contexts.iter().find(|c| c.context == 0xA).unwrap().busy_ns;
    let busy_b = w.contexts.iter().find(|c| c.context == 0xB).unwrap().busy_ns;
    assert_eq!((busy_a, busy_b), (20 * MS, 20 * MS), "{w:?}");
    assert_eq!(w.device_busy_ns, 40 * MS);
    // Turns of one slice (two 1 ms kernels), alternating, back to back.
    let r = runs(&s, 0, t0, t1);
    assert_eq!(r.len(), 20, "{r:?}");
    for (k, run) in r.iter().enumerate() {
        assert_eq!(run.2 - run.1, 2 * MS, "{r:?}");
        if k > 0 {
            assert_ne!(run.0, r[k - 1].0, "turns alternate: {r:?}");
            assert_eq!(run.1, r[k - 1].2, "no gap while both have work: {r:?}");
        }
    }
    assert!(w.contexts.iter().all(|c| c.pid == std::process::id()));
}

#[test]
fn a_kernel_is_never_cut_and_a_lone_context_keeps_the_device() {
    let s = state("long", 2 * MS);
    let slot = s.register().unwrap();
    let a = s.timeline_open(0, slot, 1).unwrap();
    let b = s.timeline_open(0, slot, 2).unwrap();
    let t0 = now_ns();
    s.timeline_submit(a, Work::Kernel(7 * MS), |_, _| ()).unwrap();
    s.timeline_submit(a, Work::Kernel(MS), |_, _| ()).unwrap();
    s.timeline_submit(b, Work::Kernel(MS), |_, _| ()).unwrap();
    s.timeline_wait(a, 2).unwrap();
    s.timeline_wait(b, 1).unwrap();
    let r = runs(&s, 0, t0, now_ns());
    // a's 7 ms kernel runs whole; then b gets its turn before a's second kernel.
    assert_eq!(r.iter().map(|x| x.2 - x.1).collect::<Vec<_>>(), vec![7 * MS, MS, MS], "{r:?}");
    assert_eq!(r[0].0, a.incarnation);
    assert_eq!(r[1].0, b.incarnation);
}

#[test]
fn markers_complete_with_the_work_before_them() {
    let s = state("markers", 2 * MS);
    let slot = s.register().unwrap();
    let c = s.timeline_open(0, slot, 1).unwrap();
    let before = now_ns();
    let m0 = s.timeline_submit(c, Work::Marker, |_, _| ()).unwrap();
    let k = s.timeline_submit(c, Work::Kernel(5 * MS), |_, _| ()).unwrap();
    let m1 = s.timeline_submit(c, Work::Marker, |_, _| ()).unwrap();
    s.timeline_wait(c, m1).unwrap();
    let e0 = s.timeline_end(c, m0).unwrap().unwrap();
    let ek = s.timeline_end(c, k).unwrap().unwrap();
    let e1 = s.timeline_end(c, m1).unwrap().unwrap();
    assert!(e0 >= before && e0 <= ek - 5 * MS, "a marker on an idle context ends when it is submitted");
    assert_eq!(e1, ek, "a marker ends with the kernel before it");
    assert!(now_ns() >= ek);
}

#[test]
fn a_full_queue_blocks_the_submitter() {
    let s = state("full", 2 * MS);
    let slot = s.register().unwrap();
    let c = s.timeline_open(0, slot, 1).unwrap();
    let t0 = now_ns();
    for _ in 0..QUEUE_DEPTH {
        s.timeline_submit(c, Work::Kernel(20_000), |_, _| ()).unwrap();
    }
    // The queue is full: the next submission waits for the oldest kernel (20 us after the
    // device started it).
    let r = s.timeline_submit(c, Work::Kernel(20_000), |_, _| ()).unwrap();
    assert_eq!(r, QUEUE_DEPTH + 1);
    let done = s.timeline_completed(c).unwrap();
    assert!(done >= 1, "the submission returned only once an item had completed");
    assert!(now_ns() >= t0 + 20_000);
    assert!(s.timeline_submitted(c) - done <= QUEUE_DEPTH);
    s.timeline_close(c);
    assert_eq!(s.timeline_completed(c), Err(TimelineError::Gone));
}

/// Run in a child process by `dead_process_work_is_dropped`.
#[test]
fn timeline_child_helper() {
    let Ok(path) = std::env::var("FGPU_SIM_TIMELINE_CHILD") else { return };
    let s = SimState::open(&path).unwrap();
    let slot = s.register().unwrap();
    let c = s.timeline_open(0, slot, 7).unwrap();
    for _ in 0..500 {
        s.timeline_submit(c, Work::Kernel(10 * MS), |_, _| ()).unwrap();
    }
    println!("READY");
    std::thread::sleep(std::time::Duration::from_secs(60));
}

#[test]
fn dead_process_work_is_dropped() {
    let s = state("dead", 2 * MS);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "timeline::tests::timeline_child_helper", "--nocapture", "--test-threads=1"])
        .env("FGPU_SIM_TIMELINE_CHILD", s.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut rd = BufReader::new(child.stdout.take().unwrap());
    while !line.contains("READY") {
        line.clear();
        assert!(rd.read_line(&mut line).unwrap() > 0, "child exited early");
    }
    let slot = s.register().unwrap();
    let mine = s.timeline_open(0, slot, 1).unwrap();
    for _ in 0..10 {
        s.timeline_submit(mine, Work::Kernel(MS), |_, _| ()).unwrap();
    }
    std::thread::sleep(std::time::Duration::from_millis(30));
    let w = s.device_busy(0, 0, u64::MAX);
    assert!(w.busy_of_pid(child.id()) > 0, "the child ran: {w:?}");
    child.kill().unwrap();
    child.wait().unwrap();
    let killed = now_ns();
    // 5 s of the child's work were queued; it is dropped, so ours finishes at once.
    s.timeline_wait(mine, 10).unwrap();
    let waited = now_ns() - killed;
    assert!(waited < 2_000_000_000, "waited {waited} ns behind a dead process's queue");
    std::thread::sleep(std::time::Duration::from_millis(20));
    let after = s.device_busy(0, killed + MS, now_ns());
    assert_eq!(after.busy_of_pid(child.id()), 0, "{after:?}");
    // Its record is free again.
    for k in 0..MAX_TIMELINE_CONTEXTS - 1 {
        s.timeline_open(0, slot, 100 + k as u64).unwrap();
    }
    assert_eq!(s.timeline_open(0, slot, 999), Err(TimelineError::Full));
}

#[test]
fn utilisation_periods_follow_the_timeline() {
    let s = state("periods", 2 * MS);
    let slot = s.register().unwrap();
    let c = s.timeline_open(0, slot, 1).unwrap();
    let start = now_ns();
    // Half of every 4 ms busy, for a bit more than two sample periods.
    let until = (start / SAMPLE_PERIOD_NS + 3) * SAMPLE_PERIOD_NS;
    while now_ns() < until {
        let seq = s.timeline_submit(c, Work::Kernel(2 * MS), |_, _| ()).unwrap();
        s.timeline_wait(c, seq).unwrap();
        sleep_until(now_ns() + 2 * MS);
    }
    let periods = s.utilisation_periods(0, 0);
    let full: Vec<&UtilisationPeriod> = periods.iter().filter(|p| p.end_ns > start + SAMPLE_PERIOD_NS && p.end_ns <= until).collect();
    assert!(!full.is_empty(), "{periods:?}");
    for p in &full {
        let pct = p.percent(p.device_busy_ns);
        // Sleeps on a loaded machine only ever lower the share.
        assert!((10..=55).contains(&pct), "{pct}% in {p:?}");
        assert_eq!(p.processes.len(), 1);
        assert_eq!(p.processes[0].1, p.device_busy_ns);
        let expected = if own_host_pid() != 0 { own_host_pid() } else { std::process::id() };
        assert_eq!(p.processes[0].0, expected, "NVML names the process by its host pid");
    }
    let last = periods.last().unwrap();
    assert!(s.utilisation_periods(0, last.timestamp_us).is_empty() || now_ns() >= last.end_ns + SAMPLE_PERIOD_NS);
    let real_us = clock_ns(libc::CLOCK_REALTIME) / 1000;
    assert!(last.timestamp_us <= real_us && last.timestamp_us + 1_000_000 > real_us, "CPU timestamps in microseconds");
}

#[test]
fn a_longer_sample_period_is_what_nvml_reports_over() {
    // NVML documents 1/6 s to 1 s depending on the product; `FGPU_SIM_SAMPLE_PERIOD` picks.
    let half = 500 * MS;
    let s = TempState::new("timeline-period").open_with(&SimConfig { sample_period_ns: half, ..SimConfig::default() });
    assert_eq!(s.sample_period_ns(), half);
    let slot = s.register().unwrap();
    let c = s.timeline_open(0, slot, 1).unwrap();
    // One 100 ms kernel inside the next whole period.
    sleep_until((now_ns() / half + 1) * half + 10 * MS);
    let seq = s.timeline_submit(c, Work::Kernel(100 * MS), |_, _| ()).unwrap();
    s.timeline_wait(c, seq).unwrap();
    sleep_until((now_ns() / half + 1) * half + MS);
    let periods = s.utilisation_periods(0, 0);
    let last = periods.last().expect("a completed period");
    assert_eq!(last.period_ns, half);
    assert_eq!(last.end_ns % half, 0, "periods are aligned on the period");
    assert_eq!(last.percent(last.device_busy_ns), 20, "100 ms of 500 ms: {last:?}");
}

#[test]
fn late_delivery_tells_a_process_late_and_in_bursts() {
    let d = Delivery::new(10 * MS, 3 * MS).unwrap();
    assert_eq!(Delivery::new(0, 5), None, "0: at once");
    // Instants at 3, 13, 23 ms...; each tells what happened up to 10 ms before it.
    assert_eq!(d.seen_until(25 * MS), 13 * MS);
    assert_eq!(d.seen_until(23 * MS), 13 * MS);
    assert_eq!(d.seen_until(22 * MS), 3 * MS);
    // Something at 4 ms reaches it at 23 ms (instant 13 + 10), one at 13 ms at 23 ms too:
    // late, and together with the rest of the stretch.
    assert_eq!(d.delivered_at(4 * MS), 23 * MS);
    assert_eq!(d.delivered_at(13 * MS), 23 * MS);
    assert_eq!(d.delivered_at(13 * MS + 1), 33 * MS);
    assert_eq!(d.delivered_at(0), 13 * MS);
    // The two agree: what happened at t is seen from delivered_at(t) on, never before.
    for t in (1..100 * MS).step_by(MS as usize / 3) {
        let at = d.delivered_at(t);
        assert!(d.seen_until(at) >= t && d.seen_until(at - 1) < t, "t={t} delivered at {at}");
        assert!(at >= t + 10 * MS && at < t + 20 * MS, "between one and two intervals late: t={t} at {at}");
    }
    // The variable: a duration, off when 0 or empty, refused otherwise.
    assert_eq!(Delivery::parse("", 7), Ok(None));
    assert_eq!(Delivery::parse("0", 7), Ok(None));
    assert_eq!(Delivery::parse("50ms", 7).unwrap().unwrap().every_ns, 50 * MS);
    assert!(Delivery::parse("50", 7).is_err());
    assert!(Delivery::parse("11s", 7).is_err());
    let phases: std::collections::HashSet<u64> = (1000..1010).map(|pid| Delivery::parse("50ms", pid).unwrap().unwrap().phase_ns).collect();
    assert!(phases.len() > 5, "processes are not told in step: {phases:?}");
}

#[test]
fn late_delivery_holds_back_nvmls_newest_periods() {
    let s = state("late-periods", 2 * MS);
    let slot = s.register().unwrap();
    let c = s.timeline_open(0, slot, 1).unwrap();
    let seq = s.timeline_submit(c, Work::Kernel(MS), |_, _| ()).unwrap();
    s.timeline_wait(c, seq).unwrap();
    // Just after a period ends: seen at once by a process told at once, not by one told
    // 100-200 ms late.
    sleep_until((now_ns() / SAMPLE_PERIOD_NS + 1) * SAMPLE_PERIOD_NS + MS);
    let now = now_ns();
    let newest = s.utilisation_periods_as_seen(0, 0, None).last().map(|p| p.end_ns).unwrap();
    let late = Delivery::new(100 * MS, 0).unwrap();
    let seen = s.utilisation_periods_as_seen(0, 0, Some(late)).last().map_or(0, |p| p.end_ns);
    assert!(newest + SAMPLE_PERIOD_NS > now, "{newest} {now}");
    assert!(seen < newest && seen <= late.seen_until(now_ns()), "{seen} {newest}");
}

#[test]
fn what_each_process_submitted_is_counted() {
    let s = state("submitted", 2 * MS);
    let slot = s.register().unwrap();
    let c = s.timeline_open(0, slot, 1).unwrap();
    for _ in 0..3 {
        s.timeline_submit(c, Work::Kernel(10_000), |_, _| ()).unwrap();
    }
    s.timeline_submit(c, Work::Marker, |_, _| ()).unwrap();
    let mine = s.items_submitted(0, std::process::id());
    assert_eq!(mine, Submitted { kernels: 3, markers: 1 });
    assert_eq!(s.items_submitted(0, std::process::id().wrapping_add(1)), Submitted::default());
}
