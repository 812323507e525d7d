//! `tally serve` as a child process on a free port, and JSON over HTTP to it.

use std::ffi::OsStr;
use std::ops::{Deref, DerefMut};
use std::path::Path;

use serde_json::Value;
use tally_bench::child_server::{ChildServer, LaterLog};

use super::{model, scores};

/// A `tally serve` child on a free port (tally-bench's [`ChildServer`]: the benchmarks start
/// theirs the same way), with JSON-over-HTTP helpers for the tests.
pub struct Server(pub ChildServer);

impl Deref for Server {
    type Target = ChildServer;
    fn deref(&self) -> &ChildServer {
        &self.0
    }
}

impl DerefMut for Server {
    fn deref_mut(&mut self) -> &mut ChildServer {
        &mut self.0
    }
}

impl Server {
    /// Serves the fixture model `model_name`.
    pub fn start(model_name: &str, extra: &[&str]) -> Server {
        Server::start_with(model(model_name).to_str().unwrap(), extra, &[])
    }

    /// Serves `--model <model_arg>` with extra environment variables.
    pub fn start_with(model_arg: &str, extra: &[&str], env: &[(&str, &Path)]) -> Server {
        let env: Vec<(&str, &OsStr)> = env.iter().map(|&(name, value)| (name, value.as_os_str())).collect();
        let model = ["--model", model_arg];
        let args = model.iter().chain(extra);
        Server(ChildServer::start(Path::new(env!("CARGO_BIN_EXE_tally")), args, &env, LaterLog::Drop).unwrap_or_else(|e| panic!("{e:#}")))
    }

    /// [`Server::start`], returning as soon as it listens: while it loads and warms up.
    pub fn start_listening(model_name: &str, extra: &[&str]) -> Server {
        let model = model(model_name);
        let args = [OsStr::new("--model"), model.as_os_str()].into_iter().chain(extra.iter().map(OsStr::new));
        Server(ChildServer::start_listening(Path::new(env!("CARGO_BIN_EXE_tally")), args, &[], LaterLog::Drop).unwrap_or_else(|e| panic!("{e:#}")))
    }

    pub fn post(&self, path: &str, body: &str) -> (u16, Value) {
        let response = ureq::post(&format!("{}{path}", self.url)).set("Content-Type", "application/json").send_string(body);
        read(response)
    }

    pub fn get(&self, path: &str) -> (u16, String) {
        match ureq::get(&format!("{}{path}", self.url)).call() {
            Ok(r) => (r.status(), r.into_string().unwrap()),
            Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap()),
            Err(e) => panic!("GET {path}: {e}"),
        }
    }

    pub fn score(&self, request: &Value) -> Vec<Vec<f64>> {
        let (status, body) = self.post("/v1/score", &request.to_string());
        assert_eq!(status, 200, "{body}");
        scores(&body)
    }

    pub fn metric(&self, name: &str) -> f64 {
        let (_, text) = self.get("/metrics");
        text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok()).unwrap_or_else(|| panic!("no metric {name}"))
    }
}

pub fn read(response: Result<ureq::Response, ureq::Error>) -> (u16, Value) {
    let (status, response) = match response {
        Ok(r) => (r.status(), r),
        Err(ureq::Error::Status(code, r)) => (code, r),
        Err(e) => panic!("transport error: {e}"),
    };
    let text = response.into_string().unwrap();
    (status, serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON ({status}): {text}")))
}

