//! The HTTP API: routes, shared state, limits. Every handler parses and validates on the async
//! side, then hands valid work to the engine's scheduler and awaits its answer.

pub mod auth;
pub mod error;
pub mod generative;
pub mod metrics;
pub mod openapi;
pub mod pairs;
pub mod parse_errors;
pub mod prefix_header;
pub mod readiness;
pub mod rerank;
pub mod score;
pub mod tei;
pub mod web;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::http::{header, Method, StatusCode};
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::decompression::RequestDecompressionLayer;
use tower_http::timeout::RequestBodyTimeoutLayer;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use tally_core::{ScoreInput, ScoreRequest};
use tokio::sync::Semaphore;
use tally_engine::{RequestError, RequestPreparer, Reranker, Scheduler};

use auth::AuthConfig;
use error::ApiError;
use metrics::{HttpMetrics, MetricNames};
use readiness::Lifecycle;

/// Per-request limits, all configurable on the command line.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    pub max_items: usize,
    pub max_labels: usize,
    pub max_tokens: usize,
    pub max_body_bytes: usize,
    /// Text bytes per request, checked before tokenizing.
    pub max_text_bytes: usize,
    pub timeout: Duration,
    /// Without progress while reading a body.
    pub body_timeout: Duration,
}

pub struct AppState {
    scheduler: Scheduler,
    preparer: RequestPreparer,
    /// Or why reranking is unavailable with this model (no tokenizer, say).
    rerank: Result<Arc<Reranker>, String>,
    limits: ServerLimits,
    metrics: HttpMetrics,
    started: std::time::SystemTime,
    /// Tokenization runs on the blocking pool, at most one request per core at a time, so long
    /// texts never stall the async runtime (and `/health`).
    tokenizing: Semaphore,
    auth: AuthConfig,
    /// `--served-model-name`: the names requests may give; the first is the one answers carry.
    served_names: Vec<String>,
    /// Loading, ready or draining, and the scoring requests under way.
    lifecycle: Arc<Lifecycle>,
    /// `--metrics-compat`: other engines' names `/metrics` also gives the picker's gauges.
    metric_names: Vec<MetricNames>,
}

/// What the server is besides its engine: its names, limits, keys and where it is in its life.
pub struct ServerSetup {
    pub limits: ServerLimits,
    pub auth: AuthConfig,
    pub served_names: Vec<String>,
    pub lifecycle: Arc<Lifecycle>,
    pub metric_names: Vec<MetricNames>,
}

impl AppState {
    pub fn new(scheduler: Scheduler, preparer: RequestPreparer, rerank: Result<Arc<Reranker>, String>, setup: ServerSetup) -> Self {
        let ServerSetup { limits, auth, served_names, lifecycle, metric_names } = setup;
        assert!(!served_names.is_empty(), "a server answers to at least one name");
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let started = std::time::SystemTime::now();
        AppState { scheduler, preparer, rerank, limits, metrics: HttpMetrics::default(), started, tokenizing: Semaphore::new(cores), auth, served_names, lifecycle, metric_names }
    }

    /// Tokenizes and validates a request off the async runtime, after the cheap size checks.
    async fn prepare(&self, request: ScoreRequest) -> Result<ScoreInput, ApiError> {
        self.check_items(request.items.len())?;
        self.check_labels(request.label_token_ids.len())?;
        let text_bytes = request.text_bytes();
        if text_bytes == 0 {
            return Ok(self.preparer.prepare(&request)?);
        }
        self.check_text_bytes(text_bytes, "items")?;
        let preparer = self.preparer.clone();
        self.off_runtime(move || preparer.prepare(&request)).await
    }

