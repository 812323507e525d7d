//! API errors as JSON: `{object: "error", message, type, param, code}` (OpenAI / SGLang style).

use axum::extract::rejection::BytesRejection;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tally_core::ValidationError;
use tally_engine::{RequestError, ScheduleError};

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<String>,
}

/// Every error's body.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = Error)]
pub struct ErrorBody<'a> {
    /// Always `"error"`.
    object: &'static str,
    message: &'a str,
    /// The error class, e.g. `BadRequestError`, `RequestTooLargeError`, `TimeoutError`.
    r#type: &'static str,
    /// The request field at fault, where there is one.
    param: Option<&'a str>,
    /// The HTTP status.
    code: u16,
}

/// The errors an API route can answer, for the OpenAPI document.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // only described, never built
pub enum ApiErrors<'a> {
    /// Malformed JSON, a missing field, an empty query or item, mixed text and ids.
    #[response(status = 400)]
    BadRequest(ErrorBody<'a>),
    /// `--api-key` is set and the request has no valid `Authorization: Bearer` key.
    #[response(status = 401)]
    Unauthorized(ErrorBody<'a>),
    /// The request names a model this server does not serve.
    #[response(status = 404)]
    NotFound(ErrorBody<'a>),
    /// Over a server limit: body bytes, items, labels, text bytes or prompt tokens.
    #[response(status = 413)]
    TooLarge(ErrorBody<'a>),
    /// A token id outside the model's vocabulary.
    #[response(status = 422)]
    Unprocessable(ErrorBody<'a>),
    /// The queue or the connection limit is full; retry after `Retry-After` seconds.
    #[response(status = 503)]
    Overloaded(ErrorBody<'a>),
    /// Not scored within `--request-timeout-secs`.
    #[response(status = 504)]
    Timeout(ErrorBody<'a>),
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into(), param: None }
    }

    pub fn with_param(mut self, param: &str) -> Self {
        self.param = Some(param.to_owned());
        self
    }

    /// A body that is not a valid request: bad JSON, wrong types, missing fields.
    pub fn malformed(error: serde_json::Error) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, format!("invalid request: {error}"))
    }

    /// The body could not be read: too large (413) or broken off.
    pub fn unreadable_body(rejection: BytesRejection) -> Self {
        let status = rejection.status();
        let message = if status == StatusCode::PAYLOAD_TOO_LARGE { "request body too large".to_owned() } else { rejection.body_text() };
        ApiError::new(status, message)
    }

    /// The error as the API's JSON body.
    pub fn to_json(&self) -> String {
        let body = ErrorBody { object: "error", message: &self.message, r#type: self.kind(), param: self.param.as_deref(), code: self.status.as_u16() };
        serde_json::to_string(&body).expect("an error body serializes")
    }

    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::BAD_REQUEST => "BadRequestError",
            StatusCode::UNAUTHORIZED => "AuthenticationError",
            StatusCode::NOT_FOUND => "NotFoundError",
            StatusCode::METHOD_NOT_ALLOWED => "MethodNotAllowedError",
            StatusCode::PAYLOAD_TOO_LARGE | StatusCode::URI_TOO_LONG | StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => "RequestTooLargeError",
            StatusCode::UNPROCESSABLE_ENTITY => "UnprocessableEntityError",
            StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailableError",
            StatusCode::GATEWAY_TIMEOUT => "TimeoutError",
            _ => "InternalServerError",
        }
    }
}

/// An [`ApiError`] in vLLM's shape (vLLM ≥ 0.10.1): `{"error": {message, type, param, code}}`,
/// for the routes only vLLM's clients call.
pub struct VllmError(pub ApiError);

impl From<ApiError> for VllmError {
    fn from(error: ApiError) -> Self {
        VllmError(error)
    }
}

impl IntoResponse for VllmError {
    fn into_response(self) -> Response {
        let error = &self.0;
        let body = serde_json::json!({"error": {"message": error.message, "type": error.kind(), "param": error.param, "code": error.status.as_u16()}});
        self.0.respond_with(body.to_string())
    }
}

impl From<RequestError> for ApiError {
    fn from(error: RequestError) -> Self {
        let message = error.to_string();
        match &error {
            RequestError::Invalid(invalid @ ValidationError::TokenIdOutOfRange { .. }) => {
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, message).with_param(invalid.param())
            }
            RequestError::Invalid(invalid) => ApiError::new(StatusCode::BAD_REQUEST, message).with_param(invalid.param()),
            RequestError::NoTokenizer(_) | RequestError::Tokenize(_) => ApiError::new(StatusCode::BAD_REQUEST, message),
            RequestError::NoRoomForDocument { .. } => ApiError::new(StatusCode::BAD_REQUEST, message).with_param("query"),
        }
    }
}

impl From<ScheduleError> for ApiError {
    fn from(error: ScheduleError) -> Self {
        let status = match error {
            ScheduleError::QueueFull(_) | ScheduleError::Closed => StatusCode::SERVICE_UNAVAILABLE,
            ScheduleError::Expired => StatusCode::GATEWAY_TIMEOUT,
            ScheduleError::Failed(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, error.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = self.to_json();
        self.respond_with(body)
    }
}

impl ApiError {
    /// The error's response with `body`, a JSON document in the shape the route's clients
    /// expect; logged, and headed (`Retry-After` on 503), as every API error is.
    pub fn respond_with(self, body: String) -> Response {
        // Overload (503) and slow requests (504) are the client's to retry, not server faults.
        match self.status {
            StatusCode::SERVICE_UNAVAILABLE => {}
            StatusCode::GATEWAY_TIMEOUT => tracing::warn!(status = %self.status, "{}", self.message),
            status if status.is_server_error() => tracing::error!(status = %status, "{}", self.message),
            _ => {}
        }
        let mut response = (self.status, [(header::CONTENT_TYPE, "application/json")], body).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        }
        response
    }
}

/// Errors produced below the handlers (a layer's 408 or 415, say) come without the API's JSON
/// body; give them one, with the status's reason as the message.
pub async fn json_errors(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    let is_json = response.headers().get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !status.is_client_error() && !status.is_server_error() || is_json {
        return response;
    }
    let reason = status.canonical_reason().unwrap_or("error").to_lowercase();
    let message = match status {
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported Content-Encoding: send the body plain or gzip-compressed".to_owned(),
        _ => reason,
    };
    let mut json = ApiError::new(status, message).into_response();
    for name in [header::RETRY_AFTER, header::WWW_AUTHENTICATE] {
        if let Some(value) = response.headers().get(&name) {
            json.headers_mut().insert(name, value.clone());
        }
    }
    json
}
