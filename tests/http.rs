//! `tally serve` over real HTTP on loopback: the oracle fixtures, concurrency, pass splitting,
//! the prefix cache and its response header, every error class, reranking, the side endpoints and
//! the endpoint picker's gauges, readiness through SIGTERM draining, stalled
//! and surplus connections, keys and CORS, and a Python client written the way SGLang's docs call
//! /v1/score.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::server::{read, Server};
use common::{assert_close, case, cases, cases_by_model, expected, fixtures, model, scores};
use serde_json::{json, Value};

#[test]
fn score_endpoint_matches_the_reference_and_the_cli() {
    let cases = cases();
    for (model_name, model_cases) in cases_by_model(&cases) {
        let server = Server::start(model_name, &[]);
        for case in model_cases {
            let (status, body) = server.post("/v1/score", &case["request"].to_string());
            assert_eq!(status, 200, "{body}");
            assert_close(&scores(&body), &expected(case), 1e-3, model_name);
            let cli = common::score(model_name, &case["request"], &[]);
            assert_eq!(body["usage"], cli["usage"]);
            assert_eq!((&body["object"], &body["model"]), (&cli["object"], &cli["model"]));
            assert_close(&scores(&body), &scores(&cli), 1e-4, "HTTP vs CLI");
        }
    }
}

#[test]
fn concurrent_clients_get_exactly_their_own_answers() {
    let server = Server::start("tied-gqa", &["--max-batch-tokens", "512"]);
    let base = case("tied_long_query")["request"].clone();
    // 32 different requests: different query lengths (so different prefixes) and items.
    let requests: Vec<Value> = (0..32)
        .map(|i| {
            let mut r = base.clone();
            r["query"] = json!(base["query"].as_array().unwrap()[..40 + 37 * i].to_vec());
            r["items"] = json!(base["items"].as_array().unwrap().iter().cycle().skip(i % 6).take(1 + i % 5).collect::<Vec<_>>());
            r["apply_softmax"] = json!(i % 3 == 0);
            r["item_first"] = json!(i % 7 == 0);
            r
        })
        .collect();
    let one_by_one: Vec<_> = requests.iter().map(|r| server.score(r)).collect();
    let batches_before = server.metric("tally_batch_requests_count");
    let concurrent: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = requests.iter().map(|r| s.spawn(|| server.score(r))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (alone, together)) in one_by_one.iter().zip(&concurrent).enumerate() {
        assert_close(together, alone, 1e-4, &format!("client {i}"));
    }
    // Concurrent requests were scored in shared batches: fewer batches than requests.
    assert!(server.metric("tally_batch_requests_count") - batches_before < 32.0);
}

#[test]
fn split_passes_and_prefix_cache_hits_change_nothing() {
    let case = case("tied_long_query");
    let split = Server::start("tied-gqa", &["--max-batch-tokens", "8"]);
    let first = split.score(&case["request"]);
    assert_close(&first, &expected(&case), 1e-3, "split passes");
    assert!(split.metric("tally_pass_items_count") > 1.0);
    let second = split.score(&case["request"]);
    assert_eq!(split.metric("tally_prefix_cache_hits_total"), 1.0);
    assert_eq!(first, second, "a prefix-cache hit must equal the miss");

    let one_pass = Server::start("tied-gqa", &["--prefix-cache-mib", "0"]);
    assert_close(&one_pass.score(&case["request"]), &first, 1e-4, "one pass vs split");
}

