//! The request queue in front of the model: one worker thread owns the model and scores
//! whatever has queued up since its last batch in shared forward passes (dynamic batching).
//! The queue is bounded; a full queue is the caller's signal to shed load.
//!
//! With `overlap` (the server's default on the GPU backends, as SGLang's overlap schedule) the
//! worker issues the next batch's first pass, and each pass of a batch, before it reads the pass
//! before: the host's work between passes (gathering, planning, prefill, launching, turning
//! values into scores) runs while the device computes, instead of leaving it idle.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use tally_model::ScoringBackend;
use tally_core::ScoreInput;
use tokio::sync::oneshot;

use crate::batch::BatchRun;
use crate::scorer::{block_on, EngineError, Scored, Scorer};
use crate::stats::EngineStats;

#[derive(Debug, Clone, Copy)]
pub struct SchedulerOptions {
    /// Requests waiting for the model; more are refused with [`ScheduleError::QueueFull`].
    pub max_queue: usize,
    /// Prompt tokens gathered into one batch: a queued request joins only if the batch still
    /// fits (the pass budget, so a batch of new queries can run as one pass); a batch always
    /// takes at least one request.
    pub max_batch_tokens: usize,
    /// Issue the next pass (the next batch's first) before reading the last; off, each pass is
    /// read before the next is issued. Pays only where the backend queues its work
    /// ([`ScoringBackend::overlaps_issue_with_work`]): elsewhere the next batch's first pass would
    /// run before the last batch is answered.
    pub overlap: bool,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum ScheduleError {
    #[error("the server is at capacity ({0} requests queued); retry later")]
    QueueFull(usize),
    #[error("the request passed its deadline before it could be scored")]
    Expired,
    #[error("scoring failed: {0}")]
    Failed(String),
    #[error("the scheduler has shut down")]
    Closed,
}

pub type ScoreResult = Result<Scored, ScheduleError>;

struct Job {
    input: ScoreInput,
    deadline: Instant,
    reply: oneshot::Sender<ScoreResult>,
}

/// Handle to the worker. Dropping it stops the queue, lets the worker finish every queued
/// request, and waits for it.
pub struct Scheduler {
    queue: Option<SyncSender<Job>>,
    worker: Option<JoinHandle<()>>,
    stats: Arc<EngineStats>,
    max_queue: usize,
}

impl Scheduler {
    pub fn start<B: ScoringBackend>(scorer: Scorer<B>, options: SchedulerOptions) -> Self
    where
        Scorer<B>: Send + 'static,
    {
        let (queue, jobs) = sync_channel(options.max_queue);
        let stats = scorer.stats();
        let worker = std::thread::Builder::new()
            .name("tally-model".into())
            .spawn(move || run_worker(scorer, jobs, options))
            .expect("spawning the model thread");
        Scheduler { queue: Some(queue), worker: Some(worker), stats, max_queue: options.max_queue }
    }

    pub fn stats(&self) -> Arc<EngineStats> {
        Arc::clone(&self.stats)
    }

