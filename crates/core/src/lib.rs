//! tally-core: the `/v1/score` contract and everything that can be decided without a model.
//!
//! - [`request`] / [`response`]: SGLang-compatible JSON types.
//! - [`validate`]: checks a request against a model's limits, with typed errors.
//! - [`plan`]: splits the items of a request into forward passes under a memory budget.
//! - [`tile`]: the tiled attention kernel's tile shape, as flags and planners choose it.
//! - [`prefix_split`]: how many cubes the flash kernel cuts a tile's prefix walk over.
//!
//! No GPU or ML dependencies: this crate also builds for wasm32.

pub mod plan;
pub mod prefix_split;
pub mod request;
pub mod response;
pub mod tile;
pub mod validate;

pub use plan::{padded_tokens, plan_passes, ItemShape, PassBudget};
pub use prefix_split::{prefix_parts, PrefixSplits, PrefixWalk};
pub use request::{Items, Query, ScoreRequest};
pub use response::{ScoreResponse, Usage};
pub use tile::{FragmentLoads, KvStaging, TilePacking, TileShape};
pub use validate::{token_ids, ModelLimits, RequestInput, ScoreInput, ValidationError};