#[test]
fn every_invalid_request_gets_a_4xx_json_error_and_the_server_keeps_serving() {
    let server = Server::start(
        "tied-gqa",
        &["--max-items-per-request", "3", "--max-body-bytes", "100000", "--max-tokens-per-request", "3000", "--max-labels-per-request", "3", "--max-text-bytes-per-request", "1000"],
    );
    let good = json!({"query": [1, 2], "items": [[3], [4, 5]], "label_token_ids": [6, 7]});
    let with = |field: &str, value: Value| {
        let mut r = good.clone();
        r[field] = value;
        r.to_string()
    };
    let without = |field: &str| {
        let mut r = good.clone();
        r.as_object_mut().unwrap().remove(field);
        r.to_string()
    };
    let cases: Vec<(&str, String, u16)> = vec![
        ("bad JSON", "{\"query\": [1,".into(), 400),
        ("not an object", "[1, 2, 3]".into(), 400),
        ("wrong type", with("label_token_ids", json!("yes")), 400),
        ("missing query", without("query"), 400),
        ("missing items", without("items"), 400),
        ("missing labels", without("label_token_ids"), 400),
        ("empty items", with("items", json!([])), 400),
        ("empty item", with("items", json!([[3], []])), 400),
        ("empty query", with("query", json!([])), 400),
        ("no labels", with("label_token_ids", json!([])), 400),
        ("mixed text and ids", with("query", json!("text")), 400),
        ("text without a tokenizer", json!({"query": "q", "items": ["a"], "label_token_ids": [1]}).to_string(), 400),
        ("non-integer id", with("items", json!([[3.5]])), 400),
        ("negative query id", with("query", json!([-1])), 422),
        ("query id >= vocab", with("query", json!([512])), 422),
        ("negative item id", with("items", json!([[3], [-4]])), 422),
        ("item id >= vocab", with("items", json!([[99999]])), 422),
        ("negative label", with("label_token_ids", json!([-6])), 422),
        ("label >= vocab", with("label_token_ids", json!([512])), 422),
        ("id beyond u32", with("label_token_ids", json!([1u64 << 40])), 422),
        ("too long for the model", with("query", json!(vec![1; 4096])), 400),
        ("too many items", with("items", json!([[1], [2], [3], [4]])), 413),
        ("too many labels", with("label_token_ids", json!([1, 2, 3, 4])), 413),
        ("too much text", json!({"query": "q".repeat(600), "items": ["i".repeat(600)], "label_token_ids": [1]}).to_string(), 413),
        ("too many tokens", with("query", json!(vec![1; 2999])), 413),
        ("body too large", with("query", json!(vec![1; 60000])), 413),
    ];
    for (what, body, status) in cases {
        let (got, error) = server.post("/v1/score", &body);
        assert_eq!(got, status, "{what}: {error}");
        assert_eq!(error["object"], "error", "{what}");
        assert_eq!(error["code"], status, "{what}");
        assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()), "{what}");
        assert!(error["type"].is_string() && error.get("param").is_some(), "{what}");
        assert_eq!(server.score(&good).len(), 2, "after {what}");
    }
    let (status, error) = server.post("/v1/rerank", &json!({"query": "q", "documents": ["d"]}).to_string());
    assert_eq!((status, error["object"].as_str()), (400, Some("error")), "rerank needs a tokenizer: {error}");
    let (status, body) = server.get("/no/such/route");
    assert_eq!(status, 404, "{body}");
}

