//! Fixture models and float64 cases, and the one comparison of probabilities every end-to-end
//! test uses. Nothing here runs the `tally` binary, so the engine's tests include this file too.

use std::path::PathBuf;

use serde_json::Value;

/// `tests/fixtures`, found from whichever package's tests include this file.
pub fn fixtures() -> PathBuf {
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.ancestors().map(|dir| dir.join("tests/fixtures")).find(|dir| dir.is_dir()).expect("tests/fixtures above the package")
}

pub fn model(name: &str) -> PathBuf {
    fixtures().join("models").join(name)
}

pub fn scores(response: &serde_json::Value) -> Vec<Vec<f64>> {
    serde_json::from_value(response["scores"].clone()).expect("scores is a matrix of numbers")
}

/// Asserts every probability of `got` is within `rel` relative error of `expected`.
pub fn assert_close(got: &[Vec<f64>], expected: &[Vec<f64>], rel: f64, what: &str) {
    assert_eq!(got.len(), expected.len(), "{what}: number of items");
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert_eq!(g.len(), e.len(), "{what}: item {i} number of labels");
        for (j, (&g, &e)) in g.iter().zip(e).enumerate() {
            assert!((g - e).abs() <= rel * e.abs(), "{what}: scores[{i}][{j}] = {g}, expected {e} (rel {rel})");
        }
    }
}

/// Every float64 fixture case (`tests/fixtures/cases`), in file order.
pub fn cases() -> Vec<Value> {
    let mut paths: Vec<_> = std::fs::read_dir(fixtures().join("cases")).unwrap().map(|e| e.unwrap().path()).collect();
    paths.sort();
    paths.iter().map(|p| serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()).collect()
}

/// One fixture case by name.
pub fn case(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixtures().join(format!("cases/{name}.json"))).unwrap()).unwrap()
}

/// The fixture cases grouped by the model they run on, in file order.
pub fn cases_by_model(cases: &[Value]) -> Vec<(&str, Vec<&Value>)> {
    let mut groups: Vec<(&str, Vec<&Value>)> = Vec::new();
    for case in cases {
        let model = case["model"].as_str().unwrap();
        match groups.iter_mut().find(|(name, _)| *name == model) {
            Some((_, group)) => group.push(case),
            None => groups.push((model, vec![case])),
        }
    }
    groups
}

/// A case's float64 reference scores.
pub fn expected(case: &Value) -> Vec<Vec<f64>> {
    serde_json::from_value(case["expected_scores"].clone()).unwrap()
}
