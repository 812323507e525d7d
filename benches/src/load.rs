//! `tally bench load`: Poisson arrivals against `/v1/score` (as SGLang's scoring benchmark
//! sends them); reports latency percentiles and items/s, the failures by kind (HTTP status, or
//! the connection error), and writes a JSON summary.

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use clap::Args;
use serde_json::{json, Value};

use crate::request_shape::RequestShape;
use crate::rng::Rng;

#[derive(Args)]
pub struct LoadArgs {
    /// Base URL of a running tally (or any /v1/score) server.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub url: String,
    /// Mean requests per second (Poisson arrivals).
    #[arg(long, default_value_t = 4.0)]
    pub qps: f64,
    /// Seconds to send requests for.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    #[command(flatten)]
    pub shape: RequestShape,
    /// Where to write the JSON summary.
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
    /// What the server runs apart from its defaults (e.g. `--no-overlap`), recorded in the JSON:
    /// the chart draws such runs beside the defaults' curve, not on it.
    #[arg(long)]
    pub server_label: Option<String>,
}

/// Idle connections the client keeps for reuse (ureq keeps 1 a host by default): as many as the
/// requests in flight at the highest rate measured (2,000 qps at ~1 s), so that requests reuse
/// kept-alive connections instead of each opening one, as a pooling client (SGLang's benchmark's
/// aiohttp) does.
const IDLE_CONNECTIONS: usize = 2048;

struct Outcome {
    latency: Duration,
    /// `Ok` when the scores came back.
    result: Result<(), Failure>,
}

/// Why a request got no scores.
#[derive(Debug, PartialEq, Eq)]
enum Failure {
    /// The server answered with this status (503: shed at its connection or queue limit; 504:
    /// past the request timeout).
    Status(u16),
    /// No answer: ureq's error kind and, where one caused it, the I/O error's kind, e.g.
    /// "ConnectionFailed/ConnectionRefused" (the listen backlog full, or no server), "Io/ConnectionReset".
    Connection(String),
}

impl From<ureq::Error> for Failure {
    fn from(error: ureq::Error) -> Self {
        match error {
            ureq::Error::Status(status, _) => Failure::Status(status),
            ureq::Error::Transport(transport) => {
                let io_kind = std::error::Error::source(&transport).and_then(|source| source.downcast_ref::<std::io::Error>()).map(std::io::Error::kind);
                Failure::Connection(match io_kind {
                    Some(io_kind) => format!("{:?}/{io_kind:?}", transport.kind()),
                    None => format!("{:?}", transport.kind()),
                })
            }
        }
    }
}

/// Posts one request and reads the whole answer, so that its connection goes back to the pool.
fn send(agent: &ureq::Agent, url: &str, request: Value) -> Result<(), Failure> {
    let response = agent.post(url).send_json(request)?;
    response.into_string().map_err(ureq::Error::from)?;
    Ok(())
}

/// Failures counted by kind: `{"status": {"503": n, ...}, "connection": {"Io/ConnectionReset": n, ...}}`.
fn failure_counts<'a>(failures: impl IntoIterator<Item = &'a Failure>) -> Value {
    let (mut statuses, mut connections) = (BTreeMap::<String, usize>::new(), BTreeMap::<String, usize>::new());
    for failure in failures {
        match failure {
            Failure::Status(status) => *statuses.entry(status.to_string()).or_default() += 1,
            Failure::Connection(kind) => *connections.entry(kind.clone()).or_default() += 1,
        }
    }
    json!({"status": statuses, "connection": connections})
}