    /// Runs tokenization on the blocking pool, a request per core at a time.
    async fn off_runtime<T: Send + 'static>(&self, work: impl FnOnce() -> Result<T, RequestError> + Send + 'static) -> Result<T, ApiError> {
        let _permit = self.tokenizing.acquire().await.map_err(|_| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down"))?;
        let done = tokio::task::spawn_blocking(work).await;
        Ok(done.map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("tokenization failed: {e}")))??)
    }

    fn check_text_bytes(&self, text_bytes: usize, param: &str) -> Result<(), ApiError> {
        if text_bytes > self.limits.max_text_bytes {
            let message = format!("request has {text_bytes} bytes of text; this server takes at most {}", self.limits.max_text_bytes);
            return Err(ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, message).with_param(param));
        }
        Ok(())
    }

    /// Checks the server's size limits, queues the input, and waits for its scores.
    async fn score(&self, input: ScoreInput) -> Result<Vec<Vec<f64>>, ApiError> {
        self.submit(vec![input])?.pop().expect("one input, one answer").await
    }

    /// Checks the server's size limits on `inputs` together (one client request), queues them
    /// all at once so the scheduler may batch them, and returns each one's answer to await.
    fn submit(&self, inputs: Vec<ScoreInput>) -> Result<Vec<impl std::future::Future<Output = Result<Vec<Vec<f64>>, ApiError>>>, ApiError> {
        let prompt_tokens: usize = inputs.iter().map(ScoreInput::prompt_tokens).sum();
        if prompt_tokens > self.limits.max_tokens {
            let message = format!("request has {prompt_tokens} prompt tokens; this server takes at most {}", self.limits.max_tokens);
            return Err(ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, message).with_param("items"));
        }
        let deadline = Instant::now() + self.limits.timeout;
        let timeout = self.limits.timeout;
        let answers = inputs.into_iter().map(|input| self.scheduler.submit(input, deadline)).collect::<Result<Vec<_>, _>>()?;
        Ok(answers
            .into_iter()
            .map(move |answer| async move {
                match tokio::time::timeout_at(deadline.into(), answer).await {
                    Ok(Ok(result)) => {
                        let scored = result?;
                        prefix_header::note(scored.prefix_cache);
                        Ok(scored.scores)
                    }
                    Ok(Err(_)) => Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down")),
                    Err(_) => Err(ApiError::new(StatusCode::GATEWAY_TIMEOUT, format!("request timed out after {timeout:?}"))),
                }
            })
            .collect())
    }

    fn check_items(&self, items: usize) -> Result<(), ApiError> {
        if items > self.limits.max_items {
            let message = format!("request has {items} items; this server takes at most {}", self.limits.max_items);
            return Err(ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, message).with_param("items"));
        }
        Ok(())
    }

    /// The name responses carry: the first served name, as vLLM answers. Like vLLM, a request
    /// naming a model this server does not serve gets 404 rather than an answer under that name.
    fn model_name(&self, requested: Option<&str>) -> Result<String, ApiError> {
        match requested {
            Some(name) if !self.served_names.iter().any(|served| served == name) => {
                let served = self.served_names.iter().map(|name| format!("`{name}`")).collect::<Vec<_>>().join(", ");
                Err(ApiError::new(StatusCode::NOT_FOUND, format!("the model `{name}` does not exist; this server serves {served}")).with_param("model"))
            }
            _ => Ok(self.served_names[0].clone()),
        }
    }

    /// The prompt budget a client's `truncate_prompt_tokens` asks for (vLLM's meaning: `-1` is
    /// the model's context length; more than that is an error, not a silent cap).
    fn prompt_budget(&self, asked: Option<i64>, param: &str) -> Result<Option<usize>, ApiError> {
        let max_positions = self.preparer.limits().max_positions;
        match asked {
            None => Ok(None),
            Some(-1) => Ok(Some(max_positions)),
            Some(tokens) if tokens >= 1 && tokens as u64 <= max_positions as u64 => Ok(Some(tokens as usize)),
            Some(tokens) => {
                let message = format!("`{param}` is {tokens}: it must be -1 (the model's context length) or from 1 to {max_positions}");
                Err(ApiError::new(StatusCode::BAD_REQUEST, message).with_param(param))
            }
        }
    }

    fn check_labels(&self, labels: usize) -> Result<(), ApiError> {
        if labels > self.limits.max_labels {
            let message = format!("request has {labels} label token ids; this server takes at most {}", self.limits.max_labels);
            return Err(ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, message).with_param("label_token_ids"));
        }
        Ok(())
    }
}

fn unix_seconds() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A body as a JSON object, for routes that tell their clients apart by the fields they send.
fn fields(body: &[u8]) -> Result<serde_json::Map<String, serde_json::Value>, ApiError> {
    serde_json::from_slice(body).map_err(ApiError::malformed)
}

