//! A driver-side pool (a stream-ordered memory pool, or a device's graph memory pool)
//! counted in the ledger as what the driver reserves for it, without holding a lock across
//! the driver calls that make it grow.
//!
//! Before such a call the growth it may cause is reserved in the ledger and recorded as in
//! flight; after it the pool is read again. What the ledger holds for the pool is
//! `last + growth in flight`, an upper bound on what the pool holds: the pool grows only
//! through calls in flight, each by no more than it reserved. A settlement while other
//! calls are still in flight cannot tell which of them the reading already includes, so it
//! keeps the lower of the two bounds it has (the old count, or the reading plus what is
//! still in flight): the count never rises past what was reserved, so settling never passes
//! the cap. Once nothing is in flight the reading is taken as it is (memory the pool took
//! some other way, if any, is counted then).

use crate::abi::cuda::CUdevice;

#[derive(Debug)]
pub struct CountedPool {
    pub ordinal: CUdevice,
    /// The pool's reserved memory when last read.
    last: u64,
    /// Reserved in the ledger for calls still running.
    growth_in_flight: u64,
    /// What those calls asked for: memory the pool's free reserve will not have for others.
    requests_in_flight: u64,
}

/// One call's part, to hand back to [`CountedPool::finish`].
#[derive(Debug, Clone, Copy, Default)]
pub struct InFlight {
    pub growth: u64,
    request: u64,
}

impl CountedPool {
    pub fn new(ordinal: CUdevice) -> CountedPool {
        CountedPool { ordinal, last: 0, growth_in_flight: 0, requests_in_flight: 0 }
    }

    /// What the ledger holds for this pool.
    pub fn counted(&self) -> u64 {
        self.last + self.growth_in_flight
    }

    /// How much the pool may have to grow to serve `request` more, given its reserved and
    /// used memory now, in `granule`s. Only the free reserve the pool is sure to keep counts:
    /// another thread's synchronisation may give back what lies above `kept` (a stream pool
    /// keeps its release threshold through a synchronisation; a graph pool keeps all until
    /// trimmed) before this call runs. Requests of calls still running use it first.
    pub fn growth_for(&self, request: u64, reserved: u64, used: u64, kept: u64, granule: u64) -> u64 {
        let taken = used.saturating_add(self.requests_in_flight);
        let free = reserved.min(kept).saturating_sub(taken);
        request.saturating_sub(free).next_multiple_of(granule)
    }

    /// Records a call about to run, with `growth` already reserved in the ledger.
    pub fn begin(&mut self, growth: u64, request: u64) -> InFlight {
        self.growth_in_flight += growth;
        self.requests_in_flight += request;
        InFlight { growth, request }
    }

    /// After a call (`done`, or the default for none) or any point where the pool may have
    /// changed: `reserved` is the pool's reserved memory now, if the driver could say.
    /// Returns what the ledger held for the pool before and what it should hold now.
    pub fn finish(&mut self, done: InFlight, reserved: Option<u64>) -> (u64, u64) {
        let before = self.counted();
        self.growth_in_flight -= done.growth.min(self.growth_in_flight);
        self.requests_in_flight -= done.request.min(self.requests_in_flight);
        let bound = self.last + done.growth;
        self.last = match reserved {
            None => bound,
            Some(read) if self.growth_in_flight == 0 => read,
            Some(read) => read.min(bound),
        };
        (before, self.counted())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const MIB: u64 = 1 << 20;

    #[test]
    fn overlapping_calls_are_never_counted_below_what_the_pool_holds() {
        let mut pool = CountedPool::new(0);
        // Two calls start on an empty pool: each reserves its own growth.
        let a_growth = pool.growth_for(10 * MIB, 0, 0, u64::MAX, 2 * MIB);
        let a = pool.begin(a_growth, 10 * MIB);
        let b_growth = pool.growth_for(4 * MIB, 0, 0, u64::MAX, 2 * MIB);
        let b = pool.begin(b_growth, 4 * MIB);
        assert_eq!((a_growth, b_growth, pool.counted()), (10 * MIB, 4 * MIB, 14 * MIB));
        // A finishes first; the pool now holds both (B's driver call also ran). The count
        // stays at what was reserved (never rising past it while B is in flight), and B's
        // settlement brings it to the reading.
        assert_eq!(pool.finish(a, Some(14 * MIB)), (14 * MIB, 14 * MIB));
        assert_eq!(pool.finish(b, Some(14 * MIB)), (14 * MIB, 14 * MIB));
        // With 4 MiB free in the pool and a 4 MiB request running, a new one must grow it.
        let c = pool.begin(0, 4 * MIB);
        assert_eq!(pool.growth_for(4 * MIB, 18 * MIB, 14 * MIB, u64::MAX, 2 * MIB), 4 * MIB);
        assert_eq!(pool.finish(c, None), (14 * MIB, 14 * MIB));
        // Nothing in flight: a reading above the count is memory taken some other way,
        // counted as it is.
        assert_eq!(pool.finish(InFlight::default(), Some(20 * MIB)), (14 * MIB, 20 * MIB));
    }

    #[test]
    fn a_settlement_while_others_run_never_counts_more_than_was_reserved() {
        let mut pool = CountedPool::new(0);
        let a = pool.begin(10 * MIB, 10 * MIB);
        let b = pool.begin(6 * MIB, 6 * MIB);
        // Both grew the pool (16 MiB); B settles first, A still in flight. Reading + A's
        // growth would be 26: the count keeps the 16 it had.
        assert_eq!(pool.finish(b, Some(16 * MIB)), (16 * MIB, 16 * MIB));
        assert_eq!(pool.finish(a, Some(16 * MIB)), (16 * MIB, 16 * MIB));
    }

    #[test]
    fn only_the_reserve_a_pool_keeps_through_a_synchronisation_is_counted_on() {
        let pool = CountedPool::new(0);
        // 16 MiB reserved, 4 used: 12 free. With a release threshold of 0 another thread's
        // synchronisation may give all 12 back before the call runs: grow by the request.
        assert_eq!(pool.growth_for(6 * MIB, 16 * MIB, 4 * MIB, 0, 2 * MIB), 6 * MIB);
        // With a threshold of 8 MiB, 4 of the free 12 are sure to stay.
        assert_eq!(pool.growth_for(6 * MIB, 16 * MIB, 4 * MIB, 8 * MIB, 2 * MIB), 2 * MIB);
        // With no threshold (what PyTorch sets), all of it stays.
        assert_eq!(pool.growth_for(6 * MIB, 16 * MIB, 4 * MIB, u64::MAX, 2 * MIB), 0);
    }
}
