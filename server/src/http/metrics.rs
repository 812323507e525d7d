//! `GET /metrics`: Prometheus text format — HTTP requests and latencies, and the engine's
//! counters (items and tokens scored, batch and pass sizes, prefix cache).
//!
//! Three gauges are what a router's endpoint picker (the Gateway API Inference Extension's, say)
//! reads to choose a replica: requests waiting, requests running, and the prefix cache's use as
//! a fraction of its budget. `--metrics-compat vllm|sglang` also gives them under the names
//! those engines use, so a picker configured for them works unchanged. Rendering reads atomics
//! and two small maps: cheap enough to scrape many times a second.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tally_engine::Histogram;

use super::AppState;

/// Another engine's names for the picker's gauges (`--metrics-compat`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum MetricNames {
    /// `vllm:num_requests_waiting`, `vllm:num_requests_running`, `vllm:kv_cache_usage_perc`.
    Vllm,
    /// `sglang:num_queue_reqs`, `sglang:num_running_reqs`, `sglang:token_usage`.
    Sglang,
}

impl MetricNames {
    /// Waiting, running and cache use, in that order.
    fn names(self) -> [&'static str; 3] {
        match self {
            MetricNames::Vllm => ["vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"],
            MetricNames::Sglang => ["sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage"],
        }
    }
}

const LATENCY_BUCKETS: &[f64] = &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

#[derive(Default)]
pub struct HttpMetrics {
    /// (endpoint, status) → requests.
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    latency: Mutex<BTreeMap<String, Arc<Histogram>>>,
}

/// Middleware: counts every request by endpoint and status, and times it.
pub async fn record(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let endpoint = request.extensions().get::<MatchedPath>().map_or("unmatched", MatchedPath::as_str).to_owned();
    let start = Instant::now();
    let response = next.run(request).await;
    let metrics = &state.metrics;
    let histogram = Arc::clone(metrics.latency.lock().unwrap_or_else(|e| e.into_inner()).entry(endpoint.clone()).or_insert_with(|| Arc::new(Histogram::new(LATENCY_BUCKETS))));
    histogram.observe(start.elapsed().as_secs_f64());
    *metrics.requests.lock().unwrap_or_else(|e| e.into_inner()).entry((endpoint, response.status().as_u16())).or_default() += 1;
    response
}

