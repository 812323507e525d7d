//! Wall-clock timing of work issued to a device back to back: what the flash tile tuning
//! times its candidates by, and the benchmarks their kernels.

use std::time::Instant;

/// Wall time a run of `f` adds when `runs` of them are issued back to back and `wait`ed for
/// once, in seconds: the median over `groups` such groups, after one warm-up run. This is
/// what a kernel costs among a pass's other launches, where nothing waits between them; a run
/// waited for alone (`tally bench attention`'s `_synced_ms`) also pays the host's issue and the
/// device's round trip, which on a GPU can be a third of a millisecond-long kernel. Each run's
/// result is dropped before the next is issued, as a pass drops a layer's.
pub fn median_seconds_back_to_back<T, E>(groups: usize, runs: usize, mut f: impl FnMut() -> T, mut wait: impl FnMut() -> Result<(), E>) -> Result<f64, E> {
    assert!(groups > 0 && runs > 0, "at least one timed group of one run");
    f();
    wait()?;
    let mut times = Vec::with_capacity(groups);
    for _ in 0..groups {
        let start = Instant::now();
        for _ in 0..runs {
            f();
        }
        wait()?;
        times.push(start.elapsed().as_secs_f64() / runs as f64);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[groups / 2])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::time::Duration;

    #[test]
    fn back_to_back_runs_are_waited_for_once_a_group_and_timed_per_run() {
        let (issued, waits) = (Cell::new(0), Cell::new(0));
        // Each run "issues" 20 ms of work that only the wait pays for, as a GPU queue does.
        let seconds = median_seconds_back_to_back(
            3,
            4,
            || issued.set(issued.get() + 1),
            || -> Result<(), ()> {
                std::thread::sleep(Duration::from_millis(20) * issued.replace(0));
                waits.set(waits.get() + 1);
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(waits.get(), 4, "one wait after the warm-up, one a group");
        // Not divided by the runs it would be 80 ms. The margin is for a busy machine's sleeps:
        // to fail, two of the three groups would each have to oversleep by 160 ms.
        assert!((0.02..0.06).contains(&seconds), "{seconds} s a run, 20 ms of work each");
    }

    #[test]
    fn a_failed_wait_is_the_result() {
        assert_eq!(median_seconds_back_to_back(2, 2, || (), || Err("device lost")), Err("device lost"));
    }
}
