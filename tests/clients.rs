//! The scoring and reranking clients people already run, against a live `tally serve`: each
//! route family answers in its own client's shape (vLLM's score pairs and generative scoring,
//! TEI's rerank, Cohere v2's, Jina's), with errors in that client's shape; `--served-model-name`;
//! truncation from the side the client asks; and the real Python clients (the `cohere` SDK's
//! two clients, Haystack's TEI ranker) run unchanged.

mod common;

use std::process::Command;

use common::fixtures;
use common::server::Server;
use serde_json::{json, Value};

const QUERY: &str = "What is the capital of France?";
const DOCUMENTS: [&str; 4] = ["Paris is the capital of France.", "Cells have a nucleus.", "The Eiffel tower is in Paris.", "Bananas are yellow."];

/// The `wide-vocab` fixture (Qwen3's tokenizer) with its context cut to `positions`, so that a
/// document a few hundred tokens long is over-long. The weights and tokenizer are linked, not copied.
fn short_context_model(positions: usize) -> tempfile::TempDir {
    let source = common::model("wide-vocab");
    let dir = tempfile::tempdir().unwrap();
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(source.join("config.json")).unwrap()).unwrap();
    config["max_position_embeddings"] = json!(positions);
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    for file in ["model.safetensors", "tokenizer.json"] {
        std::os::unix::fs::symlink(source.join(file).canonicalize().unwrap(), dir.path().join(file)).unwrap();
    }
    dir
}

/// Each document's relevance through tally's own /v1/rerank, by index.
fn relevance(server: &Server, query: &str, documents: &[&str]) -> Vec<f64> {
    let (status, body) = server.post("/v1/rerank", &json!({"query": query, "documents": documents}).to_string());
    assert_eq!(status, 200, "{body}");
    let mut scores = vec![f64::NAN; documents.len()];
    for result in body["results"].as_array().unwrap() {
        scores[result["index"].as_u64().unwrap() as usize] = result["relevance_score"].as_f64().unwrap();
    }
    scores
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-6
}

/// Indices sorted by score, most relevant first, ties by index.
fn ranking(scores: &[f64]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    order
}