/// Request, queue, batch and cache counters and latency histograms.
#[utoipa::path(get, tag = "service", path = "/metrics", responses((status = 200, description = "Prometheus text exposition format", content_type = "text/plain")))]
pub async fn render(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let mut out = String::new();
    let http = &state.metrics;
    out += "# HELP tally_requests_total HTTP requests by endpoint and status.\n# TYPE tally_requests_total counter\n";
    for ((endpoint, status), count) in http.requests.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        let _ = writeln!(out, "tally_requests_total{{endpoint=\"{endpoint}\",status=\"{status}\"}} {count}");
    }
    out += "# HELP tally_request_duration_seconds HTTP request latency.\n# TYPE tally_request_duration_seconds histogram\n";
    for (endpoint, histogram) in http.latency.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        write_histogram(&mut out, "tally_request_duration_seconds", &format!("endpoint=\"{endpoint}\","), histogram);
    }

    let engine = state.scheduler.stats();
    let counters = [
        ("tally_items_scored_total", "Items scored.", engine.items_scored.load(Relaxed)),
        ("tally_requests_abandoned_total", "Requests dropped because their client left or their deadline passed.", engine.requests_abandoned.load(Relaxed)),
        ("tally_tokens_scored_total", "Prompt tokens run through the model.", engine.tokens_scored.load(Relaxed)),
        ("tally_prefix_cache_hits_total", "Queries found whole in the prefix cache.", engine.prefix_cache_hits.load(Relaxed)),
        ("tally_prefix_cache_partial_hits_total", "Queries that resumed from a cached beginning.", engine.prefix_cache_partial_hits.load(Relaxed)),
        ("tally_prefix_cache_misses_total", "Queries prefilled from scratch.", engine.prefix_cache_misses.load(Relaxed)),
        ("tally_prefill_tokens_total", "Query tokens prefilled (not found in the prefix cache).", engine.prefill_tokens.load(Relaxed)),
        ("tally_prefill_passes_total", "Forward passes run for queries alone (a query's last chunk runs in the item pass).", engine.prefill_passes.load(Relaxed)),
        ("tally_batches_issued_ahead_total", "Batches whose first pass was issued while the batch before was still on the device.", engine.batches_issued_ahead.load(Relaxed)),
    ];
    for (name, help, value) in counters {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
    }
    let picker_gauges = [
        ("tally_requests_waiting", "Requests waiting for the model.", engine.queue_depth.load(Relaxed) as f64),
        ("tally_requests_running", "Requests in the batches the model is scoring.", engine.requests_running.load(Relaxed) as f64),
        ("tally_prefix_cache_usage", "Prefix cache bytes held, as a fraction (0 to 1) of --prefix-cache-mib.", engine.prefix_cache_usage()),
    ];
    let gauges = picker_gauges.iter().copied().chain([("tally_prefix_cache_bytes", "Device bytes held by the prefix cache.", engine.prefix_cache_bytes.load(Relaxed) as f64)]);
    for (name, help, value) in gauges {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}");
    }
    let model = label_value(&state.served_names[0]);
    for engine_names in &state.metric_names {
        for (name, (_, help, value)) in engine_names.names().into_iter().zip(picker_gauges) {
            let _ = writeln!(out, "# HELP {name} {help} (tally_ under this engine's name)\n# TYPE {name} gauge\n{name}{{model_name=\"{model}\"}} {value}");
        }
    }
    out += &super::readiness::ready_gauge(state.lifecycle.phase() == super::readiness::Phase::Ready);
    out += "# HELP tally_batch_requests Requests scored together in one batch.\n# TYPE tally_batch_requests histogram\n";
    write_histogram(&mut out, "tally_batch_requests", "", &engine.batch_requests);
    out += "# HELP tally_pass_items Items per forward pass.\n# TYPE tally_pass_items histogram\n";
    write_histogram(&mut out, "tally_pass_items", "", &engine.pass_items);
    out += "# HELP tally_pass_issue_seconds Model-thread time issuing one forward pass.\n# TYPE tally_pass_issue_seconds histogram\n";
    write_histogram(&mut out, "tally_pass_issue_seconds", "", &engine.pass_issue_seconds);
    out += "# HELP tally_pass_wait_seconds Model-thread time waiting for one forward pass's scores once it asks for them.\n# TYPE tally_pass_wait_seconds histogram\n";
    write_histogram(&mut out, "tally_pass_wait_seconds", "", &engine.pass_wait_seconds);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out)
}

/// `value` escaped for a label in the text format.
fn label_value(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// `labels` is empty or ends with a comma.
fn write_histogram(out: &mut String, name: &str, labels: &str, histogram: &Histogram) {
    let (buckets, sum) = histogram.snapshot();
    for (bound, count) in &buckets {
        let le = if bound.is_infinite() { "+Inf".to_owned() } else { bound.to_string() };
        let _ = writeln!(out, "{name}_bucket{{{labels}le=\"{le}\"}} {count}");
    }
    let bare = labels.trim_end_matches(',');
    let labels = if bare.is_empty() { String::new() } else { format!("{{{bare}}}") };
    let _ = writeln!(out, "{name}_sum{labels} {sum}\n{name}_count{labels} {}", buckets.last().map_or(0, |b| b.1));
}

#[cfg(test)]
mod tests {
    use super::label_value;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label_value(r#"a\b"c"#), r#"a\\b\"c"#);
        assert_eq!(label_value("two\nlines"), r"two\nlines");
    }
}