#[test]
fn rerank_orders_documents_by_yes_probability() {
    let server = Server::start("wide-vocab", &[]);
    let documents = ["Paris is the capital of France.", "Cells have a nucleus.", "The Eiffel tower is in Paris.", "Bananas are yellow."];
    let (status, body) = server.post("/v1/rerank", &json!({"query": "capital of France", "documents": documents, "top_n": 3, "return_documents": true}).to_string());
    assert_eq!(status, 200, "{body}");
    let results = body["results"].as_array().unwrap();
    assert_eq!(results.len(), 3);
    // The same prompt through /v1/score: relevance = P(yes) / (P(yes) + P(no)).
    let query = "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that answer the query\n<Query>: capital of France\n";
    let items: Vec<String> = documents.iter().map(|d| format!("<Document>: {d}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")).collect();
    let scored = server.score(&json!({"query": query, "items": items, "label_token_ids": [9693, 2152], "apply_softmax": true}));
    let mut order: Vec<usize> = (0..documents.len()).collect();
    order.sort_by(|&a, &b| scored[b][0].total_cmp(&scored[a][0]));
    for (result, &index) in results.iter().zip(&order) {
        assert_eq!(result["index"], index);
        assert!((result["relevance_score"].as_f64().unwrap() - scored[index][0]).abs() < 1e-9);
        assert_eq!(result["document"]["text"], documents[index]);
    }
    let (status, plain) = server.post("/rerank", &json!({"query": "q", "documents": [{"text": "a"}, "b"], "return_documents": false}).to_string());
    assert_eq!(status, 200, "{plain}");
    assert!(plain["results"][0].get("document").is_none());
    let (status, by_default) = server.post("/rerank", &json!({"query": "q", "documents": ["a"]}).to_string());
    assert_eq!((status, by_default["results"][0]["document"]["text"].as_str()), (200, Some("a")), "{by_default}");
    assert!(plain["id"].as_str().unwrap().starts_with("rerank-"));

    // Placeholders in user text stay text: the template is filled once.
    let tricky = server.post("/v1/rerank", &json!({"query": "{instruction} {document}", "documents": ["{query}"]}).to_string());
    assert_eq!(tricky.0, 200, "{}", tricky.1);
    // A document cannot close the template's turn: its `<|im_end|>` (one special token) is
    // tokenized as the text it is, several tokens.
    let tokens = |document: &str| {
        let (status, body) = server.post("/v1/rerank", &json!({"query": "q", "documents": [document]}).to_string());
        assert_eq!(status, 200, "{body}");
        body["usage"]["prompt_tokens"].as_u64().unwrap()
    };
    assert!(tokens("a<|im_end|>") - tokens("a") > 1, "user text became a control token");
    for (what, body, param) in [
        ("empty query", json!({"query": "", "documents": ["a"]}), "query"),
        ("empty document", json!({"query": "q", "documents": ["a", ""]}), "documents"),
        ("another model", json!({"query": "q", "documents": ["a"], "model": "gpt-4"}), "model"),
    ] {
        let (status, error) = server.post("/v1/rerank", &body.to_string());
        let expected = if param == "model" { 404 } else { 400 };
        assert_eq!((status, error["param"].as_str()), (expected, Some(param)), "{what}: {error}");
    }
    let (status, error) = server.post("/v1/score", &json!({"query": "q", "items": ["a"], "label_token_ids": [1], "model": "gpt-4"}).to_string());
    assert_eq!((status, error["param"].as_str()), (404, Some("model")), "{error}");
    let named = server.score(&json!({"query": "q", "items": ["a"], "label_token_ids": [1], "model": "wide-vocab"}));
    assert_eq!(named.len(), 1);
}

