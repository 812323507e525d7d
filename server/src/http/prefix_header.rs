//! The `x-tally-prefix-cache` response header: whether the request's query was found in the prefix
//! cache (`hit`), resumed from a cached beginning (`partial`) or prefilled from scratch (`miss`).
//! A router that keeps a prefix on one replica can see from it whether that pays.
//!
//! Every scoring route answers through [`super::AppState::submit`], which notes each query's
//! lookup here; the middleware around the routes turns the notes into the header. A task-local
//! note, rather than a value threaded through every handler's return type, keeps the header out
//! of the five API shapes tally answers in.

use std::cell::Cell;

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use tally_engine::PrefixCacheUse;

pub const HEADER: &str = "x-tally-prefix-cache";

tokio::task_local! {
    static LOOKUPS: Cell<Option<PrefixCacheUse>>;
}

/// Notes a query's lookup for the current request (outside a request, nothing).
pub fn note(lookup: PrefixCacheUse) {
    let _ = LOOKUPS.try_with(|noted| noted.set(Some(noted.get().map_or(lookup, |earlier| earlier.combine(lookup)))));
}

/// Middleware: the header on every response whose request scored at least one query.
pub async fn header(request: Request, next: Next) -> Response {
    let (mut response, noted) = LOOKUPS
        .scope(Cell::new(None), async {
            let response = next.run(request).await;
            (response, LOOKUPS.with(Cell::get))
        })
        .await;
    if let Some(lookup) = noted {
        response.headers_mut().insert(HEADER, HeaderValue::from_static(lookup.as_str()));
    }
    response
}
