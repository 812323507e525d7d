//! The warm-up before a server reports ready. On GPU backends the first pass of each new
//! shape compiles kernels and autotunes its matmuls (minutes on a cold H100), so the first
//! real requests would wait for that. In a scoring pass only the rows vary (pass tokens,
//! items, query chunk). CubeCL's autotune key rounds each matmul dimension up to a power of
//! two and adds a size class from the exact sizes (it changes at 512 and 2048), so each
//! power-of-two bucket is met twice: at its top (a full 512-token prefill chunk) and inside
//! it. That covers every shape class traffic can bring, up to the pass budget.

use tally_core::{ModelLimits, ScoreInput};
use tally_model::PREFILL_CHUNK;

/// Items in warm-up requests are this long, so a pass of `p` tokens holds `p / 16` items.
const ITEM_TOKENS: usize = 16;

/// One step of the warm-up: batches scored one after the other, all with passes of
/// `pass_tokens` item tokens over queries of `query_tokens`.
#[derive(Debug, Clone)]
pub struct WarmupStep {
    pub pass_tokens: usize,
    pub query_tokens: usize,
    pub batches: Vec<Vec<ScoreInput>>,
}

/// The warm-up's steps, smallest first: sizes 16, 32, then ¾·p and p for every power of two
/// p, up to the pass budget or two prefill chunks, whichever is larger. A step of size `s`
/// scores a query of `s` tokens (`s − 1` inside a bucket: odd lengths meet the autotune's
/// alignment classes too; longer queries resume from a cached chunk) with items filling a
/// pass of `s` tokens, or of the budget; first with full-vocabulary log-probabilities, then
/// the same query with a label softmax (the LM head's two routes). The last step batches two
/// requests into one pass, as under load.
pub fn warmup_steps(max_pass_tokens: usize, limits: ModelLimits) -> Vec<WarmupStep> {
    let item_tokens = ITEM_TOKENS.min(limits.max_positions / 2).max(1);
    let max_query = limits.max_positions.saturating_sub(item_tokens).max(1);
    // Whole items only: the largest pass is the budget rounded down to a multiple of them.
    let max_pass_tokens = (max_pass_tokens / item_tokens).max(1) * item_tokens;
    let pass_tokens = |size: usize| (size.min(max_pass_tokens) / item_tokens).max(1) * item_tokens;
    let request = |seed: usize, query_tokens: usize, pass_tokens: usize, apply_softmax: bool| {
        let query = tokens(seed, query_tokens, limits.vocab_size);
        let items = (0..pass_tokens / item_tokens).map(|i| tokens(seed + 1 + i, item_tokens, limits.vocab_size)).collect();
        ScoreInput::new(query, items, vec![0, limits.vocab_size as u32 - 1], apply_softmax, false, limits).expect("warm-up requests stay inside the model's limits")
    };
    let step = |query_tokens: usize, pass_tokens: usize| WarmupStep {
        pass_tokens,
        query_tokens,
        batches: vec![vec![request(0, query_tokens, pass_tokens, false)], vec![request(0, query_tokens, pass_tokens, true)]],
    };

    let largest = max_pass_tokens.max(2 * PREFILL_CHUNK);
    let powers = std::iter::successors(Some(16), |p| Some(p * 2)).take_while(|&p| p < largest).chain([largest]);
    let mut steps = Vec::new();
    for size in powers {
        if size >= 64 {
            let inside = size / 4 * 3;
            steps.push(step((inside - 1).min(max_query), pass_tokens(inside)));
        }
        steps.push(step(size.min(max_query), pass_tokens(size)));
    }
    let half = pass_tokens(max_pass_tokens / 2);
    let query_tokens = half.min(max_query);
    steps.push(WarmupStep {
        pass_tokens: 2 * half,
        query_tokens,
        batches: vec![vec![request(1, query_tokens, half, false), request(2, query_tokens, half, true)]],
    });
    steps
}

/// `len` valid token ids; different seeds give different sequences.
fn tokens(seed: usize, len: usize, vocab_size: usize) -> Vec<u32> {
    (0..len).map(|i| ((seed * 7919 + i * 31 + 7) % vocab_size) as u32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN3: ModelLimits = ModelLimits { vocab_size: 151_936, max_positions: 40_960 };

    fn item_tokens(batch: &[ScoreInput]) -> usize {
        batch.iter().flat_map(|input| &input.items).map(Vec::len).sum()
    }

    #[test]
    fn every_power_of_two_bucket_is_met_at_its_top_and_inside() {
        let steps = warmup_steps(8192, QWEN3);
        let passes: Vec<usize> = steps.iter().map(|s| s.pass_tokens).collect();
        assert_eq!(passes, [16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 8192]);
        let queries: Vec<usize> = steps.iter().map(|s| s.query_tokens).collect();
        assert_eq!(queries[..12], [16, 32, 47, 64, 95, 128, 191, 256, 383, 512, 767, 1024]);
        for step in &steps {
            for batch in &step.batches {
                assert_eq!(item_tokens(batch), step.pass_tokens, "a batch fills its step's pass");
                assert!(batch.iter().all(|input| input.query.len() == step.query_tokens));
            }
        }
    }

    #[test]
    fn both_lm_head_routes_run_on_the_same_query_then_two_requests_share_a_pass() {
        let steps = warmup_steps(1000, QWEN3);
        let (last, singles) = steps.split_last().unwrap();
        for step in singles {
            let [full_vocab, labels_only] = [&step.batches[0][0], &step.batches[1][0]];
            assert!(!full_vocab.apply_softmax && labels_only.apply_softmax);
            assert_eq!(full_vocab.query, labels_only.query, "the second request hits the prefix cache");
        }
        assert_eq!(last.batches.len(), 1);
        let [a, b] = [&last.batches[0][0], &last.batches[0][1]];
        assert_ne!(a.query, b.query, "two prefixes in one pass");
        assert_eq!(last.pass_tokens, 992, "the budget rounded down to whole items");
    }

    #[test]
    fn queries_reach_two_prefill_chunks_under_a_small_budget() {
        let steps = warmup_steps(256, QWEN3);
        assert!(steps.iter().all(|s| s.pass_tokens <= 256));
        let longest = steps.iter().map(|s| s.query_tokens).max();
        assert_eq!(longest, Some(2 * PREFILL_CHUNK));
        assert!(steps.iter().any(|s| s.query_tokens == PREFILL_CHUNK), "a full prefill chunk");
    }

    #[test]
    fn requests_stay_inside_a_small_models_limits() {
        let limits = ModelLimits { vocab_size: 50, max_positions: 24 };
        for step in warmup_steps(8192, limits) {
            for input in step.batches.iter().flatten() {
                let ids = || input.query.iter().chain(input.items.iter().flatten()).chain(&input.labels);
                assert!(ids().all(|&id| (id as usize) < limits.vocab_size));
                assert!(input.items.iter().all(|item| !item.is_empty() && input.query.len() + item.len() <= limits.max_positions));
                assert!(!input.query.is_empty() && !input.items.is_empty());
            }
        }
    }
}
