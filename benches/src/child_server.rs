//! `tally serve` as a child process on a free port: the one way tally's benchmarks and its
//! end-to-end tests start a server. It takes the URL from the "listening on" line (the port the
//! server really bound), waits for the "ready" line (model loaded and warmed up), keeps what was
//! logged until then, drains the log afterwards so the server never blocks on a full pipe, and
//! kills the child when dropped.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

/// How long a server may take to be ready: loading, the kernel check and the warm-up included
/// (lavapipe's first autotune takes about a minute).
const START_TIMEOUT: Duration = Duration::from_secs(600);

/// What happens to the server's log once it listens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaterLog {
    /// Read and dropped.
    Drop,
    /// Lines that are not INFO go to this process's stderr, marked `server:` (a benchmark's user
    /// sees the server's warnings and errors as they happen).
    EchoWarnings,
}

/// A running `tally serve` child.
pub struct ChildServer {
    pub child: Child,
    /// `http://host:port`, as the server logged it.
    pub url: String,
    /// What it logged before it was ready (before it listened, until [`Self::wait_ready`]).
    pub startup_log: Vec<String>,
    /// The log's lines until the "ready" line (in a mutex: tests share a server across threads).
    startup: Mutex<mpsc::Receiver<String>>,
    started: Instant,
}

const LISTENING: &str = "listening on http://";
const READY: &str = "ready: serving the API";

impl ChildServer {
    /// Runs `<tally> serve --port 0 <args>` with `env` added, and waits until it is ready.
    pub fn start<I, S>(tally: &Path, args: I, env: &[(&str, &OsStr)], later_log: LaterLog) -> Result<ChildServer>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut server = Self::start_listening(tally, args, env, later_log)?;
        server.wait_ready()?;
        Ok(server)
    }

    /// [`Self::start`], returning as soon as the server listens: while it loads its model.
    pub fn start_listening<I, S>(tally: &Path, args: I, env: &[(&str, &OsStr)], later_log: LaterLog) -> Result<ChildServer>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut child = Command::new(tally)
            .args(["serve", "--port", "0"])
            .args(args)
            .envs(env.iter().copied())
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start `{} serve`", tally.display()))?;
        let log = BufReader::new(child.stderr.take().expect("stderr is piped"));
        // The log is read on its own thread: lines until "ready" come back over the channel (so a
        // server that hangs while loading is caught by the timeout), later ones are drained.
        let (sender, startup) = mpsc::channel();
        std::thread::spawn(move || {
            let mut ready = false;
            for line in log.lines().map_while(Result::ok) {
                if !ready {
                    ready = line.contains(READY);
                    let _ = sender.send(line);
                } else if later_log == LaterLog::EchoWarnings && !line.contains(" INFO ") {
                    eprintln!("server: {line}");
                }
            }
        });
        let mut server = ChildServer { child, url: String::new(), startup_log: Vec::new(), startup: Mutex::new(startup), started: Instant::now() };
        let line = server.wait_for(LISTENING, "listen")?;
        let at = line.find(LISTENING).expect("the line waited for");
        server.url = line[at + "listening on ".len()..].split_whitespace().next().unwrap_or_default().to_owned();
        Ok(server)
    }

    /// Waits until the server has loaded its model and warmed up (its "ready" line).
    pub fn wait_ready(&mut self) -> Result<()> {
        self.wait_for(READY, "get ready").map(drop)
    }

    /// The first startup line containing `marker`; the lines before it go to the startup log.
    fn wait_for(&mut self, marker: &str, what: &str) -> Result<String> {
        let deadline = self.started + START_TIMEOUT;
        loop {
            let next = self.startup.get_mut().unwrap_or_else(|e| e.into_inner()).recv_timeout(deadline.saturating_duration_since(Instant::now()));
            match next {
                Ok(line) if line.contains(marker) => return Ok(line),
                Ok(line) => self.startup_log.push(line),
                Err(waited) => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    let why = match waited {
                        mpsc::RecvTimeoutError::Timeout => format!("did not {what} within {} s", START_TIMEOUT.as_secs()),
                        mpsc::RecvTimeoutError::Disconnected => format!("exited before it could {what}"),
                    };
                    bail!("`tally serve` {why}; its log:\n{}", self.startup_log.join("\n"));
                }
            }
        }
    }

    /// Resident memory, from /proc (Linux).
    pub fn rss_mib(&self) -> Result<f64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).context("cannot read the server's /proc status (Linux only)")?;
        let kib: f64 = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()).context("no VmRSS")?;
        Ok(kib / 1024.0)
    }

    /// Sends SIGTERM (what Kubernetes and systemd send), the way `kill` does.
    pub fn sigterm(&self) -> Result<()> {
        let sent = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().context("cannot run `kill`")?;
        if !sent.success() {
            bail!("`kill -TERM {}` failed", self.child.id());
        }
        Ok(())
    }

    /// SIGTERM, then how the server exited and how long draining took.
    pub fn stop(&mut self) -> Result<Value> {
        let start = Instant::now();
        self.sigterm()?;
        let status = self.child.wait()?;
        Ok(json!({"code": status.code(), "seconds_after_sigterm": start.elapsed().as_secs_f64()}))
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
