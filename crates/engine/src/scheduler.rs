//! The request queue in front of the model: one worker thread owns the model and scores
//! whatever has queued up since its last batch in shared forward passes (dynamic batching).
//! The queue is bounded; a full queue is the caller's signal to shed load.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use tally_model::ScoringBackend;
use tally_core::ScoreInput;
use tokio::sync::oneshot;

use crate::scorer::{Scored, Scorer};
use crate::stats::EngineStats;

#[derive(Debug, Clone, Copy)]
pub struct SchedulerOptions {
    /// Requests waiting for the model; more are refused with [`ScheduleError::QueueFull`].
    pub max_queue: usize,
    /// Prompt tokens gathered into one batch: a queued request joins only if the batch still
    /// fits (the pass budget, so a batch of new queries can run as one pass); a batch always
    /// takes at least one request.
    pub max_batch_tokens: usize,
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

fn run_worker<B: ScoringBackend>(mut scorer: Scorer<B>, jobs: Receiver<Job>, options: SchedulerOptions) {
    let stats = scorer.stats();
    // The job that did not fit the last batch: it leads the next one.
    let mut held_over: Option<Job> = None;
    // `recv` keeps returning queued jobs after the handle is dropped, so shutdown drains.
    while let Some(first) = held_over.take().or_else(|| jobs.recv().ok()) {
        let batch;
        (batch, held_over) = next_batch(first, &jobs, options.max_batch_tokens);
        stats.queue_depth.fetch_sub(batch.len() as i64, Relaxed);
        stats.requests_running.store(batch.len() as i64, Relaxed);

        let inputs: Vec<&ScoreInput> = batch.iter().map(|job| &job.input).collect();
        // Asked before each query and each pass: work for a client that left or gave up stops.
        let wanted = |r: usize| !batch[r].reply.is_closed() && batch[r].deadline > Instant::now();
        // A bug in a backend must fail these requests, not kill the worker and every later request.
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| scorer.score_batch_while(&inputs, &wanted)));
        let results: Vec<ScoreResult> = match outcome {
            Ok(Ok(scores)) => scores.into_iter().map(|s| s.ok_or(ScheduleError::Expired)).collect(),
            Ok(Err(error)) => batch.iter().map(|_| Err(ScheduleError::Failed(error.to_string()))).collect(),
            Err(_) => batch.iter().map(|_| Err(ScheduleError::Failed("the model panicked; see the server log".into()))).collect(),
        };
        stats.requests_running.store(0, Relaxed);
        for (job, result) in batch.into_iter().zip(results) {
            // The client may have gone away; its answer is simply dropped.
            let _ = job.reply.send(result);
        }
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

    /// The worker runs the job a batch held over in the next batch: every job is answered, in
    /// batches that each fit the budget.
    #[test]
    fn the_worker_scores_held_over_jobs_in_the_next_batch() {
        // The tied-gqa fixture model: 1 + 1 prompt tokens a job below; two fit a batch of 4.
        let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models/tied-gqa");
        let scorer = Scorer::<burn::backend::NdArray<f32>>::load(&fixtures, &Default::default(), crate::ScorerOptions::default()).unwrap();
        let (queue, jobs) = sync_channel(8);
        let mut replies = Vec::new();
        for _ in 0..5 {
            let (reply, answer) = oneshot::channel();
            queue.send(Job { input: job(1).input, deadline: Instant::now() + std::time::Duration::from_secs(600), reply }).unwrap();
            replies.push(answer);
        }
        drop(queue);
        let stats = scorer.stats();
        run_worker(scorer, jobs, SchedulerOptions { max_queue: 8, max_batch_tokens: 4 });
        assert!(replies.into_iter().all(|mut answer| answer.try_recv().is_ok_and(|scored| scored.is_ok())));
        // Batches of 2, 2 and 1.
        let (buckets, _) = stats.batch_requests.snapshot();
        let at_most = |n: f64| buckets.iter().find(|(bound, _)| *bound >= n).unwrap().1;
        assert_eq!((stats.batch_requests.count(), at_most(1.0), at_most(2.0)), (3, 1, 3));
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
