//! `POST /v1/score`: SGLang's scoring API, same JSON in and out.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::Json;
use tally_core::{ScoreRequest, ScoreResponse};

use super::error::ApiError;
use super::AppState;

pub async fn score(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Result<Json<ScoreResponse>, ApiError> {
    let body = body.map_err(ApiError::unreadable_body)?;
    let request: ScoreRequest = serde_json::from_slice(&body).map_err(ApiError::malformed)?;
    state.check_items(request.items.len())?;
    state.check_labels(request.label_token_ids.len())?;
    let input = state.preparer.prepare(&request)?;
    let prompt_tokens = input.prompt_tokens();
    let scores = state.score(input).await?;
    let model = request.model.unwrap_or_else(|| state.preparer.model_name().to_owned());
    Ok(Json(ScoreResponse::new(scores, model, prompt_tokens)))
}
