//! tally-engine: turns a score request into scores.
//!
//! Request path: [`ScoreRequest`](tally_core::ScoreRequest) → kinds checked → tokenized
//! ([`tokenizer`]) → validated against the model ([`tally_core::ScoreInput`]) → query prefilled once
//! → items split into passes ([`tally_core::plan_passes`]) → label log-probabilities ([`scorer`]).

pub mod prefix_cache;
pub mod scorer;
pub mod stats;
pub mod tokenizer;

pub use scorer::{EngineError, Scorer, ScorerOptions};
pub use stats::{EngineStats, Histogram};
pub use tokenizer::TextTokenizer;
