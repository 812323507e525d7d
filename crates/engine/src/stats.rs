//! Counters the engine keeps for monitoring; the server renders them as Prometheus metrics.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

/// A fixed-bucket histogram, safe to update from any thread.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// `counts[i]`: observations `<= bounds[i]`, not cumulative; the last slot is `+Inf`.
    counts: Vec<AtomicU64>,
    sum_micros: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram { bounds, counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(), sum_micros: AtomicU64::new(0) }
    }

    pub fn observe(&self, value: f64) {
        let slot = self.bounds.iter().position(|&bound| value <= bound).unwrap_or(self.bounds.len());
        self.counts[slot].fetch_add(1, Relaxed);
        self.sum_micros.fetch_add((value * 1e6) as u64, Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|count| count.load(Relaxed)).sum()
    }

    /// `(upper bound, cumulative count)` per bucket, ending with `+Inf`; then the sum.
    pub fn snapshot(&self) -> (Vec<(f64, u64)>, f64) {
        let mut total = 0;
        let mut buckets = Vec::with_capacity(self.counts.len());
        for (i, count) in self.counts.iter().enumerate() {
            total += count.load(Relaxed);
            buckets.push((self.bounds.get(i).copied().unwrap_or(f64::INFINITY), total));
        }
        (buckets, self.sum_micros.load(Relaxed) as f64 / 1e6)
    }
}

const SIZE_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0];
/// Seconds, from a small pass's host time to a long request's.
const SECONDS_BUCKETS: &[f64] = &[0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0];

#[derive(Debug)]
pub struct EngineStats {
    /// Requests waiting for the model.
    pub queue_depth: AtomicI64,
    /// Requests in the batches the model is scoring now (two while the next batch is issued
    /// behind the last).
    pub requests_running: AtomicI64,
    pub items_scored: AtomicU64,
    pub tokens_scored: AtomicU64,
    pub prefix_cache_hits: AtomicU64,
    /// A cached beginning of the query was reused; the rest was prefilled.
    pub prefix_cache_partial_hits: AtomicU64,
    pub prefix_cache_misses: AtomicU64,
    pub prefix_cache_bytes: AtomicU64,
    /// The prefix cache's budget (`--prefix-cache-mib`); 0 when it is off.
    pub prefix_cache_capacity_bytes: AtomicU64,
    /// Query tokens run through the model (what the prefix cache did not hold).
    pub prefill_tokens: AtomicU64,
    /// Forward passes run for queries alone. A query's last chunk runs in its batch's first item
    /// pass, so a request whose query is cached but for a new suffix takes none.
    pub prefill_passes: AtomicU64,
    /// Requests dropped unscored or part-scored because their client left or their deadline passed.
    pub requests_abandoned: AtomicU64,
    /// Batches whose first pass was issued while the batch before was still on the device: the
    /// host's work between batches overlapped with the device's (the scheduler's `overlap`).
    pub batches_issued_ahead: AtomicU64,
    /// Requests scored together in one batch.
    pub batch_requests: Histogram,
    /// Items in one forward pass.
    pub pass_items: Histogram,
    /// Seconds the model thread spent issuing one forward pass (building it, and launching
    /// what the backend launches before the pass's scores are asked for).
    pub pass_issue_seconds: Histogram,
    /// Seconds the model thread waited for one pass's scores once it asked for them: the
    /// device's time on that pass (and on what was queued before it) that the host's work since
    /// issuing it did not cover, and the copy back. Against [`Self::pass_issue_seconds`] it says
    /// whether the model thread waits on the device or the device on the host.
    pub pass_wait_seconds: Histogram,
}

impl EngineStats {
    /// The prefix cache's bytes as a fraction of its budget, 0 to 1 (0 when it is off): the
    /// cache-use gauge a router's endpoint picker reads.
    pub fn prefix_cache_usage(&self) -> f64 {
        let capacity = self.prefix_cache_capacity_bytes.load(Relaxed);
        if capacity == 0 {
            return 0.0;
        }
        (self.prefix_cache_bytes.load(Relaxed) as f64 / capacity as f64).min(1.0)
    }
}

impl Default for EngineStats {
    fn default() -> Self {
        EngineStats {
            queue_depth: AtomicI64::new(0),
            requests_running: AtomicI64::new(0),
            items_scored: AtomicU64::new(0),
            tokens_scored: AtomicU64::new(0),
            prefix_cache_hits: AtomicU64::new(0),
            prefix_cache_partial_hits: AtomicU64::new(0),
            prefix_cache_misses: AtomicU64::new(0),
            prefix_cache_bytes: AtomicU64::new(0),
            prefix_cache_capacity_bytes: AtomicU64::new(0),
            prefill_tokens: AtomicU64::new(0),
            prefill_passes: AtomicU64::new(0),
            requests_abandoned: AtomicU64::new(0),
            batches_issued_ahead: AtomicU64::new(0),
            batch_requests: Histogram::new(SIZE_BUCKETS),
            pass_items: Histogram::new(SIZE_BUCKETS),
            pass_issue_seconds: Histogram::new(SECONDS_BUCKETS),
            pass_wait_seconds: Histogram::new(SECONDS_BUCKETS),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::new(&[1.0, 10.0]);
        for v in [0.5, 1.0, 5.0, 100.0] {
            h.observe(v);
        }
        let (buckets, sum) = h.snapshot();
        assert_eq!(buckets, vec![(1.0, 2), (10.0, 3), (f64::INFINITY, 4)]);
        assert!((sum - 106.5).abs() < 1e-6);
    }

    #[test]
    fn prefix_cache_usage_is_a_fraction_of_the_budget() {
        let stats = EngineStats::default();
        assert_eq!(stats.prefix_cache_usage(), 0.0, "no budget: the cache is off");
        stats.prefix_cache_capacity_bytes.store(400, Relaxed);
        for (bytes, usage) in [(0, 0.0), (100, 0.25), (400, 1.0)] {
            stats.prefix_cache_bytes.store(bytes, Relaxed);
            assert_eq!(stats.prefix_cache_usage(), usage);
        }
    }
}
