//! Wall-clock timing of a repeated piece of work.

use std::time::Instant;

/// Median wall time of `f` over `runs` runs, in seconds, after one warm-up run (kernel
/// compilation, autotune, caches).
pub fn median_seconds<T>(runs: usize, mut f: impl FnMut() -> T) -> f64 {
    assert!(runs > 0, "at least one timed run");
    f();
    let mut times: Vec<f64> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[runs / 2]
}

/// Runs issued back to back, one wait a group (the engine's, which times the flash kernel's tiles
/// at start-up by it).
pub use tally_engine::timing::median_seconds_back_to_back;
