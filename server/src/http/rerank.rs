//! Reranking on top of scoring: each (query, document) pair becomes a yes/no question, and a
//! document's relevance is P(yes) / (P(yes) + P(no)) after the prompt — by default the
//! Qwen3-Reranker template. This module holds that shared step ([`relevance`]) and the
//! Cohere-shaped routes: `POST /v1/rerank` and `/rerank` (Cohere v1, Jina and vLLM send
//! `documents`; a TEI client's `texts` goes to [`super::tei`]) and `POST /v2/rerank` (Cohere v2).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use tally_engine::{Truncation, TruncationSide};

use super::error::{ApiError, ApiErrors};
use super::AppState;

/// Relevance of each document to the query, in the documents' order.
pub(super) struct Relevance {
    pub scores: Vec<f64>,
    /// Tokens run: the query side once plus every (truncated) document side.
    pub prompt_tokens: usize,
}

/// One rerank question: a query against documents, named by the fields the client sent them in
/// (for errors that point at the client's own field).
pub(super) struct RerankJob {
    pub query: String,
    pub instruction: Option<String>,
    pub documents: Arc<Vec<String>>,
    pub truncation: Truncation,
    pub query_field: &'static str,
    pub documents_field: &'static str,
}

impl RerankJob {
    /// The cheap checks, before any tokenizing: nothing empty.
    fn check(&self) -> Result<(), ApiError> {
        if self.documents.is_empty() {
            return Err(ApiError::new(StatusCode::BAD_REQUEST, format!("`{}` must contain at least one document", self.documents_field)).with_param(self.documents_field));
        }
        if self.query.is_empty() {
            return Err(ApiError::new(StatusCode::BAD_REQUEST, format!("`{}` is empty", self.query_field)).with_param(self.query_field));
        }
        if let Some(index) = self.documents.iter().position(String::is_empty) {
            return Err(ApiError::new(StatusCode::BAD_REQUEST, format!("document {index} of `{}` is empty", self.documents_field)).with_param(self.documents_field));
        }
        Ok(())
    }

    fn text_bytes(&self) -> usize {
        self.query.len() + self.instruction.as_ref().map_or(0, String::len) + self.documents.iter().map(String::len).sum::<usize>()
    }
}

