//! Readiness apart from liveness, as Kubernetes probes them. The server listens before the model
//! is loaded: `/live` answers 200 from the first moment the process serves; `/health` (ready)
//! answers 503 while the model loads and warms up, 200 once requests can be scored, and 503
//! again from SIGTERM on, while the requests already accepted finish. A load balancer then
//! stops sending work before the server stops taking it, and a cold start (minutes of kernel
//! tuning on a GPU) never receives traffic.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use tokio::sync::Notify;

use super::error::ApiError;

/// Where the server is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// Reading the weights.
    Loading,
    /// Compiling kernels and tuning matmuls, one pass per shape class.
    WarmingUp,
    /// Scoring.
    Ready,
    /// SIGTERM received: accepted requests finish, new ones are refused.
    Draining,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Loading => "loading",
            Phase::WarmingUp => "warming_up",
            Phase::Ready => "ok",
            Phase::Draining => "draining",
        }
    }
}

/// The phase, and the scoring requests under way (what a drain waits for).
#[derive(Debug)]
pub struct Lifecycle {
    phase: AtomicU8,
    in_flight: AtomicUsize,
    idle: Notify,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Lifecycle { phase: AtomicU8::new(Phase::Loading as u8), in_flight: AtomicUsize::new(0), idle: Notify::new() }
    }
}

impl Lifecycle {
    pub fn phase(&self) -> Phase {
        match self.phase.load(SeqCst) {
            0 => Phase::Loading,
            1 => Phase::WarmingUp,
            2 => Phase::Ready,
            _ => Phase::Draining,
        }
    }

    pub fn set(&self, phase: Phase) {
        self.phase.store(phase as u8, SeqCst);
    }

    /// Scoring requests accepted and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(SeqCst)
    }

    /// Returns once no scoring request is under way.
    pub async fn drained(&self) {
        loop {
            // Registered before the count is read, so a request ending in between still wakes us.
            let idle = self.idle.notified();
            if self.in_flight() == 0 {
                return;
            }
            idle.await;
        }
    }
}

/// Counts a request in flight until dropped (also when its client leaves and it is cancelled).
struct InFlight(Arc<Lifecycle>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// Middleware on the scoring routes: counts each request while it runs; once draining, new ones
/// get 503 (with `Connection: close`, so the client's next attempt opens a connection that a load
/// balancer can send elsewhere).
pub async fn admit(State(lifecycle): State<Arc<Lifecycle>>, request: Request, next: Next) -> Response {
    lifecycle.in_flight.fetch_add(1, SeqCst);
    let guard = InFlight(Arc::clone(&lifecycle));
    if lifecycle.phase() != Phase::Ready {
        drop(guard);
        let mut refused = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down; retry on another replica").into_response();
        refused.headers_mut().insert(header::CONNECTION, header::HeaderValue::from_static("close"));
        return refused;
    }
    let response = next.run(request).await;
    drop(guard);
    response
}

/// `/health` and `/live`, for the loading routes and the API alike.
pub fn probe_routes<S: Clone + Send + Sync + 'static>(lifecycle: Arc<Lifecycle>) -> Router<S> {
    Router::new().route("/health", get(health)).route("/live", get(live)).with_state(lifecycle)
}

/// What answers while the model loads and warms up: the probes, a `/metrics` that says the
/// server is not ready, and 503 for everything else.
pub fn loading_routes(lifecycle: Arc<Lifecycle>) -> Router {
    let not_ready = |State(lifecycle): State<Arc<Lifecycle>>| async move {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, format!("the model is {}; retry when /health answers 200", lifecycle.phase().name().replace('_', " ")))
    };
    let metrics = || async { ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], ready_gauge(false)) };
    Router::new().route("/metrics", get(metrics)).fallback(not_ready).with_state(Arc::clone(&lifecycle)).merge(probe_routes(lifecycle))
}

/// `tally_ready`: 1 while `/health` answers 200.
pub fn ready_gauge(ready: bool) -> String {
    format!("# HELP tally_ready 1 while the server takes requests (/health answers 200).\n# TYPE tally_ready gauge\ntally_ready {}\n", u8::from(ready))
}

/// Readiness: 200 `{"status": "ok"}` while requests can be scored; 503 with `status`
/// `loading`, `warming_up` or `draining` otherwise.
#[utoipa::path(get, tag = "service", path = "/health",
    responses((status = 200, description = "`{\"status\": \"ok\"}`: ready for requests"), (status = 503, description = "`{\"status\": \"loading\" | \"warming_up\" | \"draining\"}`")))]
pub async fn health(State(lifecycle): State<Arc<Lifecycle>>) -> Response {
    let phase = lifecycle.phase();
    let status = if phase == Phase::Ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(json!({"status": phase.name()}))).into_response()
}

/// Liveness: 200 as long as the process serves HTTP, whatever its phase (a restart would not help
/// a server that is loading or draining).
#[utoipa::path(get, tag = "service", path = "/live", responses((status = 200, description = "`{\"status\": \"alive\"}`")))]
pub async fn live() -> Json<serde_json::Value> {
    Json(json!({"status": "alive"}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_drain_waits_for_every_request_in_flight() {
        let lifecycle = Arc::new(Lifecycle::default());
        lifecycle.drained().await;
        let requests = [InFlight(Arc::clone(&lifecycle)), InFlight(Arc::clone(&lifecycle))];
        lifecycle.in_flight.fetch_add(2, SeqCst);
        let drained = tokio::spawn({
            let lifecycle = Arc::clone(&lifecycle);
            async move { lifecycle.drained().await }
        });
        let [first, second] = requests;
        drop(first);
        tokio::task::yield_now().await;
        assert!(!drained.is_finished(), "one request still runs");
        drop(second);
        tokio::time::timeout(std::time::Duration::from_secs(5), drained).await.expect("drained once none runs").unwrap();
    }
}
