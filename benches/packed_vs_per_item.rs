//! Packed multi-item scoring vs one run per item, on the CPU backend.
//!
//! Packed: the query runs once, then all items in one extend pass. Per item: every item is its
//! own request, so the query is recomputed for each — what an engine without multi-item
//! scoring does. Same binary, same model, same run; the result is the ratio of the two.
//!
//! `cargo bench -p tally-bench --bench packed_vs_per_item [-- QUERY_TOKENS ITEMS ITEM_TOKENS]`
//! writes `benches/results/packed_vs_per_item-cpu.json`.

use std::path::PathBuf;

use burn::backend::NdArray;
use tally_core::ScoreInput;
use tally_bench::report::{cpu_name, write_json};
use tally_bench::timing::median_seconds;
use tally_engine::{Scorer, ScorerOptions};

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (query_tokens, items, item_tokens) = match args[..] {
        [q, n, l] => (q, n, l),
        _ => (1000, 100, 10),
    };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let model_name = "tied-gqa";
    let mut scorer = Scorer::<NdArray<f32>>::load(&root.join("tests/fixtures/models").join(model_name), &Default::default(), ScorerOptions::default())
        .expect("fixture model loads");
    let vocab = scorer.preparer().limits().vocab_size;
    let ids = |n: usize, seed: usize| -> Vec<u32> { (0..n).map(|i| ((i * 7919 + seed * 104_729) % vocab) as u32).collect() };
    let query = ids(query_tokens, 0);
    let item_ids: Vec<Vec<u32>> = (1..=items).map(|s| ids(item_tokens, s)).collect();
    let input = |items: &[Vec<u32>]| ScoreInput::new(query.clone(), items.to_vec(), vec![1, 2], false, false, scorer.preparer().limits()).expect("valid input");

    let packed_input = input(&item_ids);
    let per_item_inputs: Vec<ScoreInput> = item_ids.iter().map(|item| input(std::slice::from_ref(item))).collect();
    let packed = median_seconds(5, || {
        scorer.score_batch(&[&packed_input]).unwrap();
    });
    let per_item = median_seconds(3, || {
        for single in &per_item_inputs {
            scorer.score_batch(&[single]).unwrap();
        }
    });

    let result = serde_json::json!({
        "benchmark": "packed_vs_per_item",
        "machine": cpu_name(),
        "backend": "ndarray (CPU)",
        "model": model_name,
        "query_tokens": query_tokens,
        "items": items,
        "item_tokens": item_tokens,
        "packed_seconds": packed,
        "per_item_seconds": per_item,
        "packed_items_per_second": items as f64 / packed,
        "per_item_items_per_second": items as f64 / per_item,
        "speedup_packed_over_per_item": per_item / packed,
    });
    println!("{}", serde_json::to_string_pretty(&result).unwrap());
    let out = root.join("benches/results/packed_vs_per_item-cpu.json");
    write_json(Some(&out), &result).expect("the result is written");
    eprintln!("wrote {}", out.display());
}
