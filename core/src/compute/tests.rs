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

#[test]
fn samples_become_gpu_time_over_the_learned_period() {
    let p = 166_667;
    let mut book = UtilisationBook::new(10 * p);
    assert_eq!(book.ask_after(), 0);
    // The first answer is the whole buffer: it teaches the period; only samples after
    // the start count.
    let first = [s(7, 9 * p, 90), s(8, 9 * p, 10), s(7, 10 * p, 50), s(7, 11 * p, 30), s(9, 11 * p, 70)];
    let used = book.ingest(&first, &[7], 11 * p + 10);
    assert_eq!(book.period_us(), p);
    assert_eq!(used, 30 * p as i64 * 10, "30 % of the period after the start");
    assert_eq!(book.ask_after(), 11 * p);
    assert_eq!(book.covered_us(), 11 * p);
    // Next answers: two processes of the ledger, a period without them.
    let used = book.ingest(&[s(7, 12 * p, 20), s(5, 12 * p, 25), s(9, 13 * p, 100)], &[7, 5], 13 * p + 10);
    assert_eq!(used, 45 * p as i64 * 10);
    assert_eq!(book.covered_us(), 13 * p);
    // Nothing new: covered up to two periods ago.
    assert_eq!(book.ingest(&[], &[7], 20 * p), 0);
    assert_eq!(book.covered_us(), 18 * p);
}

#[test]
fn a_slower_product_period_is_learned_and_earlier_figures_corrected() {
    let mut book = UtilisationBook::new(0);
    // One timestamp: the period is unknown, so nothing is counted or covered yet (the
    // caller's own upper bounds stand), and asking again is for newer samples only.
    assert_eq!(book.ingest(&[s(1, 5_000_000, 10)], &[1], 5_000_000), 0);
    assert!(!book.measuring());
    assert_eq!(book.covered_us(), 0);
    assert_eq!(book.ask_after(), 5_000_000);
    // Nothing new while it is unknown: still nothing covered.
    assert_eq!(book.ingest(&[], &[1], 5_900_000), 0);
    assert_eq!(book.covered_us(), 0);
    // Another process's sample stamped 300 ms later is no period: processes need not
    // be sampled at the same instants.
    assert_eq!(book.ingest(&[s(2, 5_300_000, 50)], &[1], 5_300_000), 0);
    assert!(!book.measuring());
    // Then one of the first process a second after its first: the period is 1 s, and
    // both its samples count.
    let used = book.ingest(&[s(1, 6_000_000, 20), s(3, 6_000_050, 10)], &[1], 6_000_000);
    assert_eq!(book.period_us(), 1_000_000, "50 us between two processes is not a period");
    assert!(book.measuring());
    assert_eq!(used, 30 * 1_000_000 * 10);
    assert_eq!(book.covered_us(), 6_000_050);
    // A shorter gap later lowers it again, and corrects downwards.
    let used = book.ingest(&[s(1, 6_500_000, 0)], &[1], 6_500_000);
    assert_eq!(book.period_us(), 500_000, "measured from that process's newest sample");
    assert_eq!(used, 30 * 500_000 * 10 - 30 * 1_000_000 * 10);
}