#[test]
fn vllm_score_pairs_and_generative_scoring_answer_in_vllms_shape() {
    let server = Server::start("wide-vocab", &[]);
    let expected = relevance(&server, QUERY, &DOCUMENTS);

    // 1↔N on both routes and under every spelling vLLM takes.
    for (path, body) in [
        ("/score", json!({"model": "wide-vocab", "text_1": QUERY, "text_2": DOCUMENTS})),
        ("/v1/score", json!({"text_1": [QUERY], "text_2": DOCUMENTS})),
        ("/score", json!({"data_1": QUERY, "data_2": DOCUMENTS})),
        ("/v1/score", json!({"queries": QUERY, "documents": DOCUMENTS})),
        ("/score", json!({"queries": [QUERY], "items": DOCUMENTS})),
    ] {
        let (status, answer) = server.post(path, &body.to_string());
        assert_eq!(status, 200, "{path} {body}: {answer}");
        assert_eq!((answer["object"].as_str(), answer["model"].as_str()), (Some("list"), Some("wide-vocab")), "{answer}");
        assert!(answer["id"].as_str().unwrap().starts_with("score-") && answer["created"].as_u64().unwrap() > 1_700_000_000, "{answer}");
        let data = answer["data"].as_array().unwrap();
        assert_eq!(data.len(), DOCUMENTS.len());
        for (index, item) in data.iter().enumerate() {
            assert_eq!((item["index"].as_u64(), item["object"].as_str()), (Some(index as u64), Some("score")), "{item}");
            assert!(close(item["score"].as_f64().unwrap(), expected[index]), "{path}: pair {index}: {item} vs {}", expected[index]);
        }
        let usage = &answer["usage"];
        assert_eq!((usage["completion_tokens"].as_u64(), usage["total_tokens"].as_u64()), (Some(0), usage["prompt_tokens"].as_u64()), "{usage}");
    }

    // N↔N: each pair its own question; two share a query, and are scored as it would be alone.
    let second_query = "Which fruit is yellow?";
    let pairs = json!({"text_1": [QUERY, second_query, QUERY], "text_2": [DOCUMENTS[0], DOCUMENTS[3], DOCUMENTS[2]]});
    let (status, answer) = server.post("/score", &pairs.to_string());
    assert_eq!(status, 200, "{answer}");
    let fruit = relevance(&server, second_query, &[DOCUMENTS[3]]);
    let got: Vec<f64> = answer["data"].as_array().unwrap().iter().map(|item| item["score"].as_f64().unwrap()).collect();
    assert!(close(got[0], expected[0]) && close(got[1], fruit[0]) && close(got[2], expected[2]), "{got:?}");
    let tokens_alone = |query: &str, documents: &[&str]| {
        let (_, body) = server.post("/v1/rerank", &json!({"query": query, "documents": documents}).to_string());
        body["usage"]["prompt_tokens"].as_u64().unwrap()
    };
    assert_eq!(answer["usage"]["prompt_tokens"].as_u64().unwrap(), tokens_alone(QUERY, &[DOCUMENTS[0], DOCUMENTS[2]]) + tokens_alone(second_query, &[DOCUMENTS[3]]));

    // vLLM's errors: nested under `error`, with vLLM's pairing rule.
    for (what, body, status, param) in [
        ("N:M", json!({"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}), 400, "text_2"),
        ("N:1", json!({"text_1": ["a", "b"], "text_2": "c"}), 400, "text_2"),
        ("no text_1", json!({"text_1": [], "text_2": "c"}), 400, "text_1"),
        ("no text_2", json!({"text_1": "a", "text_2": []}), 400, "text_2"),
        ("an empty text", json!({"text_1": "a", "text_2": ["c", ""]}), 400, "text_2"),
        ("over the context", json!({"text_1": "a", "text_2": "b", "truncate_prompt_tokens": 1_000_000}), 400, "truncate_prompt_tokens"),
        ("another model", json!({"text_1": "a", "text_2": "b", "model": "gpt-4"}), 404, "model"),
    ] {
        let (got, error) = server.post("/score", &body.to_string());
        let error = &error["error"];
        assert_eq!((got, error["code"].as_u64(), error["param"].as_str()), (status, Some(u64::from(status)), Some(param)), "{what}: {error}");
        assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()) && error["type"].is_string(), "{what}: {error}");
    }
    let (status, error) = server.post("/score", "{\"text_1\": 3}");
    assert_eq!((status, error["error"]["code"].as_u64()), (400, Some(400)), "{error}");

    // Generative scoring: SGLang's job, the first label's probability, vLLM's softmax default.
    let labels = [9454, 2753];
    let items = [" Paris", " Rome", " Berlin"];
    let sglang = server.score(&json!({"query": "The capital of France is", "items": items, "label_token_ids": labels, "apply_softmax": true}));
    let full_vocabulary = server.score(&json!({"query": "The capital of France is", "items": items, "label_token_ids": labels}));
    for (body, reference) in [
        (json!({"query": "The capital of France is", "items": items, "label_token_ids": labels}), &sglang),
        (json!({"query": "The capital of France is", "items": items, "label_token_ids": labels, "apply_softmax": false}), &full_vocabulary),
    ] {
        let (status, answer) = server.post("/generative_scoring", &body.to_string());
        assert_eq!(status, 200, "{answer}");
        assert!(answer["id"].as_str().unwrap().starts_with("generative-scoring-"), "{answer}");
        assert_eq!((answer["object"].as_str(), answer["usage"]["completion_tokens"].as_u64()), (Some("list"), Some(0)));
        for (index, item) in answer["data"].as_array().unwrap().iter().enumerate() {
            assert_eq!((item["index"].as_u64(), item["object"].as_str()), (Some(index as u64), Some("score")));
            assert!(close(item["score"].as_f64().unwrap(), reference[index][0]), "{item} vs {:?}", reference[index]);
        }
    }
    let (status, error) = server.post("/generative_scoring", &json!({"query": "q", "items": ["a"], "label_token_ids": [151_936]}).to_string());
    assert_eq!((status, error["error"]["param"].as_str()), (422, Some("label_token_ids")), "{error}");
}

#[test]
fn tei_cohere_v2_and_jina_rerank_in_their_own_shapes() {
    let server = Server::start("wide-vocab", &[]);
    let expected = relevance(&server, QUERY, &DOCUMENTS);
    let order = ranking(&expected);

    // TEI: a bare list, most relevant first; probabilities, or logits with raw_scores.
    for path in ["/rerank", "/v1/rerank"] {
        let (status, ranks) = server.post(path, &json!({"query": QUERY, "texts": DOCUMENTS}).to_string());
        assert_eq!(status, 200, "{ranks}");
        let ranks = ranks.as_array().unwrap();
        assert_eq!(ranks.iter().map(|rank| rank["index"].as_u64().unwrap() as usize).collect::<Vec<_>>(), order, "{path}");
        assert!(ranks.iter().all(|rank| rank.get("text").is_none() && close(rank["score"].as_f64().unwrap(), expected[rank["index"].as_u64().unwrap() as usize])));
    }
    let (_, raw) = server.post("/rerank", &json!({"query": QUERY, "texts": DOCUMENTS, "raw_scores": true, "return_text": true, "truncate": false, "truncation_direction": "Right"}).to_string());
    for rank in raw.as_array().unwrap() {
        let index = rank["index"].as_u64().unwrap() as usize;
        let p = expected[index];
        assert!((rank["score"].as_f64().unwrap() - (p / (1.0 - p)).ln()).abs() < 1e-6, "{rank} vs p = {p}");
        assert_eq!(rank["text"], DOCUMENTS[index]);
    }
    // TEI's errors: `{error, error_type}`.
    for body in [json!({"query": QUERY, "texts": []}), json!({"query": "", "texts": ["a"]}), json!({"query": QUERY, "texts": ["a", ""]})] {
        let (status, error) = server.post("/rerank", &body.to_string());
        assert_eq!((status, error["error_type"].as_str()), (400, Some("Validation")), "{body}: {error}");
        assert!(error["error"].as_str().is_some_and(|m| !m.is_empty()), "{error}");
    }

    // Cohere v2: `{id, results: [{index, relevance_score}], meta}`, top_n (null: all).
    for (top_n, count) in [(json!(2), 2), (json!(null), DOCUMENTS.len())] {
        let (status, answer) = server.post("/v2/rerank", &json!({"model": "wide-vocab", "query": QUERY, "documents": DOCUMENTS, "top_n": top_n}).to_string());
        assert_eq!(status, 200, "{answer}");
        let results = answer["results"].as_array().unwrap();
        assert_eq!(results.len(), count);
        for (result, &index) in results.iter().zip(&order) {
            assert_eq!(result["index"].as_u64(), Some(index as u64));
            assert!(close(result["relevance_score"].as_f64().unwrap(), expected[index]));
            assert!(result.get("document").is_none());
        }
        assert_eq!(answer["meta"]["api_version"]["version"], "2");
        assert!(answer["meta"]["billed_units"]["input_tokens"].as_u64().unwrap() > 0 && answer["id"].is_string(), "{answer}");
    }

    // Jina: documents as objects, return_documents, usage.total_tokens.
    let objects: Vec<Value> = DOCUMENTS.iter().map(|text| json!({"text": text})).collect();
    let (status, answer) = server.post("/v1/rerank", &json!({"model": "wide-vocab", "query": QUERY, "documents": objects, "top_n": 3, "return_documents": true}).to_string());
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["model"], "wide-vocab");
    assert!(answer["usage"]["total_tokens"].as_u64().unwrap() > 0);
    for (result, &index) in answer["results"].as_array().unwrap().iter().zip(&order) {
        assert_eq!((result["index"].as_u64(), result["document"]["text"].as_str()), (Some(index as u64), Some(DOCUMENTS[index])));
    }
}