pub fn run(args: LoadArgs) -> Result<()> {
    ensure!(args.qps > 0.0 && args.duration > 0.0, "--qps and --duration must be positive");
    let base = args.url.trim_end_matches('/').to_owned();
    let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(600)).max_idle_connections(IDLE_CONNECTIONS).max_idle_connections_per_host(IDLE_CONNECTIONS).build();
    let models: serde_json::Value = agent.get(&format!("{base}/v1/models")).call().with_context(|| format!("cannot reach {base}/v1/models"))?.into_json()?;
    let vocab = models["data"][0]["vocab_size"].as_u64().unwrap_or(1000).max(2);

    let shape = &args.shape;
    let mut rng = Rng::new(shape.seed);
    let (done, results) = mpsc::channel::<Outcome>();
    let start = Instant::now();
    let mut next_arrival = 0.0;
    let mut sent = 0;
    while next_arrival < args.duration {
        let request = shape.request(&mut rng, vocab, &[0, 1]);
        let wait = Duration::from_secs_f64(next_arrival).saturating_sub(start.elapsed());
        std::thread::sleep(wait);
        let (agent, url, done) = (agent.clone(), format!("{base}/v1/score"), done.clone());
        std::thread::spawn(move || {
            let sent_at = Instant::now();
            let result = send(&agent, &url, request);
            let _ = done.send(Outcome { latency: sent_at.elapsed(), result });
        });
        sent += 1;
        next_arrival += -rng.unit().ln() / args.qps;
    }
    drop(done);
    let outcomes: Vec<Outcome> = results.iter().collect();
    let wall = start.elapsed().as_secs_f64();

    let mut latencies: Vec<f64> = outcomes.iter().filter(|o| o.result.is_ok()).map(|o| o.latency.as_secs_f64() * 1e3).collect();
    latencies.sort_by(f64::total_cmp);
    let percentile = |p: f64| latencies.get(((latencies.len() as f64 * p).ceil() as usize).saturating_sub(1)).copied().unwrap_or(f64::NAN);
    let ok = latencies.len();
    let failures = failure_counts(outcomes.iter().filter_map(|o| o.result.as_ref().err()));
    let summary = json!({
        "benchmark": "load",
        "url": base,
        "server_label": args.server_label,
        "qps": args.qps,
        "duration_s": args.duration,
        "items_per_request": shape.items_per_request,
        "prompt_tokens": shape.prompt_tokens,
        "item_tokens": shape.item_tokens,
        "requests_sent": sent,
        "requests_ok": ok,
        "requests_failed": sent - ok,
        "failures": failures,
        "wall_s": wall,
        "latency_ms": {"p50": percentile(0.5), "p90": percentile(0.9), "p99": percentile(0.99)},
        "items_per_second": (ok * shape.items_per_request) as f64 / wall,
    });
    println!("requests: {sent} sent, {ok} ok, {} failed in {wall:.1} s", sent - ok);
    if sent > ok {
        println!("failures: {}", describe_failures(&failures));
    }
    println!("latency ms: p50 {:.1}  p90 {:.1}  p99 {:.1}", percentile(0.5), percentile(0.9), percentile(0.99));
    println!("throughput: {:.1} items/s", summary["items_per_second"].as_f64().unwrap_or(0.0));
    crate::report::write_json(args.out.as_deref(), &summary)
}

/// [`failure_counts`] on one line, e.g. "503 ×12, Io/ConnectionReset ×3".
fn describe_failures(counts: &Value) -> String {
    let kinds = ["status", "connection"].into_iter().filter_map(|group| counts[group].as_object()).flatten();
    kinds.map(|(kind, count)| format!("{kind} ×{count}")).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_counted_by_status_and_by_connection_error() {
        let reset = ureq::Error::from(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer"));
        let shed = ureq::Error::Status(503, ureq::Response::new(503, "Service Unavailable", "").unwrap());
        let timed_out = ureq::Error::Status(504, ureq::Response::new(504, "Gateway Timeout", "").unwrap());
        let failures: Vec<Failure> = [shed, reset, timed_out, ureq::Error::Status(503, ureq::Response::new(503, "", "").unwrap())].into_iter().map(Failure::from).collect();
        assert_eq!(failures[1], Failure::Connection("Io/ConnectionReset".into()));
        let counts = failure_counts(&failures);
        assert_eq!(counts, json!({"status": {"503": 2, "504": 1}, "connection": {"Io/ConnectionReset": 1}}));
        assert_eq!(describe_failures(&counts), "503 ×2, 504 ×1, Io/ConnectionReset ×1");
    }

    #[test]
    fn a_refused_connection_is_a_connection_failure() {
        // A port nothing listens on: bound, then closed.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let failure = send(&ureq::agent(), &format!("http://127.0.0.1:{port}/v1/score"), json!({})).unwrap_err();
        assert_eq!(failure, Failure::Connection("ConnectionFailed/ConnectionRefused".into()));
    }
}
