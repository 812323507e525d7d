//! `tally bench soak`: starts `tally serve`, measures how many requests per second it
//! completes, then sends Poisson load at a multiple of that (2× by default) for N minutes,
//! mixing valid score requests with invalid ones of many kinds. It samples the server's RSS
//! every second and reports requests lost (no response, or a 500: must be 0), answers of the
//! wrong class (an invalid request not answered 4xx, a valid one answered 4xx or with the wrong
//! shape: must be 0), status counts, the RSS slope over the second half, and whether the server
//! exits cleanly on SIGTERM at the end.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};

use crate::child_server::{ChildServer, LaterLog};
use crate::request_shape::RequestShape;
use crate::rng::Rng;

#[derive(clap::Args)]
pub struct SoakArgs {
    /// The model to serve (as `tally serve --model`).
    #[arg(long)]
    pub model: String,
    /// More `tally serve` arguments, space-separated (e.g. "--backend wgpu --max-queue 64").
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub serve_args: String,
    #[arg(long, default_value_t = 10.0)]
    pub minutes: f64,
    /// Offered load as a multiple of the measured capacity.
    #[arg(long, default_value_t = 2.0)]
    pub overload: f64,
    /// Share of requests that are invalid (of 12 kinds, from bad JSON to bad HTTP).
    #[arg(long, default_value_t = 0.3)]
    pub invalid_fraction: f64,
    /// Seconds of back-to-back requests that measure the capacity.
    #[arg(long, default_value_t = 20.0)]
    pub calibrate_secs: f64,
    /// Clients sending back to back while measuring the capacity.
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// The valid requests' shape.
    #[command(flatten)]
    pub shape: RequestShape,
    /// Where to write the JSON result (also printed).
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
}

/// What a request is and what a correct server answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Valid,
    MalformedJson,
    MissingField,
    NoItems,
    EmptyItem,
    IdOutOfRange,
    NegativeId,
    TooManyLabels,
    OtherModel,
    UnknownRoute,
    WrongMethod,
    UnsupportedEncoding,
    BadHttp,
}

const INVALID: [Kind; 12] = [
    Kind::MalformedJson,
    Kind::MissingField,
    Kind::NoItems,
    Kind::EmptyItem,
    Kind::IdOutOfRange,
    Kind::NegativeId,
    Kind::TooManyLabels,
    Kind::OtherModel,
    Kind::UnknownRoute,
    Kind::WrongMethod,
    Kind::UnsupportedEncoding,
    Kind::BadHttp,
];

/// A request's fate.
struct Outcome {
    kind: Kind,
    /// The HTTP status, or `None` when no response came (refused, reset, timed out).
    status: Option<u16>,
    /// For a valid request answered 200: whether the scores have the request's shape.
    well_formed: bool,
}

/// The shape of the valid requests, and the server under test.
struct Target {
    url: String,
    address: String,
    vocab: u64,
    args: SoakArgs,
}

pub fn run(args: SoakArgs) -> Result<()> {
    ensure!(args.minutes > 0.0 && args.overload > 0.0, "--minutes and --overload must be positive");
    ensure!((0.0..=1.0).contains(&args.invalid_fraction), "--invalid-fraction must be between 0 and 1");
    let out = args.out.clone();
    let serve_args = ["--model", args.model.as_str()].into_iter().chain(args.serve_args.split_whitespace());
    let mut server = ChildServer::start(&std::env::current_exe()?, serve_args, &[], LaterLog::EchoWarnings)?;
    let result = soak(&server, args);
    let exit = server.stop();
    let mut summary = result?;
    summary["server_exit"] = exit?;
    println!("{}", serde_json::to_string_pretty(&summary)?);
    crate::report::write_json(out.as_deref(), &summary)?;
    let lost = summary["requests_lost"].as_u64().unwrap_or(0);
    let wrong = summary["wrong_answers"].as_u64().unwrap_or(0);
    ensure!(lost == 0 && wrong == 0, "{lost} requests lost, {wrong} wrong answers");
    Ok(())
}

