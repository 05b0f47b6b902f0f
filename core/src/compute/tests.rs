use super::*;

#[test]
fn shares_parse_as_percentages_only() {
    let spec = parse_share("30%").unwrap();
    assert_eq!(spec.share_for("GPU-1"), Some(300_000));
    let spec = parse_share("GPU-1a2b=12.5%, *=50%").unwrap();
    assert_eq!(spec.share_for("GPU-1a2b3c"), Some(125_000));
    assert_eq!(spec.share_for("GPU-ffff"), Some(500_000));
    assert_eq!(parse_share("MIG-77=20%").unwrap().share_for("MIG-7700"), Some(200_000));
    assert_eq!(parse_share("GPU-77=20%").unwrap().share_for("GPU-8800"), None);
    assert_eq!(parse_share("8G"), Err(LimitError::NotPercent("8G".into())));
    assert_eq!(parse_share("GPU-1=30%,*=4G"), Err(LimitError::NotPercent("GPU-1=30%,*=4G".into())));
    assert!(matches!(parse_share("0%"), Err(LimitError::BadPercent(_))));
    assert!(matches!(parse_share("101%"), Err(LimitError::BadPercent(_))));
    assert!(matches!(parse_share(""), Err(LimitError::Empty)));
    assert!(matches!(parse_share("lots"), Err(LimitError::Malformed(_))));
    assert_eq!(format_share(300_000), "30%");
    assert_eq!(format_share(125_000), "12.5%");
    assert_eq!(format_share(1), "0.0001%");
}

#[test]
fn the_bucket_admits_the_share_over_time_and_keeps_at_most_its_burst() {
    let c = 250_000; // 25 %
                     // Long idle: the clock is brought to 200 ms behind, so 50 ms of GPU time is held.
    assert_eq!(tokens(0, 10_000_000_000, c), 50_000_000);
    // Charging 5 ms at 25 % moves the clock 20 ms.
    let v = charge(0, 10_000_000_000, 5_000_000, c);
    assert_eq!(v, 10_000_000_000 - 200_000_000 + 20_000_000);
    // A refund gives it back, never beyond the burst.
    assert_eq!(charge(v, 10_000_000_000, -5_000_000, c), 10_000_000_000 - 200_000_000);
    assert_eq!(charge(v, 10_000_000_000, -500_000_000, c), 10_000_000_000 - 200_000_000);
    // What did not fit is kept: 20 ms of wall fit (5 ms of GPU time), 495 ms did not.
    assert_eq!(charge_keeping_rest(v, 10_000_000_000, -500_000_000, c), (10_000_000_000 - 200_000_000, 495_000_000));
    // Saturating: what is admitted over 10 s is the share of 10 s plus the burst.
    let (mut v, mut now, mut admitted) = (0u64, 1_000_000_000u64, 0u64);
    let end = now + 10_000_000_000;
    while now < end {
        let threshold = admit_threshold(c);
        if tokens(v, now, c) >= threshold {
            v = charge(v, now, CHUNK_GPU_NS as i64, c);
            admitted += CHUNK_GPU_NS;
        } else {
            now = admit_at(v, threshold, c).max(now + 1);
        }
    }
    let expected = 10_000_000_000 / 4 + 50_000_000;
    assert!(admitted.abs_diff(expected) <= CHUNK_GPU_NS, "{admitted} vs {expected}");
}

#[test]
fn a_chunk_is_admitted_only_while_the_bucket_holds_a_chunks_worth() {
    let c = 500_000; // 50 %: a chunk's worth (5 ms) is 10 ms of wall time
    let now = 10_000_000_000;
    let threshold = admit_threshold(c);
    // 10 ms behind now: exactly a chunk's worth; charged, the clock reaches now.
    assert_eq!(admit(now - 10_000_000, now, 5_000_000, c, threshold), Some(now));
    // A nanosecond short of it: nothing admitted, nothing charged.
    assert_eq!(admit(now - 10_000_000 + 1, now, 5_000_000, c, threshold), None);
    // A full bucket admits, from 200 ms behind.
    assert_eq!(admit(0, now, 5_000_000, c, threshold), Some(now - BURST_WALL_NS + 10_000_000));
    // Overdrawn: ahead of now. Charging a chunk's worth from a full enough bucket never
    // gets there; a long kernel charged whole does.
    assert!(!overdrawn(now, now));
    assert!(overdrawn(now + 1, now));
    assert!(overdrawn(admit(now - 10_000_000, now, 50_000_000, c, threshold).unwrap(), now));
}

