//! `tally serve --web DIR`: the browser page (`web/build.sh`'s output) served beside the API, so
//! that one command shows the page scoring on WebGPU next to the server's own answers.

use std::path::Path;

use axum::response::Redirect;
use axum::routing::get;
use axum::Router;
use tower_http::services::ServeDir;

/// `/web/…` from `dir`, gzip-compressed where `web/build.sh` left a `.gz` beside a file (the wasm
/// module shrinks to a sixth), and `/` redirecting to the page. Outside the API's layers: the
/// page and its model files need no API key.
pub fn routes<S: Clone + Send + Sync + 'static>(dir: &Path) -> Router<S> {
    Router::new()
        .nest_service("/web", ServeDir::new(dir).precompressed_gzip())
        .route("/", get(|| async { Redirect::to("/web/index.html") }))
}