fn soak(server: &ChildServer, args: SoakArgs) -> Result<Value> {
    let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(600)).build();
    let models: Value = agent.get(&format!("{}/v1/models", server.url)).call()?.into_json()?;
    let target = Target {
        url: server.url.clone(),
        address: server.url.trim_start_matches("http://").to_owned(),
        vocab: models["data"][0]["vocab_size"].as_u64().context("/v1/models has no vocab_size")?,
        args,
    };
    let capacity = measure_capacity(&target, &agent)?;
    let qps = capacity * target.args.overload;
    let duration = target.args.minutes * 60.0;
    eprintln!("capacity {capacity:.2} valid requests/s; soaking at {qps:.2} requests/s for {:.0} s", duration);

    let bar = ProgressBar::new(duration as u64).with_style(ProgressStyle::with_template("soak {bar:30} {pos}/{len} s  {msg}").expect("a valid template"));
    let mut rng = Rng::new(target.args.shape.seed);
    let (done, outcomes) = mpsc::channel::<Outcome>();
    let mut rss: Vec<(f64, f64)> = Vec::new();
    let start = Instant::now();
    let mut next_arrival = 0.0;
    let mut next_sample = 0.0;
    let mut sent = 0usize;
    while next_arrival < duration {
        while next_sample <= next_arrival {
            std::thread::sleep(Duration::from_secs_f64(next_sample).saturating_sub(start.elapsed()));
            let mib = server.rss_mib()?;
            rss.push((next_sample, mib));
            bar.set_position(next_sample as u64);
            bar.set_message(format!("{sent} sent, RSS {mib:.0} MiB"));
            next_sample += 1.0;
        }
        std::thread::sleep(Duration::from_secs_f64(next_arrival).saturating_sub(start.elapsed()));
        let kind = if rng.unit() < target.args.invalid_fraction { INVALID[(rng.unit() * INVALID.len() as f64) as usize % INVALID.len()] } else { Kind::Valid };
        let request = build(kind, &target, &mut rng);
        let (agent, done) = (agent.clone(), done.clone());
        let (url, address) = (target.url.clone(), target.address.clone());
        std::thread::spawn(move || {
            let _ = done.send(send(kind, request, &agent, &url, &address));
        });
        sent += 1;
        next_arrival += -rng.unit().ln() / qps;
    }
    drop(done);
    bar.set_message(format!("{sent} sent; waiting for the last answers"));
    let outcomes: Vec<Outcome> = outcomes.iter().collect();
    bar.finish_and_clear();
    rss.push((start.elapsed().as_secs_f64(), server.rss_mib()?));
    Ok(summarize(&target, capacity, qps, sent, &outcomes, &rss, start.elapsed()))
}

/// Valid requests per second the server completes with `--clients` clients sending back to back.
fn measure_capacity(target: &Target, agent: &ureq::Agent) -> Result<f64> {
    let seconds = target.args.calibrate_secs;
    let start = Instant::now();
    let handles: Vec<_> = (0..target.args.clients)
        .map(|client| {
            let (agent, url) = (agent.clone(), format!("{}/v1/score", target.url));
            let mut rng = Rng::new(target.args.shape.seed ^ ((client as u64 + 1) << 32));
            let requests: Vec<Value> = (0..4096).map(|_| valid(target, &mut rng)).collect();
            std::thread::spawn(move || {
                let mut completed = 0usize;
                for request in requests {
                    if start.elapsed().as_secs_f64() >= seconds {
                        break;
                    }
                    completed += usize::from(agent.post(&url).send_json(request).is_ok());
                }
                completed
            })
        })
        .collect();
    let completed: usize = handles.into_iter().map(|h| h.join().unwrap_or(0)).sum();
    let elapsed = start.elapsed().as_secs_f64();
    ensure!(completed > 0, "no request completed in {elapsed:.1} s of calibration");
    Ok(completed as f64 / elapsed)
}