    /// Queues a validated request; the receiver yields its scores.
    pub fn submit(&self, input: ScoreInput, deadline: Instant) -> Result<oneshot::Receiver<ScoreResult>, ScheduleError> {
        let (reply, receiver) = oneshot::channel();
        let queue = self.queue.as_ref().ok_or(ScheduleError::Closed)?;
        // Count before sending: the worker decrements as soon as it takes the job.
        self.stats.queue_depth.fetch_add(1, Relaxed);
        match queue.try_send(Job { input, deadline, reply }) {
            Ok(()) => Ok(receiver),
            Err(error) => {
                self.stats.queue_depth.fetch_sub(1, Relaxed);
                Err(match error {
                    TrySendError::Full(_) => ScheduleError::QueueFull(self.max_queue),
                    TrySendError::Disconnected(_) => ScheduleError::Closed,
                })
            }
        }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.queue.take();
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

/// A batch the model is scoring, and who waits for its answers.
struct Running<B: ScoringBackend> {
    run: BatchRun<B, ScoreInput>,
    waiting: Vec<Waiting>,
}

struct Waiting {
    deadline: Instant,
    reply: oneshot::Sender<ScoreResult>,
}

/// Asked before each query and each pass: work for a client that left or gave up stops.
fn still_wanted(waiting: &[Waiting]) -> impl Fn(usize) -> bool + '_ {
    |r| !waiting[r].reply.is_closed() && waiting[r].deadline > Instant::now()
}

fn run_worker<B: ScoringBackend>(mut scorer: Scorer<B>, jobs: Receiver<Job>, options: SchedulerOptions) {
    let stats = scorer.stats();
    // Passes of a batch issued before the one before them is read.
    let ahead = usize::from(options.overlap);
    // The job that did not fit the last batch: it leads the next one.
    let mut held_over: Option<Job> = None;
    // With `overlap`, the last batch, its last pass still on the device: read once the next
    // batch's first pass is issued behind it, or once nothing more is queued.
    let mut on_device: Option<Running<B>> = None;
    loop {
        let first = match held_over.take() {
            Some(job) => Some(job),
            None if on_device.is_some() => jobs.try_recv().ok(),
            // `recv` keeps returning queued jobs after the handle is dropped, so shutdown drains.
            None => jobs.recv().ok(),
        };
        let Some(first) = first else {
            match on_device.take() {
                Some(running) => finish(&scorer, running, &stats),
                None => break,
            }
            continue;
        };
        let batch;
        (batch, held_over) = next_batch(first, &jobs, options.max_batch_tokens);
        stats.queue_depth.fetch_sub(batch.len() as i64, Relaxed);
        stats.requests_running.fetch_add(batch.len() as i64, Relaxed);
        let started = start(&mut scorer, batch, &stats);
        if let Some(previous) = on_device.take() {
            if started.is_some() {
                stats.batches_issued_ahead.fetch_add(1, Relaxed);
            }
            finish(&scorer, previous, &stats);
        }
        let Some(mut running) = started else { continue };
        if let Err(error) = issue_the_rest(&mut scorer, &mut running, ahead) {
            answer(&stats, running.waiting, std::iter::repeat(Err(error)));
            continue;
        }
        if options.overlap {
            on_device = Some(running);
        } else {
            finish(&scorer, running, &stats);
        }
    }
}

/// The batch begun and its first pass issued; `None` where that failed (its requests are
/// answered).
fn start<B: ScoringBackend>(scorer: &mut Scorer<B>, batch: Vec<Job>, stats: &EngineStats) -> Option<Running<B>> {
    let (inputs, waiting): (Vec<ScoreInput>, Vec<Waiting>) = batch.into_iter().map(|job| (job.input, Waiting { deadline: job.deadline, reply: job.reply })).unzip();
    let begun = {
        let wanted = still_wanted(&waiting);
        guarded(|| {
            let mut run = scorer.begin_batch(inputs, &wanted);
            scorer.issue_pass(&mut run, &wanted);
            Ok(run)
        })
    };
    match begun {
        Ok(run) => Some(Running { run, waiting }),
        Err(error) => {
            answer(stats, waiting, std::iter::repeat(Err(error)));
            None
        }
    }
}

/// Issues the rest of `running`'s passes, each once at most `ahead` passes issued before it are
/// unread.
fn issue_the_rest<B: ScoringBackend>(scorer: &mut Scorer<B>, running: &mut Running<B>, ahead: usize) -> Result<(), ScheduleError> {
    let wanted = still_wanted(&running.waiting);
    guarded(|| block_on(scorer.issue_passes(&mut running.run, &wanted, ahead)))
}

/// Reads what is left of `running` and answers its requests.
fn finish<B: ScoringBackend>(scorer: &Scorer<B>, running: Running<B>, stats: &EngineStats) {
    let Running { mut run, waiting } = running;
    let scored = guarded(|| {
        block_on(scorer.read_unread(&mut run))?;
        Ok(scorer.finish_batch(run))
    });
    match scored {
        Ok(scored) => answer(stats, waiting, scored.into_iter().map(|s| s.ok_or(ScheduleError::Expired))),
        Err(error) => answer(stats, waiting, std::iter::repeat(Err(error))),
    }
}

/// `step`'s outcome; a panic (a bug in a backend) fails the batch's requests instead of killing
/// the worker and every later request.
fn guarded<T>(step: impl FnOnce() -> Result<T, EngineError>) -> Result<T, ScheduleError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(step)) {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(ScheduleError::Failed(error.to_string())),
        Err(_) => Err(ScheduleError::Failed("the model panicked; see the server log".into())),
    }
}

