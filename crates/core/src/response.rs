//! The `/v1/score` response, as SGLang returns it.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ScoreResponse {
    /// `scores[i][j]`: probability of `label_token_ids[j]` after item `i`.
    pub scores: Vec<Vec<f64>>,
    pub model: String,
    pub usage: Usage,
    pub object: String,
}

/// Token accounting. `prompt_tokens` counts the tokens tally actually ran: the query once plus
/// every item (with `item_first`, the query once per item, since it cannot be shared).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

impl Usage {
    pub fn prompt(prompt_tokens: usize) -> Self {
        Usage { prompt_tokens, completion_tokens: 0, total_tokens: prompt_tokens }
    }
}

impl ScoreResponse {
    pub fn new(scores: Vec<Vec<f64>>, model: String, prompt_tokens: usize) -> Self {
        ScoreResponse { scores, model, usage: Usage::prompt(prompt_tokens), object: "scoring".to_owned() }
    }
}