/// `fields` as the request type the route found them to be.
fn parse<T: serde::de::DeserializeOwned>(fields: serde_json::Map<String, serde_json::Value>) -> Result<T, ApiError> {
    serde_json::from_value(serde_json::Value::Object(fields)).map_err(ApiError::malformed)
}

/// The routes, metrics, size limit and API keys; `cors` lets browser pages on those origins
/// call the API (`*` for any); `web`, the browser page's directory, is served at `/web/`.
pub fn router(state: Arc<AppState>, cors: &[String], web: Option<&std::path::Path>) -> Router {
    // The routes that score: counted while they run (a drain waits for them), refused once
    // draining, and headed with the prefix cache's answer.
    let scoring = Router::new()
        .route("/v1/score", post(score::score))
        .route("/score", post(score::score))
        .route("/v1/rerank", post(rerank::rerank))
        .route("/rerank", post(rerank::rerank))
        .route("/v2/rerank", post(rerank::rerank_v2))
        .route("/generative_scoring", post(generative::generative_scoring))
        .layer(axum::middleware::from_fn(prefix_header::header))
        .layer(axum::middleware::from_fn_with_state(Arc::clone(&state.lifecycle), readiness::admit));
    let api = Router::new()
        .merge(scoring)
        .merge(readiness::probe_routes(Arc::clone(&state.lifecycle)))
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics::render))
        .route("/openapi.json", get(openapi::spec))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(Arc::clone(&state), reject_declared_oversize))
        .layer(axum::middleware::from_fn_with_state(Arc::clone(&state), auth::require_key))
        .layer(axum::middleware::from_fn_with_state(Arc::clone(&state), metrics::record))
        .layer(DefaultBodyLimit::max(state.limits.max_body_bytes))
        .layer(RequestBodyTimeoutLayer::new(state.limits.body_timeout))
        .layer(RequestDecompressionLayer::new())
        .layer(axum::middleware::from_fn(error::json_errors))
        .layer(cors_layer(cors));
    let app = match web {
        Some(dir) => api.merge(web::routes(dir)),
        None => api,
    };
    app.with_state(state)
}

/// Of a refused body, what is read and dropped before answering (for at most a second): a client
/// that writes its whole body before reading gets the 413 rather than a reset connection.
const REFUSED_BODY_DRAIN: usize = 1 << 20;

/// A body declared larger than `--max-body-bytes` is refused without reading more than
/// [`REFUSED_BODY_DRAIN`] of it.
async fn reject_declared_oversize(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let declared = request.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    match declared {
        Some(length) if length > state.limits.max_body_bytes as u64 => {
            let drain = axum::body::to_bytes(request.into_body(), REFUSED_BODY_DRAIN);
            let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
            let message = format!("request body of {length} bytes; this server takes at most {}", state.limits.max_body_bytes);
            ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, message).into_response()
        }
        _ => next.run(request).await,
    }
}

fn cors_layer(origins: &[String]) -> CorsLayer {
    let layer = CorsLayer::new()
        .allow_methods([Method::GET, Method::POST])
        .allow_headers([header::CONTENT_TYPE, header::AUTHORIZATION])
        .expose_headers([header::HeaderName::from_static(prefix_header::HEADER)]);
    if origins.iter().any(|o| o == "*") {
        layer.allow_origin(AllowOrigin::any())
    } else {
        layer.allow_origin(AllowOrigin::list(origins.iter().filter_map(|o| header::HeaderValue::from_str(o).ok())))
    }
}

/// The served model under each of its names, with its context length and vocabulary size.
#[utoipa::path(get, tag = "service", path = "/v1/models", responses((status = 200, description = "OpenAI-style model list")))]
async fn models(State(state): State<Arc<AppState>>) -> Json<serde_json::Value> {
    let created = state.started.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let limits = state.preparer.limits();
    let models: Vec<_> = state
        .served_names
        .iter()
        .map(|name| {
            json!({
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "tally",
                "root": state.served_names[0],
                "max_model_len": limits.max_positions,
                "vocab_size": limits.vocab_size,
            })
        })
        .collect();
    Json(json!({"object": "list", "data": models}))
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no such endpoint; see /openapi.json")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method not allowed for this endpoint; see /openapi.json")
}