fn answer(stats: &EngineStats, waiting: Vec<Waiting>, results: impl Iterator<Item = ScoreResult>) {
    stats.requests_running.fetch_sub(waiting.len() as i64, Relaxed);
    for (waiting, result) in waiting.into_iter().zip(results) {
        // The client may have gone away; its answer is simply dropped.
        let _ = waiting.reply.send(result);
    }
}

/// `first` and the jobs queued behind it, in order, while the batch's prompt tokens stay within
/// `max_batch_tokens` (`first` whatever its size); and the first job that would have crossed it,
/// taken off the queue to find that out, to lead the next batch. Later jobs stay queued.
fn next_batch(first: Job, jobs: &Receiver<Job>, max_batch_tokens: usize) -> (Vec<Job>, Option<Job>) {
    let mut tokens = first.input.prompt_tokens();
    let mut batch = vec![first];
    while let Ok(job) = jobs.try_recv() {
        tokens += job.input.prompt_tokens();
        if tokens > max_batch_tokens {
            return (batch, Some(job));
        }
        batch.push(job);
    }
    (batch, None)
}

#[cfg(test)]
mod tests {
    use tally_core::ModelLimits;

    use super::*;

    /// A job of one item: `query_len` query tokens and one, `query_len + 1` prompt tokens.
    fn job(query_len: usize) -> Job {
        let limits = ModelLimits { vocab_size: 100, max_positions: 1000 };
        let input = ScoreInput::new(vec![1; query_len], vec![vec![2]], vec![3], true, false, limits).unwrap();
        assert_eq!(input.prompt_tokens(), query_len + 1);
        Job { input, deadline: Instant::now(), reply: oneshot::channel().0 }
    }

    /// Prompt tokens of each job of the next batch, of the job held over for the one after,
    /// and of each job left queued.
    fn batches(queued: &[usize], max_batch_tokens: usize) -> (Vec<usize>, Option<usize>, Vec<usize>) {
        let (queue, jobs) = sync_channel(queued.len());
        for &len in queued {
            queue.send(job(len - 1)).unwrap();
        }
        let first = jobs.recv().unwrap();
        let (batch, held_over) = next_batch(first, &jobs, max_batch_tokens);
        let tokens = |job: &Job| job.input.prompt_tokens();
        (batch.iter().map(tokens).collect(), held_over.as_ref().map(tokens), jobs.try_iter().map(|job| tokens(&job)).collect())
    }

    #[test]
    fn a_batch_takes_queued_jobs_while_they_fit_the_token_budget() {
        // All fit; the third crosses the budget, then the second; the second, then the third,
        // reach it exactly.
        assert_eq!(batches(&[40, 49, 10], 100), (vec![40, 49, 10], None, vec![]));
        assert_eq!(batches(&[40, 59, 10, 5], 100), (vec![40, 59], Some(10), vec![5]));
        assert_eq!(batches(&[40, 61, 10], 100), (vec![40], Some(61), vec![10]));
        assert_eq!(batches(&[40, 60, 10], 100), (vec![40, 60], Some(10), vec![]));
        assert_eq!(batches(&[40, 58, 2], 100), (vec![40, 58, 2], None, vec![]));
        // A first job over the budget runs alone; nothing queued, a batch of one.
        assert_eq!(batches(&[500, 10], 100), (vec![500], Some(10), vec![]));
        assert_eq!(batches(&[10], 100), (vec![10], None, vec![]));
    }

    /// The tied-gqa fixture model (vocabulary 512) on the CPU.
    fn fixture_scorer(options: crate::ScorerOptions) -> Scorer<burn::backend::NdArray<f32>> {
        let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models/tied-gqa");
        Scorer::load(&fixtures, &Default::default(), options).unwrap()
    }

    /// Runs the worker over `inputs`, all queued before it starts, to the end; each request's
    /// answer, and the worker's counters.
    fn run_queued(scorer: Scorer<burn::backend::NdArray<f32>>, inputs: Vec<ScoreInput>, options: SchedulerOptions) -> (Vec<ScoreResult>, Arc<EngineStats>) {
        let (queue, jobs) = sync_channel(inputs.len());
        let mut answers = Vec::new();
        for input in inputs {
            let (reply, answer) = oneshot::channel();
            queue.send(Job { input, deadline: Instant::now() + std::time::Duration::from_secs(600), reply }).unwrap();
            answers.push(answer);
        }
        drop(queue);
        let stats = scorer.stats();
        run_worker(scorer, jobs, options);
        assert_eq!(stats.requests_running.load(Relaxed), 0, "every batch answered");
        (answers.into_iter().map(|mut answer| answer.try_recv().expect("every job is answered")).collect(), stats)
    }

