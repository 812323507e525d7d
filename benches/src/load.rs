//! `tally bench load`: Poisson arrivals against `/v1/score` (as SGLang's scoring benchmark
//! sends them); reports latency percentiles and items/s, and writes a JSON summary.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use clap::Args;
use serde_json::json;

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
}

struct Outcome {
    latency: Duration,
    ok: bool,
}

pub fn run(args: LoadArgs) -> Result<()> {
    ensure!(args.qps > 0.0 && args.duration > 0.0, "--qps and --duration must be positive");
    let base = args.url.trim_end_matches('/').to_owned();
    let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(600)).build();
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
            let ok = agent.post(&url).send_json(request).is_ok();
            let _ = done.send(Outcome { latency: sent_at.elapsed(), ok });
        });
        sent += 1;
        next_arrival += -rng.unit().ln() / args.qps;
    }
    drop(done);
    let outcomes: Vec<Outcome> = results.iter().collect();
    let wall = start.elapsed().as_secs_f64();

    let mut latencies: Vec<f64> = outcomes.iter().filter(|o| o.ok).map(|o| o.latency.as_secs_f64() * 1e3).collect();
    latencies.sort_by(f64::total_cmp);
    let percentile = |p: f64| latencies.get(((latencies.len() as f64 * p).ceil() as usize).saturating_sub(1)).copied().unwrap_or(f64::NAN);
    let ok = latencies.len();
    let summary = json!({
        "benchmark": "load",
        "url": base,
        "qps": args.qps,
        "duration_s": args.duration,
        "items_per_request": shape.items_per_request,
        "prompt_tokens": shape.prompt_tokens,
        "item_tokens": shape.item_tokens,
        "requests_sent": sent,
        "requests_ok": ok,
        "requests_failed": sent - ok,
        "wall_s": wall,
        "latency_ms": {"p50": percentile(0.5), "p90": percentile(0.9), "p99": percentile(0.99)},
        "items_per_second": (ok * shape.items_per_request) as f64 / wall,
    });
    println!("requests: {sent} sent, {ok} ok, {} failed in {wall:.1} s", sent - ok);
    println!("latency ms: p50 {:.1}  p90 {:.1}  p99 {:.1}", percentile(0.5), percentile(0.9), percentile(0.99));
    println!("throughput: {:.1} items/s", summary["items_per_second"].as_f64().unwrap_or(0.0));
    crate::report::write_json(args.out.as_deref(), &summary)
}
