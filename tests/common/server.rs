//! `tally serve` as a child process on a free port, and JSON over HTTP to it.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use super::{model, scores};

/// A `tally serve` child on a free port, killed when dropped.
pub struct Server {
    pub child: Child,
    pub url: String,
    /// What it logged before it listened.
    pub startup_log: Vec<String>,
}

impl Server {
    /// Serves the fixture model `model_name`.
    pub fn start(model_name: &str, extra: &[&str]) -> Server {
        Server::start_with(model(model_name).to_str().unwrap(), extra, &[])
    }

    /// Serves `--model <model_arg>` with extra environment variables.
    pub fn start_with(model_arg: &str, extra: &[&str], env: &[(&str, &std::path::Path)]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tally"))
            .args(["serve", "--model", model_arg, "--port", "0"])
            .args(extra)
            .envs(env.iter().copied())
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("tally serve starts");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let mut startup_log = Vec::new();
        let url = loop {
            let Some(Ok(line)) = lines.next() else {
                panic!("tally serve exited before it listened; its log:\n{}", startup_log.join("\n"));
            };
            if let Some(at) = line.find("listening on http://") {
                break line[at + "listening on ".len()..].trim().to_owned();
            }
            startup_log.push(line);
        };
        // Keep draining the log so the server never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Server { child, url, startup_log }
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

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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

