//! Optional API keys: with `--api-key` (or `TALLY_API_KEY`), API routes need
//! `Authorization: Bearer <key>` and answer 401 otherwise; the probes (`/health`, `/live`) and
//! `/metrics` stay open unless `--protect-health-and-metrics`.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::AppState;

#[derive(Debug, Clone, Default)]
pub struct AuthConfig {
    pub api_key: Option<String>,
    pub protect_health_and_metrics: bool,
}

impl AuthConfig {
    fn allows(&self, path: &str, authorization: Option<&str>) -> bool {
        let Some(key) = &self.api_key else { return true };
        if matches!(path, "/health" | "/live" | "/metrics") && !self.protect_health_and_metrics {
            return true;
        }
        authorization.and_then(|value| value.strip_prefix("Bearer ")).is_some_and(|given| constant_time_eq(given.trim().as_bytes(), key.as_bytes()))
    }
}

/// Equal-length comparison that takes the same time wherever the first difference is.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

pub async fn require_key(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let authorization = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    // CORS preflights carry no credentials; the CORS layer answers them.
    if request.method() == axum::http::Method::OPTIONS || state.auth.allows(request.uri().path(), authorization) {
        return next.run(request).await;
    }
    let mut response = ApiError::new(StatusCode::UNAUTHORIZED, "missing or wrong API key: send `Authorization: Bearer <key>`").into_response();
    response.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_guard_the_api_and_optionally_health_and_metrics() {
        let open = AuthConfig::default();
        assert!(open.allows("/v1/score", None));
        let keyed = AuthConfig { api_key: Some("s3cret".into()), protect_health_and_metrics: false };
        assert!(!keyed.allows("/v1/score", None));
        assert!(!keyed.allows("/v1/score", Some("Bearer wrong")));
        assert!(!keyed.allows("/v1/score", Some("s3cret")));
        assert!(keyed.allows("/v1/score", Some("Bearer s3cret")));
        assert!(keyed.allows("/health", None) && keyed.allows("/live", None) && keyed.allows("/metrics", None));
        let strict = AuthConfig { protect_health_and_metrics: true, ..keyed };
        assert!(!strict.allows("/metrics", None) && strict.allows("/metrics", Some("Bearer s3cret")));
    }
}
