//! The warm-up before a server reports ready. On GPU backends the first pass of each new
//! shape compiles kernels and autotunes its matmuls (minutes on a cold H100), so the first
//! real requests would wait for that. The backend says which row counts meet every shape
//! class it compiles or tunes for ([`ScoringBackend::warmup_rows`](tally_model::ScoringBackend::warmup_rows));
//! the warm-up turns each into a query prefilled and a pass of items scored. A backend that
//! compiles nothing at run time (the CPU) names none, and the warm-up is empty.

use tally_core::{ModelLimits, ScoreInput};

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

/// The warm-up's steps: first one item of one token after a one-token query (the smallest
/// launches: Burn sizes its cubes by element count); then for each row count `r` of `rows`, a
/// query of `r` tokens, at most `max_query_tokens` (longer queries resume from a cached prefill
/// chunk), with items filling a pass of `r` tokens rounded up to whole items, at most
/// `max_pass_tokens`. Each step runs first with full-vocabulary log-probabilities, then the
/// same query with a label softmax (the LM head's two routes). A last step batches two
/// requests into one pass, as under load. No rows, no steps.
pub fn warmup_steps(rows: &[usize], max_pass_tokens: usize, max_query_tokens: usize, limits: ModelLimits) -> Vec<WarmupStep> {
    if rows.is_empty() {
        return Vec::new();
    }
    let item_tokens = ITEM_TOKENS.min(limits.max_positions / 2).max(1);
    let max_query = limits.max_positions.saturating_sub(item_tokens).min(max_query_tokens).max(1);
    // Whole items only: the largest pass is the budget rounded down to a multiple of them.
    let max_pass_tokens = (max_pass_tokens / item_tokens).max(1) * item_tokens;
    let pass_tokens = |rows: usize| (rows.div_ceil(item_tokens) * item_tokens).clamp(item_tokens, max_pass_tokens);
    let request_of = |seed: usize, query_tokens: usize, pass_tokens: usize, item_tokens: usize, apply_softmax: bool| {
        let query = tokens(seed, query_tokens, limits.vocab_size);
        let items = (0..pass_tokens / item_tokens).map(|i| tokens(seed + 1 + i, item_tokens, limits.vocab_size)).collect();
        ScoreInput::new(query, items, vec![0, limits.vocab_size as u32 - 1], apply_softmax, false, limits).expect("warm-up requests stay inside the model's limits")
    };
    let request = |seed, query_tokens, pass_tokens, apply_softmax| request_of(seed, query_tokens, pass_tokens, item_tokens, apply_softmax);
    let smallest = WarmupStep { pass_tokens: 1, query_tokens: 1, batches: vec![vec![request_of(3, 1, 1, 1, false)], vec![request_of(3, 1, 1, 1, true)]] };
    let mut steps: Vec<WarmupStep> = std::iter::once(smallest)
        .chain(rows.iter().map(|&rows| {
            let (query_tokens, pass_tokens) = (rows.clamp(1, max_query), pass_tokens(rows));
            WarmupStep {
                pass_tokens,
                query_tokens,
                batches: vec![vec![request(0, query_tokens, pass_tokens, false)], vec![request(0, query_tokens, pass_tokens, true)]],
            }
        }))
        .collect();
    let half = (max_pass_tokens / 2 / item_tokens).max(1) * item_tokens;
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

    /// What CubeCL's backends ask for under a budget of 8,192 tokens (`tally_shaders::autotune`).
    const ROWS: [usize; 18] = [16, 32, 47, 64, 95, 128, 191, 256, 383, 512, 767, 1024, 1535, 2048, 3071, 4096, 6143, 8192];

    #[test]
    fn each_row_count_is_a_query_and_a_pass_of_whole_items() {
        let steps = warmup_steps(&ROWS, 8192, usize::MAX, QWEN3);
        let passes: Vec<usize> = steps.iter().map(|s| s.pass_tokens).collect();
        assert_eq!(passes, [1, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 8192]);
        let queries: Vec<usize> = steps.iter().map(|s| s.query_tokens).collect();
        assert_eq!(queries[1..=ROWS.len()], ROWS);
        let smallest = &steps[0].batches[0][0];
        assert_eq!((smallest.query.len(), smallest.items.len(), smallest.items[0].len()), (1, 1, 1), "one one-token item after a one-token query");
        for step in &steps {
            for batch in &step.batches {
                assert_eq!(item_tokens(batch), step.pass_tokens, "a batch fills its step's pass");
                assert!(batch.iter().all(|input| input.query.len() == step.query_tokens));
            }
        }
    }

    #[test]
    fn a_backend_with_nothing_to_tune_warms_up_nothing() {
        assert!(warmup_steps(&[], 8192, usize::MAX, QWEN3).is_empty());
    }

    #[test]
    fn both_lm_head_routes_run_on_the_same_query_then_two_requests_share_a_pass() {
        let steps = warmup_steps(&[16, 749, 1000], 1000, usize::MAX, QWEN3);
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
    fn queries_run_past_a_small_pass_budget() {
        let steps = warmup_steps(&[16, 512, 1024], 256, usize::MAX, QWEN3);
        assert!(steps.iter().all(|s| s.pass_tokens <= 256));
        let queries: Vec<usize> = steps.iter().map(|s| s.query_tokens).collect();
        assert_eq!(queries, [1, 16, 512, 1024, 128], "queries as long as asked; the last step's two requests halve the budget");
    }

    #[test]
    fn queries_stop_at_their_bound_and_longer_steps_share_one() {
        let steps = warmup_steps(&ROWS, 8192, 1024, QWEN3);
        let queries: Vec<usize> = steps.iter().map(|s| s.query_tokens).collect();
        // Just under, at and past the bound; the last step's two requests too.
        assert_eq!(queries, [1, 16, 32, 47, 64, 95, 128, 191, 256, 383, 512, 767, 1024, 1024, 1024, 1024, 1024, 1024, 1024, 1024]);
        let passes: Vec<usize> = steps.iter().map(|s| s.pass_tokens).collect();
        assert_eq!(passes, [1, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 8192], "passes as without the bound");
        let long = &steps[ROWS.len()].batches[0][0].query;
        assert!(steps[12..=ROWS.len()].iter().all(|s| &s.batches[0][0].query == long), "one query, a prefix-cache hit after its first step");
    }

    #[test]
    fn requests_stay_inside_a_small_models_limits() {
        let limits = ModelLimits { vocab_size: 50, max_positions: 24 };
        for step in warmup_steps(&ROWS, 8192, usize::MAX, limits) {
            for input in step.batches.iter().flatten() {
                let ids = || input.query.iter().chain(input.items.iter().flatten()).chain(&input.labels);
                assert!(ids().all(|&id| (id as usize) < limits.vocab_size));
                assert!(input.items.iter().all(|item| !item.is_empty() && input.query.len() + item.len() <= limits.max_positions));
                assert!(!input.query.is_empty() && !input.items.is_empty());
            }
        }
    }
}
