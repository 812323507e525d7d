//! `tally serve`: listen, load the model and warm it up (the probes say so meanwhile), start the
//! scheduler, serve HTTP until SIGTERM or Ctrl-C, then finish every accepted request and exit.

use std::io::IsTerminal;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use axum::http::StatusCode;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;
use tower::ServiceExt;
use tally_model::ScoringBackend;
use tally_engine::{Reranker, Scheduler, SchedulerOptions, Scorer};

use crate::backend::{dispatch, WithBackend};
use crate::cli::ServeArgs;
use crate::http::auth::AuthConfig;
use crate::http::error::ApiError;
use crate::http::parse_errors::JsonParseErrors;
use crate::http::readiness::{self, Lifecycle, Phase};
use crate::http::{self, AppState, ServerLimits, ServerSetup};

pub fn run(args: ServeArgs) -> Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
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
    // Listen first, load after: the probes answer while the model loads and warms up (minutes on
    // a cold GPU), so an orchestrator can tell a server that is starting from one that is stuck.
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    let listen = format!("{}:{}", args.host, args.port);
    let listener = runtime.block_on(tokio::net::TcpListener::bind(&listen)).with_context(|| format!("cannot listen on {listen}"))?;
    let address = listener.local_addr()?;
    tracing::info!("listening on http://{address} (/live answers now; /health and the API once the model is loaded and warmed up)");
    let lifecycle = Arc::new(Lifecycle::default());
    let api = Arc::new(OnceLock::new());
    let server = runtime.spawn(serve(listener, Arc::clone(&api), Arc::clone(&lifecycle), limits));

    let cors = args.cors_allow_origin.clone();
    let state = dispatch(args.device, Startup { args, lifecycle: Arc::clone(&lifecycle) })?;
    let _ = api.set(http::router(Arc::new(state), &cors, web.as_deref()));
    lifecycle.set(Phase::Ready);
    tracing::info!("ready: serving the API on http://{address}");
    if web.is_some() {
        tracing::info!("the browser page: http://{address}/web/index.html");
    }
    runtime.block_on(server).context("the HTTP server stopped")?
    // Dropping `api` drops the last reference to the scheduler: it drains its queue (work whose
    // client left is dropped) and joins the model thread.
}

/// `tally serve`'s arguments, and the lifecycle its loading moves along.
struct Startup {
    args: ServeArgs,
    lifecycle: Arc<Lifecycle>,
}

/// Loads the model on the chosen backend, warms it up and starts its scheduler; the rest is
/// backend-free.
impl WithBackend for Startup {
    type Output = AppState;

    fn run<B: ScoringBackend>(self, device: B::Device) -> Result<AppState> {
        let Startup { args, lifecycle } = self;
        let (dir, name) = crate::hub::resolve_model(&args.model)?;
        let served_names = if args.served_model_name.is_empty() { vec![name] } else { args.served_model_name.clone() };
        let name = served_names[0].clone();
        let mut scorer = crate::loading::load_scorer::<B>(&dir, &device, args.prefix_cache_mib << 20, args.max_batch_tokens, &args.device)?.with_model_name(name);
        let max_batch_tokens = scorer.max_pass_tokens();
        if !args.no_warmup {
            lifecycle.set(Phase::WarmingUp);
            warm_up(&mut scorer)?;
        }
        let preparer = scorer.preparer().clone();
        let rerank = Reranker::new(args.rerank.template(), &preparer).map(Arc::new).map_err(|reason| {
            tracing::warn!("/v1/rerank is disabled: {reason}");
            reason.to_string()
        });
        let overlap = !args.no_overlap && B::overlaps_issue_with_work();
        let scheduler = Scheduler::start(scorer, SchedulerOptions { max_queue: args.max_queue, max_batch_tokens, overlap });
        let limits = ServerLimits {
            max_items: args.max_items_per_request,
            max_labels: args.max_labels_per_request,
            max_tokens: args.max_tokens_per_request,
            max_body_bytes: args.max_body_bytes,
            max_text_bytes: args.max_text_bytes_per_request,
            timeout: Duration::from_secs_f64(args.request_timeout_secs),
            body_timeout: Duration::from_secs_f64(args.body_timeout_secs),
        };
        tracing::info!(model = %dir.display(), backend = ?std::any::type_name::<B>(), "model loaded");
        let auth = AuthConfig { api_key: args.api_key.clone().filter(|key| !key.is_empty()), protect_health_and_metrics: args.protect_health_and_metrics };
        let setup = ServerSetup { limits, auth, served_names, lifecycle, metric_names: args.metrics_compat.clone() };
        Ok(AppState::new(scheduler, preparer, rerank, setup))
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

/// Serves `listener` until SIGTERM or Ctrl-C: the loading routes until `api` is set, then the API
/// (on connections old and new). A signal starts the drain: `/health` turns 503, new scoring
/// requests are refused, and once the accepted ones are answered the server stops.
async fn serve(listener: tokio::net::TcpListener, api: Arc<OnceLock<Router>>, lifecycle: Arc<Lifecycle>, limits: ConnectionLimits) -> Result<()> {
    let loading = readiness::loading_routes(Arc::clone(&lifecycle));
    let app = tower::service_fn(move |request: hyper::Request<hyper::body::Incoming>| api.get().unwrap_or(&loading).clone().oneshot(request));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).max_header_size(limits.max_header_bytes);
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut signal = std::pin::pin!(shutdown_signal());
    let mut draining = false;
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
            () = &mut signal, if !draining => {
                if lifecycle.phase() != Phase::Ready {
                    tracing::info!("shutdown signal before the model was ready: nothing to finish; exiting");
                    std::process::exit(0);
                }
                lifecycle.set(Phase::Draining);
                draining = true;
                tracing::info!("draining: /health answers 503, new requests are refused, {} accepted ones finish (at most {:?})", lifecycle.in_flight(), limits.drain_timeout);
                tokio::spawn(exit_at_deadline_or_second_signal(limits.drain_timeout));
                continue;
            }
            () = lifecycle.drained(), if draining => break,
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
    tracing::info!("every accepted request answered; closing connections");
    graceful.shutdown().await;
    Ok(())
}

/// Once draining: exits with status 1 when the drain passes its deadline or a second signal comes.
async fn exit_at_deadline_or_second_signal(deadline: Duration) {
    tokio::select! {
        () = tokio::time::sleep(deadline) => tracing::warn!("requests still running after {deadline:?}; exiting"),
        () = shutdown_signal() => tracing::warn!("second shutdown signal; exiting now"),
    }
    std::process::exit(1);
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
