//! `tally score` against the float64 reference of `tests/fixtures/generate.py`, and packed
//! scoring against per-item runs of the same binary.

mod common;

use common::{assert_close, fixtures, scores, score};
use serde_json::{json, Value};

const REFERENCE_TOLERANCE: f64 = 1e-3;
const PACKED_TOLERANCE: f64 = 1e-4;

struct Case {
    name: String,
    model: String,
    request: Value,
    expected: Vec<Vec<f64>>,
}

fn cases() -> Vec<Case> {
    let mut cases: Vec<Case> = std::fs::read_dir(fixtures().join("cases"))
        .unwrap()
        .map(|entry| {
            let path = entry.unwrap().path();
            let case: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            Case {
                name: path.file_stem().unwrap().to_string_lossy().into_owned(),
                model: case["model"].as_str().unwrap().to_owned(),
                request: case["request"].clone(),
                expected: serde_json::from_value(case["expected_scores"].clone()).unwrap(),
            }
        })
        .collect();
    cases.sort_by(|a, b| a.name.cmp(&b.name));
    cases
}

fn case(name: &str) -> Case {
    cases().into_iter().find(|c| c.name == name).unwrap_or_else(|| panic!("no fixture case {name}"))
}

#[test]
fn every_fixture_matches_the_float64_reference() {
    let cases = cases();
    assert!(cases.len() >= 6, "fixture cases are missing");
    for case in &cases {
        let response = score(&case.model, &case.request, &[]);
        assert_close(&scores(&response), &case.expected, REFERENCE_TOLERANCE, &case.name);
        assert_eq!(response["object"], "scoring");
        assert_eq!(response["model"], case.model.as_str());
        assert_eq!(response["usage"]["completion_tokens"], 0);
        assert_eq!(response["usage"]["prompt_tokens"], response["usage"]["total_tokens"]);
    }
}

#[test]
fn fixtures_cover_the_shapes_that_break_scoring() {
    let item_lens = |c: &Case| -> Vec<usize> { c.request["items"].as_array().unwrap().iter().map(|i| i.as_array().map_or(1, Vec::len)).collect() };
    let query_len = |c: &Case| c.request["query"].as_array().map_or(0, Vec::len);
    let all = cases();
    assert!(all.iter().any(|c| query_len(c) >= 1500), "a long query");
    assert!(all.iter().any(|c| query_len(c) == 1), "a one-token query");
    assert!(all.iter().any(|c| item_lens(c).contains(&1) && c.request["query"].is_array()), "one-token items");
    assert!(all.iter().any(|c| item_lens(c).len() >= 100), "100+ items");
    for flag in ["apply_softmax", "item_first"] {
        assert!(all.iter().any(|c| c.request[flag] == true), "{flag}");
    }
    assert!(all.iter().any(|c| c.request["query"].is_string()), "text input");
    // Every family, from safetensors and from GGUF.
    for family in ["qwen3", "llama", "qwen2"] {
        for gguf in [false, true] {
            let found = all.iter().any(|c| {
                let dir = common::model(&c.model);
                let is_gguf = dir.join(format!("{}.gguf", c.model)).is_file();
                let arch = if is_gguf {
                    c.model.split('-').next().unwrap().to_owned()
                } else {
                    let config: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
                    config["model_type"].as_str().unwrap().to_owned()
                };
                is_gguf == gguf && arch == family
            });
            assert!(found, "{family} {}", if gguf { "GGUF" } else { "safetensors" });
        }
    }
}

/// Each item run alone (a request with one item) must give what the packed pass gives.
#[test]
fn packed_scores_equal_per_item_runs() {
    for name in ["tied_long_query", "untied_bf16_long_query", "tied_item_first", "llama_gguf_long_query", "qwen2_gguf_k_quants"] {
        let case = case(name);
        let packed = scores(&score(&case.model, &case.request, &[]));
        for (i, item) in case.request["items"].as_array().unwrap().iter().enumerate() {
            let mut single = case.request.clone();
            single["items"] = json!([item]);
            let alone = scores(&score(&case.model, &single, &[]));
            assert_close(&alone, &packed[i..=i], PACKED_TOLERANCE, &format!("{name} item {i} alone"));
        }
    }
}

#[test]
fn splitting_items_across_passes_changes_nothing() {
    let case = case("tied_one_token_query_many_items");
    let one_pass = scores(&score(&case.model, &case.request, &[]));
    let many_passes = scores(&score(&case.model, &case.request, &["--max-batch-tokens", "16"]));
    assert_close(&many_passes, &one_pass, PACKED_TOLERANCE, "split into passes");
    assert_close(&many_passes, &case.expected, REFERENCE_TOLERANCE, "split vs reference");
}

/// The readable table scores text with the real Qwen3 tokenizer: "Yes"/"No" must resolve to
/// the label ids the JSON fixture uses (9454 / 2753) and give the same probabilities.
#[test]
fn text_table_resolves_labels_through_the_tokenizer() {
    let case = case("wide_vocab_text");
    assert_eq!(case.request["label_token_ids"], json!([9454, 2753]));
    let model = common::model(&case.model);
    let mut args = vec!["score", "--model", model.to_str().unwrap(), "--query", case.request["query"].as_str().unwrap()];
    for item in case.request["items"].as_array().unwrap() {
        args.extend(["--item", item.as_str().unwrap()]);
    }
    args.extend(["--label", "Yes", "--label", "No", "--apply-softmax"]);
    let out = common::tally(&args, "");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<Vec<f64>> = table
        .lines()
        .skip(1)
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields[fields.len() - 2..].iter().map(|v| v.parse().unwrap()).collect()
        })
        .collect();
    assert_eq!(rows.len(), case.expected.len(), "{table}");
    for (row, expected) in rows.iter().zip(&case.expected) {
        for (&got, &want) in row.iter().zip(expected) {
            assert!((got - want).abs() <= 1e-6 + REFERENCE_TOLERANCE * want, "{table}");
        }
    }
}
