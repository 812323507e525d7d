//! `tally bench scenario`: the seed benchmark's scoring workloads, end to end through the engine
//! (token ids in, scores out), reported in the seed report's columns.

use std::time::Instant;

use anyhow::{ensure, Result};
use tally_model::ScoringBackend;
use serde_json::{json, Value};
use tally_core::{Items, PassBudget, Query, ScoreRequest};
use tally_engine::ScorerOptions;

use crate::backend::{device_name, dispatch, WithBackend};
use crate::cli::{Scenario, ScenarioArgs};
use crate::rng::Rng;

pub fn run(args: ScenarioArgs) -> Result<()> {
    let (device, out) = (args.device, args.out.clone());
    let result = dispatch(device, args)?;
    crate::report::write_json(out.as_deref(), &result)
}

impl WithBackend for ScenarioArgs {
    type Output = Value;

    fn run<B: ScoringBackend>(self, device: B::Device) -> Result<Value> {
        let (static_tokens, suffix_tokens, item_tokens) = match self.scenario {
            Scenario::S1 => (2000, 20, 20),
            Scenario::S2 => (1900, 10, 10),
        };
        ensure!(self.requests > 0 && self.items > 0, "--requests and --items must be positive");
        let options = ScorerOptions { pass_budget: PassBudget { max_tokens: self.max_batch_tokens, ..PassBudget::default() }, prefix_cache_bytes: 1 << 30 };
        let mut scorer = crate::loading::load_scorer::<B>(&self.model, &device, options, self.device.attention)?;
        let vocab = scorer.preparer().limits().vocab_size as u64;
        // "Yes" / "No" in the Qwen3 tokenizer when the vocabulary has them.
        let labels: Vec<i64> = if vocab > 9454 { vec![9454, 2753] } else { vec![0, 1] };
        let mut rng = Rng::new(0);
        let mut ids = |n: usize| rng.ids(n, vocab);
        let static_prefix = ids(static_tokens);

        let mut seconds = Vec::with_capacity(self.requests);
        for _ in 0..self.requests {
            // Same static prefix, a new dynamic suffix and new items for every request.
            let query = [static_prefix.clone(), ids(suffix_tokens)].concat();
            let items: Vec<Vec<i64>> = (0..self.items).map(|_| ids(item_tokens)).collect();
            let request = ScoreRequest { query: Query::Ids(query), items: Items::Ids(items), label_token_ids: labels.clone(), apply_softmax: false, item_first: false, model: None };
            let start = Instant::now();
            let input = scorer.preparer().prepare(&request)?;
            let scores = scorer.score_batch(&[&input])?.remove(0);
            seconds.push(start.elapsed().as_secs_f64());
            ensure!(scores.len() == self.items && scores.iter().flatten().all(|p| p.is_finite()), "scoring returned malformed scores");
        }

        let row = |s: f64| json!({"items_per_second": self.items as f64 / s, "ms_per_item": s * 1e3 / self.items as f64, "total_seconds": s});
        let mut warm = seconds[1..].to_vec();
        warm.sort_by(f64::total_cmp);
        let warm_median = warm.get(warm.len() / 2).copied();
        let device_name = device_name(self.device.backend);
        println!(
            "scenario {:?}: {} items/request × {item_tokens} tokens, query {} tokens ({static_tokens} static) | backend {:?} | {device_name}",
            self.scenario,
            self.items,
            static_tokens + suffix_tokens,
            self.device.backend
        );
        println!("{:<12} {:>14} {:>14} {:>12}", "request", "items/s", "ms per item", "total s");
        let print = |name: &str, s: f64| println!("{name:<12} {:>14.1} {:>14.3} {:>12.3}", self.items as f64 / s, s * 1e3 / self.items as f64, s);
        print("cold", seconds[0]);
        if let Some(s) = warm_median {
            print("warm median", s);
        }
        Ok(json!({
            "benchmark": "scenario",
            "scenario": format!("{:?}", self.scenario).to_lowercase(),
            "backend": format!("{:?}", self.device.backend).to_lowercase(),
            "attention": format!("{:?}", self.device.attention).to_lowercase(),
            "dtype": format!("{:?}", self.device.dtype).to_lowercase(),
            "device": device_name,
            "model": self.model.file_name().map(|n| n.to_string_lossy().into_owned()),
            "items_per_request": self.items,
            "query_tokens": static_tokens + suffix_tokens,
            "static_prefix_tokens": static_tokens,
            "item_tokens": item_tokens,
            "request_seconds": seconds,
            "cold": row(seconds[0]),
            "warm_median": warm_median.map(row),
        }))
    }
}
