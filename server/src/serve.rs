//! `tally serve`: load the model, start the scheduler, serve HTTP until SIGTERM or Ctrl-C,
//! then finish every accepted request before exiting.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tally_model::ScoringBackend;
use tally_core::PassBudget;
use tally_engine::{Scheduler, SchedulerOptions, ScorerOptions};

use crate::backend::{dispatch, WithBackend};
use crate::cli::ServeArgs;
use crate::http::auth::AuthConfig;
use crate::http::{self, AppState, ServerLimits};

pub fn run(args: ServeArgs) -> Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let device = args.device;
    let (state, listen, cors) = dispatch(device, args)?;
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    runtime.block_on(serve(state, listen, cors))
}

/// Loads the model on the chosen backend and starts its scheduler; the rest is backend-free.
impl WithBackend for ServeArgs {
    /// The state, the address to listen on, and the CORS origins.
    type Output = (AppState, String, Vec<String>);

    fn run<B: ScoringBackend>(self, device: B::Device) -> Result<Self::Output> {
        let (dir, name) = crate::hub::resolve_model(&self.model)?;
        let options = ScorerOptions {
            pass_budget: PassBudget { max_tokens: self.max_batch_tokens, ..PassBudget::default() },
            prefix_cache_bytes: self.prefix_cache_mib << 20,
        };
        let scorer = crate::loading::load_scorer::<B>(&dir, &device, options)?.with_model_name(name);
        let preparer = scorer.preparer().clone();
        let rerank = http::rerank::RerankTemplate::new(&self.rerank, &preparer);
        let scheduler = Scheduler::start(scorer, SchedulerOptions { max_queue: self.max_queue, max_batch_tokens: self.max_batch_tokens });
        let limits = ServerLimits {
            max_items: self.max_items_per_request,
            max_labels: self.max_labels_per_request,
            max_tokens: self.max_tokens_per_request,
            max_body_bytes: self.max_body_bytes,
            max_text_bytes: self.max_text_bytes_per_request,
            timeout: Duration::from_secs_f64(self.request_timeout_secs),
        };
        tracing::info!(model = %dir.display(), backend = ?std::any::type_name::<B>(), "model loaded");
        let auth = AuthConfig { api_key: self.api_key.clone().filter(|key| !key.is_empty()), protect_health_and_metrics: self.protect_health_and_metrics };
        let state = AppState::new(scheduler, preparer, rerank, limits, auth);
        Ok((state, format!("{}:{}", self.host, self.port), self.cors_allow_origin.clone()))
    }
}

async fn serve(state: AppState, listen: String, cors: Vec<String>) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(&listen).await.with_context(|| format!("cannot listen on {listen}"))?;
    tracing::info!("listening on http://{}", listener.local_addr()?);
    let state = Arc::new(state);
    let app = http::router(Arc::clone(&state), &cors);
    axum::serve(listener, app).with_graceful_shutdown(shutdown_signal()).await.context("HTTP server failed")?;
    tracing::info!("stopped accepting requests; finishing queued work");
    // In-flight handlers are done; the last reference to the scheduler drains its queue and
    // joins the model thread when dropped.
    drop(state);
    Ok(())
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
