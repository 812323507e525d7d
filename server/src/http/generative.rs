//! vLLM's `POST /generative_scoring`: SGLang's scoring job (query, items, `label_token_ids`,
//! `apply_softmax`, `item_first`) in vLLM's request and response shape, where each item's
//! `score` is the probability of the first label.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use tally_core::{Items, Query, ScoreRequest};

use super::error::{ApiError, ApiErrors, VllmError};
use super::rerank::next_id;
use super::AppState;

#[derive(Deserialize, utoipa::ToSchema)]
pub struct GenerativeScoringRequest {
    #[serde(default)]
    model: Option<String>,
    query: Query,
    items: Items,
    label_token_ids: Vec<i64>,
    /// `true` (vLLM's default): softmax over the label logits only; `false`: full-vocabulary
    /// probabilities.
    #[serde(default = "yes")]
    apply_softmax: bool,
    #[serde(default)]
    item_first: bool,
}

fn yes() -> bool {
    true
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct GenerativeScoringResponse {
    id: String,
    /// Always `"list"`.
    object: &'static str,
    created: u64,
    model: String,
    data: Vec<ItemScore>,
    usage: tally_core::Usage,
}

#[derive(Serialize, utoipa::ToSchema)]
struct ItemScore {
    index: usize,
    /// Always `"score"`.
    object: &'static str,
    /// The probability of the first label after item `index`.
    score: f64,
}

/// The probability of the first label token after query + item, for every item (vLLM).
#[utoipa::path(post, tag = "scoring", path = "/generative_scoring", request_body = GenerativeScoringRequest,
    responses((status = 200, description = "`data[i].score`: the first label's probability after item `i`", body = GenerativeScoringResponse), ApiErrors))]
pub async fn generative_scoring(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Result<Json<GenerativeScoringResponse>, VllmError> {
    let body = body.map_err(ApiError::unreadable_body)?;
    let request: GenerativeScoringRequest = serde_json::from_slice(&body).map_err(ApiError::malformed)?;
    let request = ScoreRequest {
        query: request.query,
        items: request.items,
        label_token_ids: request.label_token_ids,
        apply_softmax: request.apply_softmax,
        item_first: request.item_first,
        model: request.model,
    };
    let answer = super::score::scored(&state, request).await?;
    let data = answer.scores.iter().enumerate().map(|(index, labels)| ItemScore { index, object: "score", score: labels[0] }).collect();
    let id = next_id("generative-scoring");
    Ok(Json(GenerativeScoringResponse { id, object: "list", created: super::unix_seconds(), model: answer.model, data, usage: answer.usage }))
}