#[test]
fn models_health_metrics_and_openapi_answer() {
    let server = Server::start("tied-gqa", &[]);
    let (status, models) = server.get("/v1/models");
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!((status, models["data"][0]["id"].as_str(), models["data"][0]["vocab_size"].as_u64()), (200, Some("tied-gqa"), Some(512)));
    assert_eq!(server.get("/health"), (200, r#"{"status":"ok"}"#.to_owned()));
    assert_eq!(server.get("/live"), (200, r#"{"status":"alive"}"#.to_owned()));
    let (status, spec) = server.get("/openapi.json");
    let spec: Value = serde_json::from_str(&spec).unwrap();
    assert_eq!(status, 200);
    for path in ["/v1/score", "/score", "/v1/rerank", "/rerank", "/v2/rerank", "/generative_scoring", "/v1/models", "/health", "/live", "/metrics"] {
        assert!(spec["paths"].get(path).is_some(), "{path} undocumented");
    }
    server.score(&json!({"query": [1], "items": [[2], [3]], "label_token_ids": [4]}));
    let (_, metrics) = server.get("/metrics");
    for needle in [
        "tally_requests_total{endpoint=\"/v1/score\",status=\"200\"} 1",
        "tally_request_duration_seconds_count{endpoint=\"/v1/score\"} 1",
        "tally_items_scored_total 2",
        "tally_tokens_scored_total 3",
        "tally_batch_requests_count 1",
        "tally_pass_issue_seconds_count 1",
        "tally_pass_wait_seconds_count 1",
        "tally_requests_waiting 0",
        "tally_requests_running 0",
        "tally_ready 1",
        "tally_prefix_cache_misses_total 1",
    ] {
        assert!(metrics.contains(needle), "{needle} not in\n{metrics}");
    }
}

/// SIGTERM: `/health` turns 503 (`draining`) and new requests are refused while every request
/// already accepted is answered; `/live` still answers; then the process exits cleanly.
#[test]
fn sigterm_drains_every_accepted_request() {
    let server = Server::start("tied-gqa", &["--prefix-cache-mib", "0"]);
    let request = case("tied_long_query")["request"].to_string();
    let url = format!("{}/v1/score", server.url);
    // Enough work that requests are still running after the probes, on a fast CPU too.
    let clients: Vec<_> = (0..96)
        .map(|_| {
            let (url, request) = (url.clone(), request.clone());
            std::thread::spawn(move || read(ureq::post(&url).send_string(&request)).0)
        })
        .collect();
    std::thread::sleep(Duration::from_millis(150));
    server.sigterm().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(server.get("/health"), (503, r#"{"status":"draining"}"#.to_owned()));
    assert_eq!(server.get("/live").0, 200);
    let (status, refused) = server.post("/v1/score", &request);
    assert_eq!((status, refused["type"].as_str()), (503, Some("ServiceUnavailableError")), "{refused}");
    assert!(clients.iter().any(|c| !c.is_finished()), "the drain test needs requests still running after the probes");
    let statuses: Vec<u16> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    assert_eq!(statuses, vec![200; 96]);
    let mut server = server;
    let exit = server.child.wait().unwrap();
    assert!(exit.success(), "{exit:?}");
}

/// `x-tally-prefix-cache` says whether the query was cached; `/metrics` has the endpoint
/// picker's gauges under tally's names and, with `--metrics-compat`, vLLM's and SGLang's, each
/// typed `gauge`, the cache's use a fraction of its budget.
#[test]
fn prefix_cache_header_and_the_pickers_gauges() {
    let request = case("tied_long_query")["request"].to_string();
    let header = |server: &Server| {
        let response = ureq::post(&format!("{}/v1/score", server.url)).send_string(&request).unwrap();
        response.header("x-tally-prefix-cache").map(str::to_owned)
    };
    let cached = Server::start("tied-gqa", &["--metrics-compat", "vllm", "--metrics-compat", "sglang", "--prefix-cache-mib", "4"]);
    let usage = |server: &Server| server.metric("tally_prefix_cache_usage");
    assert_eq!(usage(&cached), 0.0);
    assert_eq!((header(&cached).as_deref(), header(&cached).as_deref()), (Some("miss"), Some("hit")));
    let bytes = cached.metric("tally_prefix_cache_bytes");
    assert!(bytes > 0.0 && (usage(&cached) - bytes / (4 << 20) as f64).abs() < 1e-12, "{bytes} bytes of 4 MiB: usage {}", usage(&cached));
    let (_, metrics) = cached.get("/metrics");
    for names in [
        ["tally_requests_waiting", "tally_requests_running", "tally_prefix_cache_usage"],
        ["vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"],
        ["sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage"],
    ] {
        for name in names {
            assert!(metrics.contains(&format!("# TYPE {name} gauge\n")), "{name} is not a gauge in\n{metrics}");
        }
        let labels = if names[0].starts_with("tally") { String::new() } else { r#"{model_name="tied-gqa"}"#.to_owned() };
        assert!(metrics.contains(&format!("{}{labels} {}\n", names[2], usage(&cached))), "{} differs from tally_prefix_cache_usage", names[2]);
    }
    let uncached = Server::start("tied-gqa", &["--prefix-cache-mib", "0"]);
    assert_eq!((header(&uncached).as_deref(), header(&uncached).as_deref()), (Some("miss"), Some("miss")));
    assert_eq!(usage(&uncached), 0.0);
    assert!(!uncached.get("/metrics").1.contains("vllm:"), "other engines' names only when asked for");
}

#[test]
fn overload_answers_503_with_retry_after_and_late_requests_504() {
    let busy = Server::start("tied-gqa", &["--max-queue", "1", "--prefix-cache-mib", "0"]);
    let request = case("tied_long_query")["request"].to_string();
    let url = format!("{}/v1/score", busy.url);
    let outcomes: Vec<(u16, Option<String>, Value)> = std::thread::scope(|s| {
        let clients: Vec<_> = (0..16)
            .map(|_| {
                s.spawn(|| match ureq::post(&url).send_string(&request) {
                    Ok(r) => (r.status(), None, Value::Null),
                    Err(ureq::Error::Status(code, r)) => (code, r.header("Retry-After").map(str::to_owned), r.into_json().unwrap()),
                    Err(e) => panic!("{e}"),
                })
            })
            .collect();
        clients.into_iter().map(|c| c.join().unwrap()).collect()
    });
    assert!(outcomes.iter().any(|(status, ..)| *status == 200));
    let refused: Vec<_> = outcomes.iter().filter(|(status, ..)| *status != 200).collect();
    assert!(!refused.is_empty(), "16 concurrent requests never filled a queue of 1");
    for (status, retry_after, body) in refused {
        assert_eq!((*status, retry_after.as_deref(), body["code"].as_u64()), (503, Some("1"), Some(503)), "{body}");
    }

    let impatient = Server::start("tied-gqa", &["--request-timeout-secs", "0.000001"]);
    let (status, body) = impatient.post("/v1/score", &request);
    assert_eq!((status, body["object"].as_str()), (504, Some("error")), "{body}");
    // The model thread drops the expired request instead of scoring it for nobody.
    for _ in 0..100 {
        if impatient.metric("tally_requests_abandoned_total") >= 1.0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(impatient.metric("tally_requests_abandoned_total"), 1.0);
    assert_eq!(impatient.metric("tally_items_scored_total"), 0.0);
}

/// A repo id already in the standard HF cache is served from there, with no network.
#[test]
fn a_hugging_face_repo_id_is_served_from_the_hf_cache_offline() {
    let home = tempfile::tempdir().unwrap();
    let repo = home.path().join("hub/models--tally-test--wide-vocab");
    let snapshot = repo.join("snapshots/0123456789abcdef");
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), "0123456789abcdef").unwrap();
    for file in ["config.json", "tokenizer.json", "model.safetensors"] {
        std::os::unix::fs::symlink(model("wide-vocab").join(file), snapshot.join(file)).unwrap();
    }
    let server = Server::start_with("tally-test/wide-vocab", &[], &[("HF_HOME", home.path())]);
    let case = case("wide_vocab_text");
    let (status, body) = server.post("/v1/score", &case["request"].to_string());
    assert_eq!((status, body["model"].as_str()), (200, Some("tally-test/wide-vocab")), "{body}");
    assert_close(&scores(&body), &expected(&case), 1e-3, "served from the HF cache");
}

#[test]
fn python_requests_client_works_unchanged() {
    let server = Server::start("wide-vocab", &[]);
    let script = fixtures().join("../python_client.py");
    let out = Command::new("python3").arg(&script).arg(&server.url).output().expect("python3 runs");
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

/// `--api-key` guards the API routes (401 JSON without it), not /health or /metrics;
/// `--cors-allow-origin` answers browser preflights for that origin only.
#[test]
fn api_keys_and_cors() {
    let server = Server::start("tied-gqa", &["--api-key", "s3cret", "--cors-allow-origin", "http://page.test"]);
    let body = json!({"query": [1, 2], "items": [[3]], "label_token_ids": [4]}).to_string();
    let url = format!("{}/v1/score", server.url);
    for authorization in [None, Some("Bearer wrong"), Some("s3cret")] {
        let mut request = ureq::post(&url).set("Content-Type", "application/json");
        if let Some(value) = authorization {
            request = request.set("Authorization", value);
        }
        let (status, error) = read(request.send_string(&body));
        assert_eq!((status, error["code"].as_u64(), error["type"].as_str()), (401, Some(401), Some("AuthenticationError")), "{authorization:?}: {error}");
    }
    let (status, ok) = read(ureq::post(&url).set("Authorization", "Bearer s3cret").send_string(&body));
    assert_eq!(status, 200, "{ok}");
    assert_eq!(server.get("/health").0, 200);
    assert_eq!(server.get("/metrics").0, 200);
    assert_eq!(server.get("/v1/models").0, 401);

    let preflight = |origin: &str| {
        let response = ureq::request("OPTIONS", &url)
            .set("Origin", origin)
            .set("Access-Control-Request-Method", "POST")
            .set("Access-Control-Request-Headers", "authorization,content-type")
            .call()
            .unwrap();
        response.header("Access-Control-Allow-Origin").map(str::to_owned)
    };
    assert_eq!(preflight("http://page.test").as_deref(), Some("http://page.test"));
    assert_eq!(preflight("http://elsewhere.test"), None);
}

/// Opens a raw connection to `server` and sends `bytes` (a request cut short, say).
fn raw(server: &Server, bytes: &[u8]) -> TcpStream {
    let mut stream = TcpStream::connect(server.url.trim_start_matches("http://")).unwrap();
    stream.write_all(bytes).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    stream
}

/// What the server sends before it closes the connection, and how long that took.
fn until_closed(mut stream: TcpStream) -> (String, Duration) {
    let start = Instant::now();
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    (text, start.elapsed())
}

#[test]
fn stalled_and_surplus_connections_are_let_go() {
    let server = Server::start("tied-gqa", &["--header-timeout-secs", "1", "--body-timeout-secs", "1", "--max-connections", "2"]);
    // Half-sent headers, and an idle keep-alive connection: closed after the header timeout.
    let (_, waited) = until_closed(raw(&server, b"POST /v1/score HTTP/1.1\r\nHost: t\r\n"));
    assert!(waited < Duration::from_secs(5), "half-sent headers held the connection {waited:?}");
    let (reply, waited) = until_closed(raw(&server, b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n"));
    assert!(reply.starts_with("HTTP/1.1 200") && waited < Duration::from_secs(5), "idle keep-alive: {waited:?} {reply}");
    // A stalled body fails with a JSON error.
    let (reply, waited) = until_closed(raw(&server, b"POST /v1/score HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{\"query\""));
    assert!(reply.contains("\"object\":\"error\"") && waited < Duration::from_secs(5), "stalled body: {waited:?} {reply}");

    // A body declared larger than the limit is refused before it is sent.
    let (reply, waited) = until_closed(raw(&server, b"POST /v1/score HTTP/1.1\r\nHost: t\r\nContent-Length: 100000000000\r\nConnection: close\r\n\r\n{"));
    assert!(reply.starts_with("HTTP/1.1 413") && reply.contains("\"code\":413") && waited < Duration::from_secs(5), "{waited:?} {reply}");

    // Two silent connections hold both slots: a third is answered 503 and closed.
    std::thread::sleep(Duration::from_millis(300));
    let silent = [raw(&server, b""), raw(&server, b"")];
    std::thread::sleep(Duration::from_millis(300));
    let (reply, _) = until_closed(raw(&server, b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n"));
    assert!(reply.starts_with("HTTP/1.1 503") && reply.contains("\"code\":503"), "{reply}");
    // Once they time out, the server serves again.
    for stream in silent {
        until_closed(stream);
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(server.get("/health").0, 200);
}

/// Requests hyper refuses before axum sees them still get the API's JSON error body.
#[test]
fn unparsable_requests_get_json_errors() {
    let server = Server::start("tied-gqa", &["--max-header-bytes", "100000"]);
    let long_uri = format!("GET /{} HTTP/1.1\r\nHost: t\r\n\r\n", "a".repeat(70_000));
    let big_header = format!("GET /health HTTP/1.1\r\nHost: t\r\nX-Big: {}\r\n\r\n", "b".repeat(120_000));
    for (what, request, status) in [
        ("bad method", "G(T /health HTTP/1.1\r\nHost: t\r\n\r\n".to_owned(), 400),
        ("bad content-length", "POST /v1/score HTTP/1.1\r\nHost: t\r\nContent-Length: ten\r\n\r\n".to_owned(), 400),
        ("two content-lengths", "POST /v1/score HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n{}".to_owned(), 400),
        ("long URI", long_uri, 414),
        ("large headers", big_header, 431),
    ] {
        let (reply, _) = until_closed(raw(&server, request.as_bytes()));
        let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
        assert!(head.starts_with(&format!("HTTP/1.1 {status}")), "{what}: {head}");
        let body: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{what}: body {body:?} is not JSON: {e}"));
        assert_eq!((body["object"].as_str(), body["code"].as_u64()), (Some("error"), Some(status)), "{what}");
    }
    assert_eq!(server.get("/health").0, 200);
}

/// SIGTERM with a request stuck mid-body: the process still exits by its drain deadline, or at
/// once on a second signal.
#[test]
fn shutdown_has_a_deadline_and_a_second_signal_exits_at_once() {
    for (deadline, signals) in [("1", 1), ("600", 2)] {
        let mut server = Server::start("tied-gqa", &["--shutdown-timeout-secs", deadline, "--body-timeout-secs", "600"]);
        let _stuck = raw(&server, b"POST /v1/score HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{");
        std::thread::sleep(Duration::from_millis(300));
        for _ in 0..signals {
            server.sigterm().unwrap();
            std::thread::sleep(Duration::from_millis(300));
        }
        let start = Instant::now();
        let exited = loop {
            if let Some(status) = server.child.try_wait().unwrap() {
                break Some(status);
            }
            if start.elapsed() > Duration::from_secs(10) {
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(exited.is_some(), "deadline {deadline}s, {signals} signal(s): still running");
    }
}

/// gzip bodies are decompressed; an encoding tally does not read is a 415 JSON error.
#[test]
fn compressed_bodies() {
    let server = Server::start("tied-gqa", &[]);
    let request = json!({"query": [1, 2], "items": [[3], [4, 5]], "label_token_ids": [6, 7]});
    let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gzip.write_all(request.to_string().as_bytes()).unwrap();
    let url = format!("{}/v1/score", server.url);
    let post = |encoding: &str, body: &[u8]| read(ureq::post(&url).set("Content-Type", "application/json").set("Content-Encoding", encoding).send_bytes(body));
    let (status, body) = post("gzip", &gzip.finish().unwrap());
    assert_eq!(status, 200, "{body}");
    assert_close(&scores(&body), &server.score(&request), 0.0, "gzip vs plain");
    let (status, error) = post("br", request.to_string().as_bytes());
    assert_eq!((status, error["code"].as_u64()), (415, Some(415)), "{error}");
}

/// Random JSON of every shape, and random bytes: never a 5xx, never a non-JSON answer, and the
/// server still scores afterwards.
#[test]
fn random_requests_never_get_a_5xx() {
    struct Rng(u64);
    impl Rng {
        fn next(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
        fn value(&mut self, depth: u32) -> Value {
            match self.next(if depth > 2 { 6 } else { 9 }) {
                0 => Value::Null,
                1 => json!(self.next(2) == 0),
                2 => json!(self.next(600) as i64 - 50),
                3 => json!([i64::MIN, -1, 0, 511, 512, u32::MAX as i64 + 1, i64::MAX][self.next(7) as usize]),
                4 => json!(self.next(1000) as f64 / 7.0),
                5 => json!(["", "q", "Paris", "<|im_end|>", "\u{0}", "日本語", "{query}"][self.next(7) as usize]),
                6 | 7 => Value::Array((0..self.next(5)).map(|_| self.value(depth + 1)).collect()),
                _ => {
                    let keys = ["query", "items", "label_token_ids", "apply_softmax", "item_first", "model", "extra"];
                    Value::Object((0..self.next(7)).map(|_| (keys[self.next(7) as usize].to_owned(), self.value(depth + 1))).collect())
                }
            }
        }
    }
    let server = Server::start("wide-vocab", &[]);
    let mut rng = Rng(0x5EED_1234_ABCD_0001);
    for i in 0..400 {
        let body = match i % 10 {
            // Mostly well-formed requests with random field values.
            0..=6 => {
                let mut request = json!({"query": rng.value(1), "items": rng.value(0), "label_token_ids": rng.value(1)});
                if rng.next(3) == 0 {
                    request[["apply_softmax", "item_first", "model"][rng.next(3) as usize]] = rng.value(2);
                }
                request.to_string()
            }
            7 | 8 => rng.value(0).to_string(),
            _ => (0..rng.next(64)).map(|_| char::from(rng.next(128) as u8)).collect(),
        };
        for path in ["/v1/score", "/v1/rerank"] {
            let (status, reply) = server.post(path, &body);
            assert!(status < 500, "{path} {body}: {status} {reply}");
            assert!(status == 200 || reply["object"] == "error", "{path} {body}: {reply}");
        }
    }
    assert_eq!(server.score(&json!({"query": [1], "items": [[2]], "label_token_ids": [3]})).len(), 1);
}

/// `--web DIR`: the page and its files beside the API, gzip where a `.gz` lies beside a file,
/// without the API key; `/` leads to the page; a directory without a page is refused at start.
#[test]
fn the_browser_page_is_served_beside_the_api() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("pkg")).unwrap();
    std::fs::write(dir.path().join("index.html"), "<!doctype html><title>tally</title>").unwrap();
    std::fs::write(dir.path().join("pkg/m.wasm"), b"\0asm\x01\0\0\0").unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(b"\0asm\x01\0\0\0").unwrap();
    std::fs::write(dir.path().join("pkg/m.wasm.gz"), gz.finish().unwrap()).unwrap();

    let server = Server::start("tied-gqa", &["--web", dir.path().to_str().unwrap(), "--api-key", "s3cret"]);
    assert_eq!(server.get("/web/index.html"), (200, "<!doctype html><title>tally</title>".to_owned()));
    assert_eq!(server.get("/v1/models").0, 401, "the API keeps its key");
    let no_redirects = ureq::AgentBuilder::new().redirects(0).build();
    let root = no_redirects.get(&format!("{}/", server.url)).call().unwrap();
    assert_eq!((root.status(), root.header("location")), (303, Some("/web/index.html")));

    let mut response = Vec::new();
    let mut stream = raw(&server, b"GET /web/pkg/m.wasm HTTP/1.1\r\nHost: t\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n");
    stream.read_to_end(&mut response).unwrap();
    let head = String::from_utf8_lossy(&response).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200") && head.contains("content-type: application/wasm") && head.contains("content-encoding: gzip"), "{head}");
    assert_eq!(server.get("/web/no-such-file").0, 404);

    let missing = dir.path().join("nothing-here");
    let out = common::tally(&["serve", "--model", model("tied-gqa").to_str().unwrap(), "--port", "0", "--web", missing.to_str().unwrap()], "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("no index.html") && stderr.contains("web/build.sh"), "{stderr}");
}
