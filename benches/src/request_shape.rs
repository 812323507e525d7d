//! The requests `bench load` and `bench soak` send, and the flags that shape them: random token
//! ids, so any model (and any server that speaks `/v1/score`) can take them.

use clap::Args;
use serde_json::{json, Value};

use crate::rng::Rng;

/// Defaults: SGLang PR 9748's load shape (300-token queries, 10 items of 20 tokens).
#[derive(Args, Clone, Debug)]
pub struct RequestShape {
    /// Query tokens per request.
    #[arg(long, default_value_t = 300)]
    pub prompt_tokens: usize,
    #[arg(long, default_value_t = 10)]
    pub items_per_request: usize,
    #[arg(long, default_value_t = 20)]
    pub item_tokens: usize,
    /// Seed of the token ids (and of arrivals and request kinds).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl RequestShape {
    /// A `/v1/score` body of this shape with labels `labels`, ids below `vocab`.
    pub fn request(&self, rng: &mut Rng, vocab: u64, labels: &[i64]) -> Value {
        json!({
            "query": rng.ids(self.prompt_tokens, vocab),
            "items": (0..self.items_per_request).map(|_| rng.ids(self.item_tokens, vocab)).collect::<Vec<_>>(),
            "label_token_ids": labels,
        })
    }

    /// As written into every result file.
    pub fn to_json(&self) -> Value {
        json!({"prompt_tokens": self.prompt_tokens, "items": self.items_per_request, "item_tokens": self.item_tokens, "seed": self.seed})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_have_the_asked_shape_and_ids_in_the_vocabulary() {
        let shape = RequestShape { prompt_tokens: 7, items_per_request: 3, item_tokens: 2, seed: 0 };
        let request = shape.request(&mut Rng::new(1), 5, &[0, 4]);
        assert_eq!(request["query"].as_array().unwrap().len(), 7);
        let items = request["items"].as_array().unwrap();
        assert_eq!(items.iter().map(|i| i.as_array().unwrap().len()).collect::<Vec<_>>(), [2, 2, 2]);
        let ids = request["query"].as_array().unwrap().iter().chain(items.iter().flat_map(|i| i.as_array().unwrap()));
        assert!(ids.map(|id| id.as_i64().unwrap()).all(|id| (0..5).contains(&id)));
        assert_eq!(request["label_token_ids"], json!([0, 4]));
    }
}
