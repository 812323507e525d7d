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
use tally_core::{Items, Query, ScoreRequest};
use tally_engine::RequestPreparer;

use super::error::ApiError;
use super::AppState;
use crate::cli::RerankArgs;

pub const QWEN3_RERANKER_QUERY: &str = "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n<Instruct>: {instruction}\n<Query>: {query}\n";
pub const QWEN3_RERANKER_DOCUMENT: &str = "<Document>: {document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
pub const QWEN3_RERANKER_INSTRUCTION: &str = "Given a web search query, retrieve relevant passages that answer the query";

/// The prompt pieces and the yes/no token ids, resolved once at start-up.
pub struct RerankTemplate {
    query: String,
    document: String,
    instruction: String,
    /// `[yes, no]`, or why reranking is unavailable with this model (e.g. no tokenizer).
    labels: Result<[i64; 2], String>,
}

impl RerankTemplate {
    pub fn new(args: &RerankArgs, preparer: &RequestPreparer) -> Self {
        let single_token = |text: &str| -> Result<i64, String> {
            let tokenizer = preparer.tokenizer().map_err(|e| e.to_string())?;
            match tokenizer.encode(text).map_err(|e| e.to_string())?.as_slice() {
                [id] => Ok(*id),
                ids => Err(format!("rerank answer {text:?} is {} tokens, not one", ids.len())),
            }
        };
        let labels = single_token(&args.rerank_yes).and_then(|yes| Ok([yes, single_token(&args.rerank_no)?]));
        if let Err(reason) = &labels {
            tracing::warn!("/v1/rerank is disabled: {reason}");
        }
        RerankTemplate {
            query: args.rerank_query_template.clone(),
            document: args.rerank_document_template.clone(),
            instruction: args.rerank_instruction.clone(),
            labels,
        }
    }
}

#[derive(Deserialize)]
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
#[derive(Deserialize)]
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

#[derive(Serialize)]
pub struct RerankResponse {
    id: String,
    model: String,
    results: Vec<RerankResult>,
    usage: RerankUsage,
}

#[derive(Serialize)]
struct RerankResult {
    index: usize,
    relevance_score: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    document: Option<DocumentText>,
}

#[derive(Serialize)]
struct DocumentText {
    text: String,
}

#[derive(Serialize)]
struct RerankUsage {
    prompt_tokens: usize,
    total_tokens: usize,
}

pub async fn rerank(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Result<Json<RerankResponse>, ApiError> {
    let body = body.map_err(ApiError::unreadable_body)?;
    let request: RerankRequest = serde_json::from_slice(&body).map_err(ApiError::malformed)?;
    let template = &state.rerank;
    let [yes, no] = template.labels.clone().map_err(|reason| ApiError::new(StatusCode::BAD_REQUEST, format!("reranking is unavailable: {reason}")))?;
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

    let instruction = request.instruction.as_deref().unwrap_or(&template.instruction);
    let query = fill(&template.query, &[("{instruction}", instruction), ("{query}", &request.query)]);
    let items = request.documents.iter().map(|d| fill(&template.document, &[("{document}", d.text())])).collect();
    let score_request = ScoreRequest {
        query: Query::Text(query),
        items: Items::Texts(items),
        label_token_ids: vec![yes, no],
        apply_softmax: true, // softmax over [yes, no] is exactly P(yes) / (P(yes) + P(no))
        item_first: false,
        model: None,
    };
    let input = state.prepare(score_request).await?;
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

/// `template` with each placeholder replaced by its value in one left-to-right pass, so a value
/// that itself contains a placeholder (user text with `{query}`) is never substituted again.
fn fill(template: &str, values: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some((at, (placeholder, value))) = values.iter().filter_map(|&(p, v)| rest.find(p).map(|at| (at, (p, v)))).min_by_key(|&(at, _)| at) {
        out.push_str(&rest[..at]);
        out.push_str(value);
        rest = &rest[at + placeholder.len()..];
    }
    out.push_str(rest);
    out
}

fn next_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("rerank-{nanos:x}-{}", COUNTER.fetch_add(1, Relaxed))
}

#[cfg(test)]
mod tests {
    use super::fill;

    #[test]
    fn fill_substitutes_each_placeholder_once() {
        let template = "<I>: {instruction}\n<Q>: {query}\n";
        assert_eq!(fill(template, &[("{instruction}", "judge {query}"), ("{query}", "a {instruction} b")]), "<I>: judge {query}\n<Q>: a {instruction} b\n");
        assert_eq!(fill("{x}{x}", &[("{x}", "1")]), "11");
        assert_eq!(fill("none", &[("{x}", "1")]), "none");
    }
}