    /// The worker runs the job a batch held over in the next batch: every job is answered, in
    /// batches that each fit the budget; with `overlap`, each batch after the first is issued
    /// before the one before it is read.
    #[test]
    fn the_worker_scores_held_over_jobs_in_the_next_batch() {
        for overlap in [true, false] {
            // 1 + 1 prompt tokens a job below; two fit a batch of 4.
            let inputs = (0..5).map(|_| job(1).input).collect();
            let (answers, stats) = run_queued(fixture_scorer(crate::ScorerOptions::default()), inputs, SchedulerOptions { max_queue: 8, max_batch_tokens: 4, overlap });
            assert!(answers.iter().all(Result::is_ok));
            // Batches of 2, 2 and 1.
            let (buckets, _) = stats.batch_requests.snapshot();
            let at_most = |n: f64| buckets.iter().find(|(bound, _)| *bound >= n).unwrap().1;
            assert_eq!((stats.batch_requests.count(), at_most(1.0), at_most(2.0)), (3, 1, 3));
            assert_eq!(stats.batches_issued_ahead.load(Relaxed), if overlap { 2 } else { 0 }, "overlap {overlap}");
        }
    }

    /// Batches issued behind unread ones, passes issued behind unread ones, and queries found in
    /// the prefix cache where the batch that cached them is still unread: the same scores as
    /// when every pass is read before the next is issued (the same batches, so bit for bit).
    #[test]
    fn overlapped_batches_score_as_batches_read_one_at_a_time() {
        let limits = ModelLimits { vocab_size: 512, max_positions: 1000 };
        // Six requests of 3 items (5 + 3 × 4 = 17 prompt tokens): batches of two; queries
        // repeated across batches; several passes a batch at 8 item tokens a pass.
        let inputs = || -> Vec<ScoreInput> {
            (0..6u32)
                .map(|r| {
                    let query = (0..5).map(|t| 10 + (r % 4) * 7 + t).collect();
                    let items = (0..3).map(|i| (0..4).map(|t| 100 + r * 13 + i * 5 + t).collect()).collect();
                    ScoreInput::new(query, items, vec![3, 7 + r], r % 2 == 0, false, limits).unwrap()
                })
                .collect()
        };
        let scorer_options = crate::ScorerOptions { pass_budget: tally_core::PassBudget { max_tokens: 8, ..Default::default() }, prefix_cache_bytes: 1 << 20, ..Default::default() };
        let scored = |overlap: bool| {
            let (answers, stats) = run_queued(fixture_scorer(scorer_options), inputs(), SchedulerOptions { max_queue: 8, max_batch_tokens: 34, overlap });
            let scores: Vec<Vec<Vec<f64>>> = answers.into_iter().map(|answer| answer.unwrap().scores).collect();
            (scores, stats)
        };
        let (overlapped, stats) = scored(true);
        let (one_at_a_time, _) = scored(false);
        assert_eq!(stats.batches_issued_ahead.load(Relaxed), 2, "three batches, each after the first issued ahead");
        assert!(stats.pass_items.count() >= 6, "several passes a batch: {}", stats.pass_items.count());
        assert!(stats.prefix_cache_hits.load(Relaxed) > 0, "queries repeated across batches are cache hits");
        assert_eq!(overlapped, one_at_a_time);
        assert!(overlapped.iter().flatten().all(|scores| scores.len() == 2 && scores.iter().all(|p| p.is_finite() && *p > 0.0)));
    }

    #[test]
    fn a_full_queue_refuses_and_a_dropped_scheduler_is_closed() {
        let (queue, jobs) = sync_channel(1);
        let stats = Arc::new(EngineStats::default());
        let scheduler = Scheduler { queue: Some(queue), worker: None, stats: Arc::clone(&stats), max_queue: 1 };
        assert!(scheduler.submit(job(3).input, Instant::now()).is_ok());
        assert!(matches!(scheduler.submit(job(3).input, Instant::now()), Err(ScheduleError::QueueFull(1))));
        assert_eq!(stats.queue_depth.load(Relaxed), 1, "a refused request is not counted as queued");
        drop(jobs);
        assert!(matches!(scheduler.submit(job(3).input, Instant::now()), Err(ScheduleError::Closed)));
        assert_eq!(stats.queue_depth.load(Relaxed), 1);
    }
}
