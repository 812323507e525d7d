//! `POST /v1/rerank` (and `/rerank`): Cohere / Jina / TEI-style reranking on top of scoring.
//! Each document's relevance is P(yes) / (P(yes) + P(no)) after a yes/no prompt — by default
//! the Qwen3-Reranker template.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::error::{ApiError, ApiErrors};
use super::AppState;

#[derive(Deserialize, utoipa::ToSchema)]
pub struct RerankRequest {
    #[serde(default)]
    model: Option<String>,
    query: String,
    documents: Vec<Document>,
    #[serde(default)]
    top_n: Option<usize>,
    #[serde(default)]
    return_documents: bool,
    /// Task instruction for instruction-tuned rerankers; the server's default otherwise.
    #[serde(default)]
    instruction: Option<String>,
}

/// A document as a plain string or as `{"text": ...}`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
enum Document {
    Text(String),
    Object { text: String },
}

impl Document {
    fn text(&self) -> &str {
        match self {
            Document::Text(text) | Document::Object { text } => text,
        }
    }
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct RerankResponse {
    id: String,
    model: String,
    results: Vec<RerankResult>,
    usage: RerankUsage,
}

#[derive(Serialize, utoipa::ToSchema)]
struct RerankResult {
    index: usize,
    relevance_score: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    document: Option<DocumentText>,
}

#[derive(Serialize, utoipa::ToSchema)]
struct DocumentText {
    text: String,
}

#[derive(Serialize, utoipa::ToSchema)]
struct RerankUsage {
    prompt_tokens: usize,
    total_tokens: usize,
}

/// Documents by relevance: P(yes) / (P(yes) + P(no)) after the rerank prompt. Also at `/rerank`.
#[utoipa::path(post, tag = "scoring", path = "/v1/rerank", request_body = RerankRequest,
    responses((status = 200, description = "Documents, most relevant first", body = RerankResponse), ApiErrors))]
pub async fn rerank(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Result<Json<RerankResponse>, ApiError> {
    let body = body.map_err(ApiError::unreadable_body)?;
    let request: RerankRequest = serde_json::from_slice(&body).map_err(ApiError::malformed)?;
    let reranker = state.rerank.as_ref().map_err(|reason| ApiError::new(StatusCode::BAD_REQUEST, format!("reranking is unavailable: {reason}")))?;
    let model = state.model_name(request.model.as_deref())?;
    state.check_items(request.documents.len())?;
    if request.documents.is_empty() {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, "`documents` must contain at least one document").with_param("documents"));
    }
    if request.query.is_empty() {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, "`query` is empty").with_param("query"));
    }
    if let Some(index) = request.documents.iter().position(|d| d.text().is_empty()) {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, format!("document {index} is empty")).with_param("documents"));
    }
    let text_bytes = request.query.len() + request.instruction.as_ref().map_or(0, String::len) + request.documents.iter().map(|d| d.text().len()).sum::<usize>();
    state.check_text_bytes(text_bytes, "documents")?;

    let request = Arc::new(request);
    let reranker = Arc::clone(reranker);
    let input = state
        .off_runtime({
            let request = Arc::clone(&request);
            move || {
                let documents: Vec<&str> = request.documents.iter().map(Document::text).collect();
                reranker.prepare(&request.query, request.instruction.as_deref(), &documents)
            }
        })
        .await?;
    let prompt_tokens = input.prompt_tokens();
    let scores = state.score(input).await?;

    let mut results: Vec<RerankResult> = scores
        .iter()
        .enumerate()
        .map(|(index, score)| RerankResult {
            index,
            relevance_score: score[0],
            document: request.return_documents.then(|| DocumentText { text: request.documents[index].text().to_owned() }),
        })
        .collect();
    results.sort_by(|a, b| b.relevance_score.total_cmp(&a.relevance_score).then(a.index.cmp(&b.index)));
    results.truncate(request.top_n.unwrap_or(usize::MAX));
    Ok(Json(RerankResponse {
        id: next_id(),
        model,
        results,
        usage: RerankUsage { prompt_tokens, total_tokens: prompt_tokens },
    }))
}

fn next_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("rerank-{nanos:x}-{}", COUNTER.fetch_add(1, Relaxed))
}