/// Scores every job (one client request; several when a vLLM client pairs many queries with
/// documents), each job's documents in one packed pass, all jobs queued together.
pub(super) async fn relevance(state: &AppState, jobs: Vec<RerankJob>) -> Result<Vec<Relevance>, ApiError> {
    let reranker = state.rerank.as_ref().map_err(|reason| ApiError::new(StatusCode::BAD_REQUEST, format!("reranking is unavailable: {reason}")))?;
    let reranker = Arc::clone(reranker);
    for job in &jobs {
        job.check()?;
    }
    state.check_items(jobs.iter().map(|job| job.documents.len()).sum())?;
    let documents_field = jobs.first().map_or("documents", |job| job.documents_field);
    state.check_text_bytes(jobs.iter().map(RerankJob::text_bytes).sum(), documents_field)?;
    // Validation names scoring's fields (`items`); a rerank client's documents field is its own.
    let inputs = state
        .off_runtime(move || {
            jobs.iter()
                .map(|job| {
                    let documents: Vec<&str> = job.documents.iter().map(String::as_str).collect();
                    reranker.prepare(&job.query, job.instruction.as_deref(), &documents, job.truncation)
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .await
        .map_err(|error| if error.param.as_deref() == Some("items") { error.with_param(documents_field) } else { error })?;
    let prompt_tokens: Vec<usize> = inputs.iter().map(|input| input.prompt_tokens()).collect();
    let mut answers = Vec::with_capacity(inputs.len());
    for (answer, prompt_tokens) in state.submit(inputs)?.into_iter().zip(prompt_tokens) {
        let scores = answer.await?;
        answers.push(Relevance { scores: scores.iter().map(|labels| labels[0]).collect(), prompt_tokens });
    }
    Ok(answers)
}

/// Document indices by relevance, most relevant first (ties by index), at most `top_n`.
pub(super) fn ranked(scores: &[f64], top_n: Option<usize>) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    order.truncate(top_n.unwrap_or(usize::MAX));
    order
}

/// `<kind>-<time>-<n>` (`rerank-…`, `score-…`): unique within the process, unlikely across restarts.
pub(super) fn next_id(kind: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{kind}-{nanos:x}-{}", COUNTER.fetch_add(1, Relaxed))
}

/// A Cohere v1, Jina or vLLM rerank request.
#[derive(Deserialize, utoipa::ToSchema)]
pub struct RerankRequest {
    #[serde(default)]
    model: Option<String>,
    query: String,
    documents: Vec<Document>,
    #[serde(default)]
    top_n: Option<usize>,
    /// Each result's document text (default: `true`, as vLLM always answers and Jina documents).
    #[serde(default)]
    return_documents: Option<bool>,
    /// Task instruction for instruction-tuned rerankers; the server's default otherwise.
    #[serde(default)]
    instruction: Option<String>,
    /// vLLM's: each (query, document) prompt cut to this many tokens, the document giving way
    /// (`-1`: the model's context length).
    #[serde(default)]
    truncate_prompt_tokens: Option<i64>,
    /// vLLM's: the end of a document that gives way, `right` (default) or `left`.
    #[serde(default)]
    truncation_side: Option<Side>,
    /// Cohere's and vLLM's: each document cut to this many tokens before templating (0: not cut).
    #[serde(default)]
    max_tokens_per_doc: Option<usize>,
}

/// The end of a document that gives way: vLLM's `truncation_side` spells it `left`/`right`,
/// TEI's `truncation_direction` `Left`/`Right`; both spellings are taken everywhere.
#[derive(Deserialize, utoipa::ToSchema, Default, Clone, Copy)]
#[serde(rename_all = "lowercase")]
#[schema(as = TruncationSide)]
pub(super) enum Side {
    #[serde(alias = "Left")]
    Left,
    #[default]
    #[serde(alias = "Right")]
    Right,
}

impl From<Side> for TruncationSide {
    fn from(side: Side) -> Self {
        match side {
            Side::Left => TruncationSide::Left,
            Side::Right => TruncationSide::Right,
        }
    }
}

/// A document as a plain string or as `{"text": ...}`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
enum Document {
    Text(String),
    Object { text: String },
}

impl Document {
    fn into_text(self) -> String {
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

/// The two bodies `/v1/rerank` and `/rerank` take, told apart by their fields.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
#[allow(dead_code)] // only described: the handler parses each kind itself
enum RerankBody {
    Documents(RerankRequest),
    Texts(super::tei::RerankRequest),
}

#[derive(Serialize, utoipa::ToSchema)]
#[serde(untagged)]
#[allow(dead_code)] // only described
enum RerankAnswer {
    Documents(RerankResponse),
    Texts(Vec<super::tei::Rank>),
}

/// Documents by relevance: P(yes) / (P(yes) + P(no)) after the rerank prompt, in Cohere v1's,
/// Jina's and vLLM's shape; a TEI body (`texts` instead of `documents`) is answered in TEI's
/// shape, a bare list, with TEI's error body (`{error, error_type}`). Also at `/rerank`.
#[utoipa::path(post, tag = "reranking", path = "/v1/rerank", request_body = RerankBody,
    responses((status = 200, description = "Documents, most relevant first", body = RerankAnswer), ApiErrors,
        (status = "4XX", description = "A TEI request's errors", body = super::tei::ErrorBody)))]
pub async fn rerank(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let body = match body.map_err(ApiError::unreadable_body).and_then(|body| super::fields(&body)) {
        Ok(fields) => fields,
        Err(error) => return error.into_response(),
    };
    if fields_name_tei(&body) {
        return super::tei::rerank(&state, body).await;
    }
    cohere_v1(&state, body).await.into_response()
}

/// TEI's body names its documents `texts`; every other client's, `documents`.
fn fields_name_tei(fields: &serde_json::Map<String, serde_json::Value>) -> bool {
    fields.contains_key("texts") && !fields.contains_key("documents")
}

async fn cohere_v1(state: &AppState, body: serde_json::Map<String, serde_json::Value>) -> Result<Json<RerankResponse>, ApiError> {
    let request: RerankRequest = super::parse(body)?;
    let model = state.model_name(request.model.as_deref())?;
    let truncation = Truncation {
        document_tokens: request.max_tokens_per_doc.filter(|&tokens| tokens > 0),
        prompt_tokens: state.prompt_budget(request.truncate_prompt_tokens, "truncate_prompt_tokens")?,
        side: request.truncation_side.unwrap_or_default().into(),
    };
    let documents = Arc::new(request.documents.into_iter().map(Document::into_text).collect::<Vec<_>>());
    let job = RerankJob { query: request.query, instruction: request.instruction, documents: Arc::clone(&documents), truncation, query_field: "query", documents_field: "documents" };
    let relevance = relevance(state, vec![job]).await?.pop().expect("one job, one answer");
    let results = ranked(&relevance.scores, request.top_n)
        .into_iter()
        .map(|index| RerankResult {
            index,
            relevance_score: relevance.scores[index],
            document: request.return_documents.unwrap_or(true).then(|| DocumentText { text: documents[index].clone() }),
        })
        .collect();
    let usage = RerankUsage { prompt_tokens: relevance.prompt_tokens, total_tokens: relevance.prompt_tokens };
    Ok(Json(RerankResponse { id: next_id("rerank"), model, results, usage }))
}

/// A Cohere v2 rerank request (`cohere.ClientV2().rerank`): documents are strings.
#[derive(Deserialize, utoipa::ToSchema)]
pub struct RerankV2Request {
    #[serde(default)]
    model: Option<String>,
    query: String,
    documents: Vec<String>,
    #[serde(default)]
    top_n: Option<usize>,
    /// Each document cut to this many tokens before templating (Cohere's default: 4,096).
    #[serde(default)]
    max_tokens_per_doc: Option<usize>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct RerankV2Response {
    id: String,
    results: Vec<RerankV2Result>,
    meta: RerankV2Meta,
}

#[derive(Serialize, utoipa::ToSchema)]
struct RerankV2Result {
    index: usize,
    relevance_score: f64,
}

/// Cohere's `meta`: the API version, and tokens counted as Cohere bills them.
#[derive(Serialize, utoipa::ToSchema)]
struct RerankV2Meta {
    api_version: ApiVersion,
    billed_units: BilledUnits,
}

#[derive(Serialize, utoipa::ToSchema)]
struct ApiVersion {
    version: &'static str,
}

#[derive(Serialize, utoipa::ToSchema)]
struct BilledUnits {
    input_tokens: usize,
}

/// Cohere v2's rerank: documents by relevance, `{id, results, meta}`.
#[utoipa::path(post, tag = "reranking", path = "/v2/rerank", request_body = RerankV2Request,
    responses((status = 200, description = "Documents, most relevant first", body = RerankV2Response), ApiErrors))]
pub async fn rerank_v2(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Result<Json<RerankV2Response>, ApiError> {
    let body = body.map_err(ApiError::unreadable_body)?;
    let request: RerankV2Request = serde_json::from_slice(&body).map_err(ApiError::malformed)?;
    state.model_name(request.model.as_deref())?;
    let truncation = Truncation { document_tokens: request.max_tokens_per_doc.filter(|&tokens| tokens > 0), ..Truncation::default() };
    let job = RerankJob { query: request.query, instruction: None, documents: Arc::new(request.documents), truncation, query_field: "query", documents_field: "documents" };
    let relevance = relevance(&state, vec![job]).await?.pop().expect("one job, one answer");
    let results = ranked(&relevance.scores, request.top_n).into_iter().map(|index| RerankV2Result { index, relevance_score: relevance.scores[index] }).collect();
    let meta = RerankV2Meta { api_version: ApiVersion { version: "2" }, billed_units: BilledUnits { input_tokens: relevance.prompt_tokens } };
    Ok(Json(RerankV2Response { id: next_id("rerank"), results, meta }))
}
