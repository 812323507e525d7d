//! `tally serve`: load the model, start the scheduler, serve HTTP until SIGTERM or Ctrl-C,
//! then finish every accepted request before exiting.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use axum::http::StatusCode;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;
use tally_model::ScoringBackend;
use tally_engine::{Reranker, Scheduler, SchedulerOptions, Scorer};

use crate::backend::{dispatch, WithBackend};
use crate::cli::ServeArgs;
use crate::http::auth::AuthConfig;
use crate::http::error::ApiError;
use crate::http::parse_errors::JsonParseErrors;
use crate::http::{self, AppState, ServerLimits};

pub fn run(args: ServeArgs) -> Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let device = args.device;
    let web = args.web.clone();
    if let Some(dir) = &web {
        anyhow::ensure!(dir.join("index.html").is_file(), "--web {}: no index.html there (build the page with web/build.sh; it writes web/dist)", dir.display());
    }
    let limits = ConnectionLimits {
        max_connections: args.max_connections,
        header_timeout: Duration::from_secs_f64(args.header_timeout_secs),
        max_header_bytes: args.max_header_bytes,
        drain_timeout: Duration::from_secs_f64(args.shutdown_timeout_secs),
    };
    let (state, listen, cors) = dispatch(device, args)?;
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    runtime.block_on(serve(state, listen, cors, web, limits))
}

/// Loads the model on the chosen backend and starts its scheduler; the rest is backend-free.
impl WithBackend for ServeArgs {
    /// The state, the address to listen on, and the CORS origins.
    type Output = (AppState, String, Vec<String>);

    fn run<B: ScoringBackend>(self, device: B::Device) -> Result<Self::Output> {
        let (dir, name) = crate::hub::resolve_model(&self.model)?;
        let served_names = if self.served_model_name.is_empty() { vec![name] } else { self.served_model_name.clone() };
        let name = served_names[0].clone();
        let mut scorer = crate::loading::load_scorer::<B>(&dir, &device, self.prefix_cache_mib << 20, self.max_batch_tokens, self.device.routes())?.with_model_name(name);
        let max_batch_tokens = scorer.max_pass_tokens();
        if !self.no_warmup {
            warm_up(&mut scorer)?;
        }
        let preparer = scorer.preparer().clone();
        let rerank = Reranker::new(self.rerank.template(), &preparer).map(Arc::new).map_err(|reason| {
            tracing::warn!("/v1/rerank is disabled: {reason}");
            reason.to_string()
        });
        let scheduler = Scheduler::start(scorer, SchedulerOptions { max_queue: self.max_queue, max_batch_tokens });
        let limits = ServerLimits {
            max_items: self.max_items_per_request,
            max_labels: self.max_labels_per_request,
            max_tokens: self.max_tokens_per_request,
            max_body_bytes: self.max_body_bytes,
            max_text_bytes: self.max_text_bytes_per_request,
            timeout: Duration::from_secs_f64(self.request_timeout_secs),
            body_timeout: Duration::from_secs_f64(self.body_timeout_secs),
        };
        tracing::info!(model = %dir.display(), backend = ?std::any::type_name::<B>(), "model loaded");
        let auth = AuthConfig { api_key: self.api_key.clone().filter(|key| !key.is_empty()), protect_health_and_metrics: self.protect_health_and_metrics };
        let state = AppState::new(scheduler, preparer, rerank, limits, auth, served_names);
        Ok((state, format!("{}:{}", self.host, self.port), self.cors_allow_origin.clone()))
    }
}

/// One pass of every shape class the backend compiles or tunes for before listening, logged
/// step by step: on a cold GPU this takes minutes and is worth watching. The CPU needs none.
fn warm_up<B: ScoringBackend>(scorer: &mut Scorer<B>) -> Result<()> {
    let steps = scorer.warmup_steps();
    if steps.is_empty() {
        return Ok(());
    }
    let started = Instant::now();
    tracing::info!("warming up: one pass per shape class before listening (--no-warmup skips)");
    scorer
        .warm_up(&steps, &mut |done, total, step| tracing::info!("warm-up {done}/{total}: {}-token query, {} item tokens a pass ({:.1} s)", step.query_tokens, step.pass_tokens, started.elapsed().as_secs_f64()))
        .context("the warm-up pass failed")?;
    tracing::info!("warmed up in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// How connections are held: what a client may cost the server before it is let go.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Open connections; more are answered 503 and closed.
    pub max_connections: usize,
    /// For a request's headers to arrive; also how long an idle keep-alive connection stays.
    pub header_timeout: Duration,
    /// Request line and headers; more gets 431.
    pub max_header_bytes: usize,
    /// After SIGTERM, for accepted requests to finish before the process exits anyway.
    pub drain_timeout: Duration,
}

async fn serve(state: AppState, listen: String, cors: Vec<String>, web: Option<std::path::PathBuf>, limits: ConnectionLimits) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(&listen).await.with_context(|| format!("cannot listen on {listen}"))?;
    tracing::info!("listening on http://{}", listener.local_addr()?);
    if web.is_some() {
        tracing::info!("the browser page: http://{}/web/index.html", listener.local_addr()?);
    }
    let state = Arc::new(state);
    let app = http::router(Arc::clone(&state), &cors, web.as_deref());
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).max_header_size(limits.max_header_bytes);
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut first_signal = std::pin::pin!(shutdown_signal());
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of file descriptors, say: back off instead of spinning.
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut first_signal => break,
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            tokio::spawn(shed(stream, limits.max_connections));
            continue;
        };
        let connection = graceful.watch(builder.serve_connection(TokioIo::new(JsonParseErrors::new(stream)), TowerToHyperService::new(app.clone())));
        tokio::spawn(async move {
            let _ = connection.await;
            drop(slot);
        });
    }
    drop(listener);
    tracing::info!("stopped accepting requests; finishing accepted ones (at most {:?})", limits.drain_timeout);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(limits.drain_timeout) => {
            tracing::warn!("requests still running after {:?}; exiting", limits.drain_timeout);
            std::process::exit(1);
        }
        () = shutdown_signal() => {
            tracing::warn!("second shutdown signal; exiting now");
            std::process::exit(1);
        }
    }
    // In-flight handlers are done; the last reference to the scheduler drains its queue (work
    // whose client left is dropped) and joins the model thread when dropped.
    drop(state);
    Ok(())
}

/// Over the connection limit: a 503 in the API's error format, then close.
async fn shed(mut stream: tokio::net::TcpStream, limit: usize) {
    use tokio::io::AsyncWriteExt;
    let body = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, format!("the server holds its limit of {limit} connections; retry later")).to_json();
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(response.as_bytes())).await;
    let _ = stream.shutdown().await;
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("installing the SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutdown signal received");
}