#[test]
fn chunks_and_the_inflight_bound() {
    assert_eq!(chunk_launches(0, 1_000_000_000), 1, "unknown cost: one launch, measured");
    assert_eq!(chunk_launches(50_000, 50_000_000), 100, "5 ms of 50 us kernels");
    assert_eq!(chunk_launches(50_000, 1_000_000), 20, "only what the bucket holds");
    assert_eq!(chunk_launches(100_000_000, 50_000_000), 1, "a long kernel is a chunk");
    assert_eq!(chunk_launches(10, 50_000_000), MAX_CHUNK_LAUNCHES);
    assert!(inflight_allows(0, 500_000_000));
    assert!(inflight_allows(30_000_000, 10_000_000));
    assert!(!inflight_allows(30_000_000, 10_000_001));
    assert_eq!(admit_threshold(300_000), CHUNK_GPU_NS);
    assert_eq!(admit_threshold(10_000), 2_000_000, "1 %: the bucket holds 2 ms");
}

#[test]
fn the_cost_estimate_is_a_median() {
    let mut e = CostEstimate::default();
    assert_eq!(e.get(), 0);
    e.add(1_000_000, 10);
    assert_eq!(e.get(), 100_000);
    for _ in 0..4 {
        e.add(1_000_000, 10);
    }
    e.add(50_000_000, 10); // a chunk that waited
    e.add(50_000_000, 10);
    assert_eq!(e.get(), 100_000);
    e.add(5, 0);
    assert_eq!(e.get(), 100_000, "a chunk of no launch says nothing");
}

fn s(pid: u32, timestamp_us: u64, sm_util: u32) -> Sample {
    Sample { pid, timestamp_us, sm_util }
}

/// NVML as nvml.h describes `nvmlDeviceGetProcessUtilization`, written from its text and
/// not from the book: the driver keeps one internal sample per period (periods end on a
/// grid), and an answer for `lastSeenTimeStamp` L holds, per process that ran since, one
/// sample: its percent of all the completed periods whose timestamps are after L
/// (rounded), stamped with the end of the newest period it ran in.
struct Nvml {
    period: u64,
    /// Where the grid of period ends lies: ends are `phase + k * period`.
    phase: u64,
    /// (pid, period index, busy µs in that period).
    busy: Vec<(u32, u64, u64)>,
}

impl Nvml {
    fn end(&self, k: u64) -> u64 {
        self.phase + (k + 1) * self.period
    }

    /// The answer at time `now` for samples after `after`.
    fn answer(&self, after: u64, now: u64) -> Vec<Sample> {
        let periods: Vec<u64> = (0..).take_while(|k| self.end(*k) <= now).filter(|k| self.end(*k) > after).collect();
        let window = periods.len() as u64 * self.period;
        let mut pids: Vec<u32> = self.busy.iter().map(|b| b.0).collect();
        pids.sort_unstable();
        pids.dedup();
        pids.into_iter()
            .filter_map(|pid| {
                let mine: Vec<&(u32, u64, u64)> = self.busy.iter().filter(|b| b.0 == pid && periods.contains(&b.1) && b.2 > 0).collect();
                let newest = mine.iter().map(|b| b.1).max()?;
                let busy: u64 = mine.iter().map(|b| b.2).sum();
                Some(s(pid, self.end(newest), ((busy * 100 + window / 2) / window) as u32))
            })
            .collect()
    }

    fn busy_of(&self, pid: u32, upto: u64) -> u64 {
        self.busy.iter().filter(|b| b.0 == pid && self.end(b.1) <= upto).map(|b| b.2).sum()
    }
}

/// Reads `nvml` for pid 7 at the times `reads` (µs); returns what the book counted (ns)
/// and what counting every sample as a percent of one period would have (the old reading).
fn read(nvml: &Nvml, start: u64, reads: &[u64]) -> (i64, u64, UtilisationBook) {
    let mut book = UtilisationBook::new(start);
    let (mut counted, mut per_period) = (0i64, 0u64);
    for &now in reads {
        let samples = nvml.answer(book.ask_after(), now);
        per_period += samples.iter().filter(|x| x.pid == 7).map(|x| x.sm_util as u64 * nvml.period * 10).sum::<u64>();
        counted += book.ingest(&samples, &[7], now);
    }
    (counted, per_period, book)
}

