//! vLLM's score API, `POST /score` and `/v1/score` with `{text_1, text_2}` (or vLLM's other
//! spellings: `data_1`/`data_2`, `queries` with `documents` or `items`): the relevance of text
//! pairs, as vLLM serves it for cross-encoders and rerankers. As in vLLM, one `text_1` is paired
//! with every `text_2` (1↔N), lists of equal length element by element (N↔N), anything else is
//! refused; answers and errors are in vLLM's shape. Each pair is a rerank question (`text_1` the
//! query, `text_2` the document); pairs that share a `text_1` run as one packed request with the
//! query once.

use std::collections::HashMap;
use std::sync::Arc;

use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use tally_engine::Truncation;

use super::error::{ApiError, VllmError};
use super::rerank::{next_id, relevance, RerankJob, Side};
use super::AppState;

/// The fields that make a `/v1/score` body vLLM's: no SGLang body has any of them.
pub const FIELDS: [&str; 5] = ["text_1", "text_2", "data_1", "data_2", "queries"];

#[derive(Deserialize, utoipa::ToSchema)]
pub struct PairScoreRequest {
    #[serde(default)]
    model: Option<String>,
    #[serde(alias = "data_1", alias = "queries")]
    text_1: Texts,
    #[serde(alias = "data_2", alias = "documents", alias = "items")]
    text_2: Texts,
    /// Each pair's prompt cut to this many tokens, the `text_2` side giving way (`-1`: the
    /// model's context length).
    #[serde(default)]
    truncate_prompt_tokens: Option<i64>,
    /// The end of `text_2` that gives way: `right` (default) or `left`.
    #[serde(default)]
    truncation_side: Option<Side>,
    /// Each `text_2` cut to this many tokens before templating (0: not cut).
    #[serde(default)]
    max_tokens_per_doc: usize,
}

/// One text or a list of texts.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
enum Texts {
    One(String),
    Many(Vec<String>),
}

impl Texts {
    fn into_vec(self) -> Vec<String> {
        match self {
            Texts::One(text) => vec![text],
            Texts::Many(texts) => texts,
        }
    }
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct PairScoreResponse {
    id: String,
    /// Always `"list"`.
    object: &'static str,
    created: u64,
    model: String,
    data: Vec<PairScore>,
    usage: PairUsage,
}

#[derive(Serialize, utoipa::ToSchema)]
struct PairScore {
    index: usize,
    /// Always `"score"`.
    object: &'static str,
    /// P(yes) / (P(yes) + P(no)) for the pair.
    score: f64,
}

#[derive(Serialize, utoipa::ToSchema)]
struct PairUsage {
    prompt_tokens: usize,
    total_tokens: usize,
    completion_tokens: usize,
}

/// The pairs `(text_1 index, text_2 index)` vLLM scores for lists of these lengths.
fn pairing(firsts: usize, seconds: usize) -> Result<Vec<(usize, usize)>, ApiError> {
    let error = |param: &str, message: String| Err(ApiError::new(StatusCode::BAD_REQUEST, message).with_param(param));
    match (firsts, seconds) {
        (0, _) => error("text_1", "`text_1` is an empty list".into()),
        (_, 0) => error("text_2", "`text_2` is an empty list".into()),
        (1, n) => Ok((0..n).map(|second| (0, second)).collect()),
        (a, b) if a == b => Ok((0..a).map(|i| (i, i)).collect()),
        (a, b) => error("text_2", format!("input lengths must be either 1:1, 1:N or N:N; `text_1` has {a} texts and `text_2` {b}")),
    }
}

/// Scores vLLM's text pairs; `fields` is the body, already known to hold `text_1`/`text_2`.
pub async fn score(state: &AppState, fields: serde_json::Map<String, serde_json::Value>) -> Result<Json<PairScoreResponse>, VllmError> {
    let request: PairScoreRequest = super::parse(fields)?;
    let model = state.model_name(request.model.as_deref())?;
    let truncation = Truncation {
        document_tokens: (request.max_tokens_per_doc > 0).then_some(request.max_tokens_per_doc),
        prompt_tokens: state.prompt_budget(request.truncate_prompt_tokens, "truncate_prompt_tokens")?,
        side: request.truncation_side.unwrap_or_default().into(),
    };
    let (firsts, seconds) = (request.text_1.into_vec(), request.text_2.into_vec());
    let pairs = pairing(firsts.len(), seconds.len())?;

    // One job per distinct `text_1`, in order of first appearance; each pair's place in it.
    let mut jobs: Vec<(usize, Vec<String>)> = Vec::new();
    let mut job_of_query: HashMap<&str, usize> = HashMap::new();
    let mut places = Vec::with_capacity(pairs.len());
    for &(first, second) in &pairs {
        let job = *job_of_query.entry(&firsts[first]).or_insert_with(|| {
            jobs.push((first, Vec::new()));
            jobs.len() - 1
        });
        places.push((job, jobs[job].1.len()));
        jobs[job].1.push(seconds[second].clone());
    }
    let jobs = jobs
        .into_iter()
        .map(|(first, documents)| RerankJob { query: firsts[first].clone(), instruction: None, documents: Arc::new(documents), truncation, query_field: "text_1", documents_field: "text_2" })
        .collect();
    let answers = relevance(state, jobs).await?;
    let data = places.iter().enumerate().map(|(index, &(job, place))| PairScore { index, object: "score", score: answers[job].scores[place] }).collect();
    let prompt_tokens = answers.iter().map(|answer| answer.prompt_tokens).sum();
    Ok(Json(PairScoreResponse {
        id: next_id("score"),
        object: "list",
        created: super::unix_seconds(),
        model,
        data,
        usage: PairUsage { prompt_tokens, total_tokens: prompt_tokens, completion_tokens: 0 },
    }))
}

#[cfg(test)]
mod tests {
    use super::pairing;

    #[test]
    fn pairs_one_to_many_and_element_by_element() {
        assert_eq!(pairing(1, 3).unwrap(), [(0, 0), (0, 1), (0, 2)]);
        assert_eq!(pairing(2, 2).unwrap(), [(0, 0), (1, 1)]);
        assert_eq!(pairing(1, 1).unwrap(), [(0, 0)]);
        for (firsts, seconds, param) in [(2, 3, "text_2"), (2, 1, "text_2"), (0, 1, "text_1"), (1, 0, "text_2")] {
            let error = pairing(firsts, seconds).unwrap_err();
            assert_eq!((error.status.as_u16(), error.param.as_deref()), (400, Some(param)), "{firsts}, {seconds}: {}", error.message);
        }
    }
}