#[test]
fn served_model_names_are_listed_and_answered_to() {
    let server = Server::start("wide-vocab", &["--served-model-name", "Qwen/Qwen3-Reranker-0.6B", "reranker"]);
    let (status, models) = server.get("/v1/models");
    let models: Value = serde_json::from_str(&models).unwrap();
    let ids: Vec<&str> = models["data"].as_array().unwrap().iter().map(|model| model["id"].as_str().unwrap()).collect();
    assert_eq!((status, ids), (200, vec!["Qwen/Qwen3-Reranker-0.6B", "reranker"]));
    for name in ["Qwen/Qwen3-Reranker-0.6B", "reranker"] {
        let (status, body) = server.post("/v1/score", &json!({"model": name, "query": "q", "items": ["a"], "label_token_ids": [1]}).to_string());
        assert_eq!((status, body["model"].as_str()), (200, Some("Qwen/Qwen3-Reranker-0.6B")), "{name}: {body}");
        let (status, body) = server.post("/v1/rerank", &json!({"model": name, "query": "q", "documents": ["a"]}).to_string());
        assert_eq!((status, body["model"].as_str()), (200, Some("Qwen/Qwen3-Reranker-0.6B")), "{name}: {body}");
    }
    for path in ["/v1/score", "/v1/rerank", "/v2/rerank", "/generative_scoring"] {
        let body = json!({"model": "wide-vocab", "query": "q", "items": ["a"], "documents": ["a"], "label_token_ids": [1]});
        let (status, _) = server.post(path, &body.to_string());
        assert_eq!(status, 404, "{path}: the file's own name is not served once names are given");
    }
}

