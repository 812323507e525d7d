//! tally-engine: turns a score request into scores.
//!
//! Request path: [`ScoreRequest`](tally_core::ScoreRequest) → tokenized and validated
//! ([`prepare`]) → queued and batched with concurrent requests ([`scheduler`]) → each query
//! taken from the [`prefix_cache`] or prefilled, the batch's misses together ([`prefill`]) →
//! items of all batched requests split into shared passes ([`tally_core::plan_passes`]) →
//! passes issued and read back in order, the next issued before the last is read ([`batch`]) →
//! label probabilities ([`scorer`]).
//! [`rerank`] turns (query, documents) into such a request; [`warmup`] runs every pass shape
//! once before a server reports ready, after [`tile_tuning`] has timed the flash kernel's tiles
//! on the device and kept the fastest.

pub mod batch;
pub mod prefill;
pub mod prefix_cache;
pub mod prepare;
pub mod rerank;
pub mod scheduler;
pub mod scorer;
pub mod stats;
#[cfg(not(target_arch = "wasm32"))]
pub mod tile_tuning;
#[cfg(not(target_arch = "wasm32"))]
pub mod timing;
pub mod tokenizer;
pub mod warmup;

pub use batch::BatchRun;
pub use prefill::PrefixCacheUse;
pub use prepare::{RequestError, RequestPreparer};
pub use rerank::{RerankSetupError, RerankTemplate, Reranker, Truncation};
pub use scheduler::{ScheduleError, Scheduler, SchedulerOptions, ScoreResult};
pub use scorer::{EngineError, Scored, Scorer, ScorerOptions};
pub use stats::{EngineStats, Histogram};
#[cfg(not(target_arch = "wasm32"))]
pub use tile_tuning::{AttentionShape, TileTiming, TileTuning};
pub use tokenizer::{PromptPart, TextTokenizer, TruncationSide};
pub use warmup::{warmup_steps, WarmupStep};
