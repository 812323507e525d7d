//! `POST /v1/score`: SGLang's scoring API, same JSON in and out.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::Json;
use tally_core::{ScoreRequest, ScoreResponse};

use super::error::{ApiError, ApiErrors};
use super::AppState;

/// Probability of each label token after query + item, for every item.
#[utoipa::path(post, tag = "scoring", path = "/v1/score", request_body = ScoreRequest,
    responses((status = 200, description = "`scores[i][j]`: label `j` after item `i`", body = ScoreResponse), ApiErrors))]
pub async fn score(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Result<Json<ScoreResponse>, ApiError> {
    let body = body.map_err(ApiError::unreadable_body)?;
    let request: ScoreRequest = serde_json::from_slice(&body).map_err(ApiError::malformed)?;
    let model = state.model_name(request.model.as_deref())?;
    let input = state.prepare(request).await?;
    let prompt_tokens = input.prompt_tokens();
    let scores = state.score(input).await?;
    Ok(Json(ScoreResponse::new(scores, model, prompt_tokens)))
}