#[test]
fn over_long_documents_are_truncated_from_the_side_asked() {
    let model = short_context_model(160);
    let server = Server::start(model.path().to_str().unwrap(), &[]);
    // ~300 tokens: over the 160-token context with any template.
    let long = format!("{}{}", "Paris is the capital of France. ".repeat(30), "Bananas are yellow. ".repeat(10));

    // Without truncation, an over-long document is refused, in each client's error shape.
    let (status, error) = server.post("/v1/rerank", &json!({"query": QUERY, "documents": [long]}).to_string());
    assert_eq!((status, error["param"].as_str()), (400, Some("documents")), "{error}");
    let (status, error) = server.post("/rerank", &json!({"query": QUERY, "texts": [long], "truncate": false}).to_string());
    assert_eq!((status, error["error_type"].as_str()), (400, Some("Validation")), "{error}");
    let (status, error) = server.post("/score", &json!({"text_1": QUERY, "text_2": [long]}).to_string());
    assert_eq!((status, error["error"]["code"].as_u64()), (400, Some(400)), "{error}");

    // vLLM's truncate_prompt_tokens: each prompt cut to the budget; usage counts what ran.
    let prompt_tokens = |path: &str, body: Value| {
        let (status, answer) = server.post(path, &body.to_string());
        assert_eq!(status, 200, "{path} {body}: {answer}");
        (answer["usage"]["prompt_tokens"].as_u64().unwrap() as usize, answer)
    };
    for budget in [120, 159, 160] {
        let (tokens, _) = prompt_tokens("/v1/rerank", json!({"query": QUERY, "documents": [long], "truncate_prompt_tokens": budget}));
        assert!(tokens <= budget && tokens + 2 >= budget, "budget {budget}: {tokens} tokens ran");
        let (tokens, _) = prompt_tokens("/score", json!({"text_1": QUERY, "text_2": [long], "truncate_prompt_tokens": budget}));
        assert!(tokens <= budget && tokens + 2 >= budget, "budget {budget}: {tokens} tokens ran");
    }
    let (tokens, _) = prompt_tokens("/score", json!({"text_1": QUERY, "text_2": [long], "truncate_prompt_tokens": -1}));
    assert!(tokens <= 160 && tokens >= 158, "-1 is the context length: {tokens}");
    // A document that fits is untouched by a budget it is under.
    let short = relevance(&server, QUERY, &[DOCUMENTS[0]]);
    let (_, answer) = prompt_tokens("/score", json!({"text_1": QUERY, "text_2": [DOCUMENTS[0]], "truncate_prompt_tokens": 150}));
    assert!(close(answer["data"][0]["score"].as_f64().unwrap(), short[0]));

    // The side: right keeps the document's beginning (the capital), left its end (the bananas):
    // each equals the score of the text it kept.
    let side = |side: &str| prompt_tokens("/score", json!({"text_1": QUERY, "text_2": [long], "truncate_prompt_tokens": 140, "truncation_side": side})).1["data"][0]["score"].as_f64().unwrap();
    let (right, left) = (side("right"), side("left"));
    assert!(!close(right, left), "both sides kept the same text: {right}");
    let tei = |direction: &str| {
        let (status, ranks) = server.post("/rerank", &json!({"query": QUERY, "texts": [long], "truncation_direction": direction}).to_string());
        assert_eq!(status, 200, "{ranks}");
        ranks[0]["score"].as_f64().unwrap()
    };
    // TEI truncates by default, to the whole context (160), not 140: a different cut.
    assert!(!close(tei("Left"), tei("Right")));

    // Cohere's max_tokens_per_doc: the document's own text cut before templating.
    let (status, cut) = server.post("/v2/rerank", &json!({"query": QUERY, "documents": [long, "Bananas."], "max_tokens_per_doc": 8}).to_string());
    assert_eq!(status, 200, "{cut}");
    let head = "Paris is the capital of France. Paris";
    let (status, direct) = server.post("/v2/rerank", &json!({"query": QUERY, "documents": [head, "Bananas."]}).to_string());
    assert_eq!(status, 200, "{direct}");
    assert_eq!(cut["meta"]["billed_units"]["input_tokens"], direct["meta"]["billed_units"]["input_tokens"], "8 tokens are {head:?}");
    assert_eq!(cut["results"], direct["results"]);

    // A budget the template and query alone overflow is a clear 400 on the query.
    let (status, error) = server.post("/v1/rerank", &json!({"query": QUERY, "documents": [long], "truncate_prompt_tokens": 20}).to_string());
    assert_eq!((status, error["param"].as_str()), (400, Some("query")), "{error}");
}

/// The real clients, through `tests/rerank_clients.py` (it names the packages; CI installs them).
#[test]
fn the_cohere_sdk_and_haystacks_tei_ranker_work_unchanged() {
    let model = short_context_model(160);
    let server = Server::start(model.path().to_str().unwrap(), &["--api-key", "tally-test-key", "--served-model-name", "tally-reranker"]);
    let script = fixtures().join("../rerank_clients.py");
    let out = Command::new("python3").args([script.to_str().unwrap(), &server.url, "tally-test-key", "tally-reranker"]).output().expect("python3 runs");
    let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{log}\n(the clients: python3 -m pip install cohere==7.3.1 huggingface-api-haystack==3.1.0 requests)");
    println!("{log}");
}
