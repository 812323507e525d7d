//! Text Embeddings Inference's `POST /rerank`, as TEI clients (Haystack's `HuggingFaceTEIRanker`,
//! `huggingface_hub`, LangChain's) send it: `{query, texts, raw_scores, return_text, truncate,
//! truncation_direction}` in, a bare list of `{index, score, text?}` out, most relevant first,
//! and errors as TEI writes them: `{"error": "...", "error_type": "..."}`.

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use tally_engine::Truncation;

use super::error::ApiError;
use super::rerank::{ranked, relevance, RerankJob, Side};
use super::AppState;

#[derive(Deserialize, utoipa::ToSchema)]
#[schema(as = TeiRerankRequest)]
pub struct RerankRequest {
    query: String,
    texts: Vec<String>,
    /// Cut each (query, text) prompt to the model's context length instead of refusing it
    /// (default: true, as TEI's `--auto-truncate` defaults).
    #[serde(default)]
    truncate: Option<bool>,
    /// Which end of a text gives way when it is cut.
    #[serde(default)]
    truncation_direction: Side,
    /// Scores as logits, log(P(yes) / P(no)), instead of probabilities.
    #[serde(default)]
    raw_scores: bool,
    #[serde(default)]
    return_text: bool,
}

#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = TeiRank)]
pub struct Rank {
    index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<String>,
    score: f64,
}

/// TEI's error body.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = TeiError)]
pub struct ErrorBody {
    error: String,
    /// `Validation`, `Tokenizer`, `Overloaded`, `Unhealthy` or `Backend`.
    error_type: &'static str,
}

/// An [`ApiError`] in TEI's shape, with the same status.
pub struct TeiError(ApiError);

impl From<ApiError> for TeiError {
    fn from(error: ApiError) -> Self {
        TeiError(error)
    }
}

impl IntoResponse for TeiError {
    fn into_response(self) -> Response {
        let error_type = match self.0.status {
            StatusCode::SERVICE_UNAVAILABLE => "Overloaded",
            status if status.is_server_error() => "Backend",
            _ => "Validation",
        };
        let body = serde_json::to_string(&ErrorBody { error: self.0.message.clone(), error_type }).expect("an error body serializes");
        self.0.respond_with(body)
    }
}

/// TEI's rerank, reached through `/rerank` and `/v1/rerank` when the body has `texts`.
pub async fn rerank(state: &AppState, fields: serde_json::Map<String, serde_json::Value>) -> Response {
    match rank(state, fields).await {
        Ok(ranks) => Json(ranks).into_response(),
        Err(error) => error.into_response(),
    }
}

async fn rank(state: &AppState, fields: serde_json::Map<String, serde_json::Value>) -> Result<Vec<Rank>, TeiError> {
    let request: RerankRequest = super::parse(fields)?;
    let prompt_tokens = request.truncate.unwrap_or(true).then(|| state.preparer.limits().max_positions);
    let truncation = Truncation { prompt_tokens, side: request.truncation_direction.into(), ..Truncation::default() };
    let texts = Arc::new(request.texts);
    let job = RerankJob { query: request.query, instruction: None, documents: Arc::clone(&texts), truncation, query_field: "query", documents_field: "texts" };
    let relevance = relevance(state, vec![job]).await?.pop().expect("one job, one answer");
    let ranks = ranked(&relevance.scores, None)
        .into_iter()
        .map(|index| {
            let probability = relevance.scores[index];
            Rank { index, text: request.return_text.then(|| texts[index].clone()), score: if request.raw_scores { logit(probability) } else { probability } }
        })
        .collect();
    Ok(ranks)
}

/// log(p / (1 − p)) = logit(yes) − logit(no): what a sequence-classification reranker's raw score
/// is, and what TEI turns into the probability with a sigmoid. Probabilities arrive as float32
/// values, so p is held half a float32 ulp inside (0, 1): the logit stays finite (|x| ≤ ~17).
fn logit(probability: f64) -> f64 {
    let margin = f64::from(f32::EPSILON) / 2.0;
    let p = probability.clamp(margin, 1.0 - margin);
    (p / (1.0 - p)).ln()
}

#[cfg(test)]
mod tests {
    use super::logit;

    #[test]
    fn logits_invert_the_sigmoid_and_stay_finite() {
        for x in [-8.0f64, -1.0, 0.0, 0.5, 3.0] {
            let p = 1.0 / (1.0 + (-x).exp());
            assert!((logit(p) - x).abs() < 1e-9, "{x}");
        }
        assert!(logit(1.0).is_finite() && logit(1.0) > 15.0);
        assert!(logit(0.0).is_finite() && logit(0.0) < -15.0);
    }
}