fn valid(target: &Target, rng: &mut Rng) -> Value {
    let labels = rng.ids(2, target.vocab);
    target.args.shape.request(rng, target.vocab, &labels)
}

/// The request to send: (method, path, extra header, body).
type Request = (&'static str, &'static str, Option<(&'static str, &'static str)>, String);

fn build(kind: Kind, target: &Target, rng: &mut Rng) -> Request {
    let mut body = valid(target, rng);
    let vocab = target.vocab as i64;
    match kind {
        Kind::Valid | Kind::UnknownRoute | Kind::WrongMethod | Kind::UnsupportedEncoding | Kind::BadHttp => {}
        Kind::MalformedJson => return ("POST", "/v1/score", None, body.to_string()[..20].to_owned()),
        Kind::MissingField => {
            if let Some(fields) = body.as_object_mut() {
                fields.remove("label_token_ids");
            }
        }
        Kind::NoItems => body["items"] = json!([]),
        Kind::EmptyItem => body["items"][0] = json!([]),
        Kind::IdOutOfRange => body["items"][0][0] = json!(vocab + 7),
        Kind::NegativeId => body["query"][0] = json!(-1),
        Kind::TooManyLabels => body["label_token_ids"] = json!((0..5000).map(|i| i % vocab).collect::<Vec<_>>()),
        Kind::OtherModel => body["model"] = json!("not-this-one"),
    }
    let body = body.to_string();
    match kind {
        Kind::UnknownRoute => ("POST", "/v1/scores", None, body),
        Kind::WrongMethod => ("GET", "/v1/score", None, String::new()),
        Kind::UnsupportedEncoding => ("POST", "/v1/score", Some(("Content-Encoding", "br")), body),
        Kind::BadHttp => ("BAD(", "/v1/score", None, body),
        _ => ("POST", "/v1/score", None, body),
    }
}

fn send(kind: Kind, (method, path, header, body): Request, agent: &ureq::Agent, url: &str, address: &str) -> Outcome {
    if kind == Kind::BadHttp {
        let (status, well_formed) = raw_exchange(address, &format!("{method} {path} HTTP/1.1\r\nHost: soak\r\n\r\n")).unwrap_or((None, false));
        return Outcome { kind, status, well_formed };
    }
    let mut request = agent.request(method, &format!("{url}{path}")).set("Content-Type", "application/json");
    if let Some((name, value)) = header {
        request = request.set(name, value);
    }
    let response = if method == "GET" { request.call() } else { request.send_string(&body) };
    let (status, answer) = match response {
        Ok(response) => (response.status(), response.into_json::<Value>().ok()),
        Err(ureq::Error::Status(status, response)) => (status, response.into_json::<Value>().ok()),
        Err(ureq::Error::Transport(_)) => return Outcome { kind, status: None, well_formed: false },
    };
    let well_formed = match (&answer, kind) {
        (Some(answer), Kind::Valid) if status == 200 => scores_fit(answer, &body),
        // Every error has the API's JSON body.
        (Some(answer), _) => answer["object"] == "error" && answer["code"] == status,
        (None, _) => false,
    };
    Outcome { kind, status: Some(status), well_formed }
}

/// A response's scores have the request's shape: one row per item, one probability per label.
fn scores_fit(answer: &Value, request: &str) -> bool {
    let Ok(request) = serde_json::from_str::<Value>(request) else { return false };
    let (items, labels) = (request["items"].as_array().map_or(0, Vec::len), request["label_token_ids"].as_array().map_or(0, Vec::len));
    answer["scores"].as_array().is_some_and(|rows| {
        rows.len() == items
            && rows.iter().all(|row| row.as_array().is_some_and(|p| p.len() == labels && p.iter().all(|p| p.as_f64().is_some_and(|p| (0.0..=1.0).contains(&p)))))
    })
}

