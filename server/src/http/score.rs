//! `POST /v1/score` and `/score`: SGLang's scoring API (`query`, `items`, `label_token_ids`),
//! same JSON in and out; a body with vLLM's `text_1`/`text_2` (or its other spellings) instead
//! is vLLM's score API ([`super::pairs`]).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use tally_core::{ScoreRequest, ScoreResponse};

use super::error::{ApiError, ApiErrors};
use super::pairs::{PairScoreRequest, PairScoreResponse};
use super::AppState;

/// The two bodies `/v1/score` takes, told apart by their fields.
#[derive(serde::Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
#[allow(dead_code)] // only described: the handler parses each kind itself
enum ScoreBody {
    Labels(ScoreRequest),
    Pairs(PairScoreRequest),
}

#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(untagged)]
#[allow(dead_code)] // only described
enum ScoreAnswer {
    Labels(ScoreResponse),
    Pairs(PairScoreResponse),
}

/// SGLang's body: the probability of each label token after query + item, for every item. vLLM's
/// (`text_1`, `text_2`): the relevance of each text pair, P(yes) / (P(yes) + P(no)) after the
/// rerank prompt. Also at `/score`.
#[utoipa::path(post, tag = "scoring", path = "/v1/score", request_body = ScoreBody,
    responses((status = 200, description = "SGLang's `scores[i][j]` (label `j` after item `i`), or vLLM's `data[i].score` for pair `i`", body = ScoreAnswer), ApiErrors))]
pub async fn score(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let fields = match body.map_err(ApiError::unreadable_body).and_then(|body| super::fields(&body)) {
        Ok(fields) => fields,
        Err(error) => return error.into_response(),
    };
    if super::pairs::FIELDS.iter().any(|field| fields.contains_key(*field)) {
        return super::pairs::score(&state, fields).await.into_response();
    }
    label_scores(&state, fields).await.into_response()
}

async fn label_scores(state: &AppState, fields: serde_json::Map<String, serde_json::Value>) -> Result<Json<ScoreResponse>, ApiError> {
    Ok(Json(scored(state, super::parse(fields)?).await?))
}

/// A label-scoring request through validation and the queue: SGLang's answer, which vLLM's
/// generative scoring reshapes.
pub(super) async fn scored(state: &AppState, request: ScoreRequest) -> Result<ScoreResponse, ApiError> {
    let model = state.model_name(request.model.as_deref())?;
    let input = state.prepare(request).await?;
    let prompt_tokens = input.prompt_tokens();
    let scores = state.score(input).await?;
    Ok(ScoreResponse::new(scores, model, prompt_tokens))
}