#[test]
fn an_answer_is_a_percent_of_its_whole_window_however_late_it_is_read() {
    let p = 166_667;
    // Process 7 runs 30 % of every period, its neighbour 9 half of them; 60 periods.
    let mut busy: Vec<(u32, u64, u64)> = (0..60).map(|k| (7, k, 50_000)).collect();
    busy.extend((0..60).map(|k| (9, k, if k % 2 == 0 { 80_000 } else { 0 })));
    let nvml = Nvml { period: p, phase: 1_700_000_000_000_000, busy };
    let start = nvml.end(0) - p;
    let truth = nvml.busy_of(7, nvml.end(59)) as i64 * 1000;
    // On time (10 ms after each period), two periods late, and at irregular times up to
    // seven periods apart, as a starved sampler thread reads.
    let on_time: Vec<u64> = (0..60).map(|k| nvml.end(k) + 10_000).collect();
    let late: Vec<u64> = (0..30).map(|k| nvml.end(2 * k + 1) + 10_000).collect();
    let mut irregular = Vec::new();
    let (mut k, mut step) = (0u64, 1u64);
    while k < 59 {
        k = (k + step).min(59);
        irregular.push(nvml.end(k) + 10_000);
        step = step % 7 + 2;
    }
    for (name, reads) in [("on time", &on_time), ("two periods late", &late), ("irregular", &irregular)] {
        let (counted, per_period, book) = read(&nvml, start, reads);
        let error = (counted - truth).abs() as f64 / truth as f64;
        // Each answer's percent is rounded: at most half a point of its window.
        assert!(error < 0.02, "{name}: counted {counted} ns of {truth} ns");
        assert_eq!(book.covered_us(), nvml.end(59), "{name}");
        // The period is the shortest gap between two answers' stamps: a sampler that always
        // reads two periods late learns two; counting does not depend on it.
        assert_eq!(book.period_us() % p, 0, "{name}: {} is a whole number of periods", book.period_us());
        if name != "on time" {
            // Reading each sample as one period's undercounts a late read by its length.
            assert!((per_period as f64) < 0.6 * truth as f64, "{name}: the one-period reading counted {per_period} of {truth}");
        } else {
            assert!((per_period as i64 - truth).abs() as f64 / (truth as f64) < 0.02, "on time both readings agree");
        }
    }
}

#[test]
fn the_first_window_begins_at_the_start_of_the_period_holding_the_start() {
    let p = 1_000_000;
    // A product whose period is 1 s; the process starts 0.75 s before the end of period 0
    // and runs 40 % of each period from then on (all of it in the first's last 0.75 s).
    let busy = vec![(7, 0, 400_000), (7, 1, 400_000), (7, 2, 400_000), (7, 3, 400_000)];
    let nvml = Nvml { period: p, phase: 5_000_000, busy };
    let start = nvml.end(0) - 750_000;
    let mut book = UtilisationBook::new(start);
    assert_eq!(book.ask_after(), start, "asked after its start, not for the whole buffer");
    // Read late, over periods 0 and 1: 40 % of 2 s, stamped at the end of period 1.
    let first = book.ingest(&nvml.answer(start, nvml.end(1) + 1), &[7], nvml.end(1) + 1);
    assert!(!book.measuring());
    assert_eq!(first, 40 * 1_750_000 * 10, "the window as far as known: from the start");
    // The next answer teaches the period: the part of period 0 before the start is added.
    let next = book.ingest(&nvml.answer(nvml.end(1), nvml.end(2) + 1), &[7], nvml.end(2) + 1);
    assert_eq!(book.period_us(), p);
    assert_eq!(next, 40 * 1_000_000 * 10 + 40 * 250_000 * 10);
    assert_eq!(first + next, 3 * 400_000 * 1000, "exactly the three periods' work");
}

#[test]
fn quiet_answers_cover_and_several_samples_of_one_process_count_a_period_each() {
    let p = 166_667;
    let mut book = UtilisationBook::new(10 * p);
    // Process 7 and a process 5 of the same ledger; 9 is a neighbour.
    let used = book.ingest(&[s(7, 11 * p, 20), s(5, 11 * p, 25), s(9, 11 * p, 100)], &[7, 5], 11 * p + 10);
    assert_eq!(used, 45 * p as i64 * 10);
    assert_eq!(book.covered_us(), 11 * p);
    // Only the neighbour ran: nothing for the ledger, covered to its stamp.
    assert_eq!(book.ingest(&[s(9, 12 * p, 100)], &[7, 5], 12 * p + 10), 0);
    assert_eq!(book.period_us(), p);
    // Nothing new: covered up to two periods before the question.
    assert_eq!(book.ingest(&[], &[7], 20 * p), 0);
    assert_eq!(book.covered_us(), 18 * p);
    assert_eq!(book.ask_after(), 12 * p);
    // A driver that answers one sample per period of one process: each is a period's.
    let used = book.ingest(&[s(7, 21 * p, 30), s(7, 22 * p, 50), s(9, 22 * p, 10)], &[7], 22 * p + 10);
    assert_eq!(used, 80 * p as i64 * 10);
    // Samples not newer than asked for are not counted again.
    assert_eq!(book.ingest(&[s(7, 22 * p, 50)], &[7], 22 * p + 20), 0);
}