/// Sends a hand-written (malformed) HTTP request: the reply's status, and whether its body is
/// the API's JSON error.
fn raw_exchange(address: &str, request: &str) -> std::io::Result<(Option<u16>, bool)> {
    let mut stream = TcpStream::connect(address)?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    stream.write_all(request.as_bytes())?;
    let mut reply = String::new();
    let _ = stream.read_to_string(&mut reply);
    let status = reply.strip_prefix("HTTP/1.1 ").and_then(|r| r.get(..3)?.parse().ok());
    let json = reply.split_once("\r\n\r\n").is_some_and(|(_, body)| serde_json::from_str::<Value>(body).is_ok_and(|b| b["object"] == "error"));
    Ok((status, json))
}

fn summarize(target: &Target, capacity: f64, qps: f64, sent: usize, outcomes: &[Outcome], rss: &[(f64, f64)], wall: Duration) -> Value {
    let mut statuses: BTreeMap<String, usize> = BTreeMap::new();
    let mut by_kind: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    let (mut lost, mut wrong) = (0, 0);
    for outcome in outcomes {
        let status = outcome.status.map_or("no response".to_owned(), |s| s.to_string());
        *statuses.entry(status.clone()).or_default() += 1;
        *by_kind.entry(format!("{:?}", outcome.kind)).or_default().entry(status).or_default() += 1;
        match outcome.status {
            None | Some(500..=502) => lost += 1,
            // Shedding under overload (503) and timeouts (504) are answers, for any request.
            Some(503 | 504) => {}
            Some(status) => {
                let right_class = if outcome.kind == Kind::Valid { status == 200 } else { (400..500).contains(&status) };
                wrong += usize::from(!right_class || !outcome.well_formed);
            }
        }
    }
    let valid_ok = outcomes.iter().filter(|o| o.kind == Kind::Valid && o.status == Some(200)).count();
    let half: Vec<(f64, f64)> = rss.iter().copied().filter(|&(t, _)| t >= rss.last().map_or(0.0, |l| l.0) / 2.0).collect();
    let machine = crate::report::cpu_name();
    json!({
        "benchmark": "soak",
        "machine": machine,
        "model": target.args.model,
        "serve_args": target.args.serve_args,
        "minutes": target.args.minutes,
        "capacity_requests_per_s": capacity,
        "overload": target.args.overload,
        "offered_requests_per_s": qps,
        "invalid_fraction": target.args.invalid_fraction,
        "request_shape": target.args.shape.to_json(),
        "requests_sent": sent,
        "responses": outcomes.len(),
        "requests_lost": lost,
        "wrong_answers": wrong,
        "valid_scored": valid_ok,
        "valid_items_per_s": (valid_ok * target.args.shape.items_per_request) as f64 / wall.as_secs_f64(),
        "status_counts": statuses,
        "status_counts_by_kind": by_kind,
        "rss_mib": {
            "start": rss.first().map_or(0.0, |r| r.1),
            "end": rss.last().map_or(0.0, |r| r.1),
            "max": rss.iter().map(|r| r.1).fold(0.0, f64::max),
            "slope_mib_per_min_second_half": slope(&half) * 60.0,
            "samples": rss.iter().map(|&(t, m)| json!([t.round(), (m * 10.0).round() / 10.0])).collect::<Vec<_>>(),
        },
        "wall_s": wall.as_secs_f64(),
    })
}

/// Least-squares slope of `(x, y)` points.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let (mx, my) = (points.iter().map(|p| p.0).sum::<f64>() / n, points.iter().map(|p| p.1).sum::<f64>() / n);
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    if sxx == 0.0 { 0.0 } else { sxy / sxx }
}

#[cfg(test)]
mod tests {
    use super::slope;

    #[test]
    fn slope_is_least_squares() {
        assert_eq!(slope(&[(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)]), 2.0);
        assert_eq!(slope(&[(0.0, 1.0)]), 0.0);
        assert!((slope(&[(0.0, 0.0), (1.0, 1.0), (2.0, 0.0), (3.0, 1.0)]) - 0.2).abs() < 1e-12);
    }
}
