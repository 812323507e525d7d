//! Splits items (of one request or of several batched together) into forward passes.
//!
//! A pass pads its items to its longest one, so items are grouped by length; each pass stays
//! under a token budget and an attention budget (the score cells of item rows against their
//! prefix and their own item) and a label budget (item rows × the labels of the pass's requests,
//! the LM head's output), which bound activation memory whatever the requests' sizes.

/// Upper bounds for one items pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PassBudget {
    /// Padded item tokens per pass.
    pub max_tokens: usize,
    /// Attention score cells per pass and per head: padded item tokens × (prefix + item length).
    pub max_attention_cells: usize,
    /// Label logits per pass: items × the labels of all requests in the pass.
    pub max_label_cells: usize,
}

impl Default for PassBudget {
    fn default() -> Self {
        PassBudget { max_tokens: 8192, max_attention_cells: 1 << 24, max_label_cells: 1 << 24 }
    }
}

/// The largest token budget taken from a device's memory: past it a pass's launches already
/// fill the GPU, and a larger pass only makes the requests batched behind it wait longer.
pub const MAX_DEVICE_PASS_TOKENS: usize = 32_768;

/// Token budgets from device memory move in steps of this many tokens (so passes keep a few
/// shape classes for the GPU's kernel autotuning).
const DEVICE_PASS_STEP: usize = 512;

impl PassBudget {
    /// Most padded item tokens a pass may take on a device with `free_bytes` of memory free
    /// after the weights are loaded, if each token needs `bytes_per_token` of activations: half
    /// the free memory (the rest for the prefix cache, query K/V and the runtime's pools), in
    /// steps of 512 tokens, from 512 to [`MAX_DEVICE_PASS_TOKENS`].
    pub fn tokens_for_memory(free_bytes: u64, bytes_per_token: u64) -> usize {
        let fitting = (free_bytes / 2 / bytes_per_token.max(1)).min(MAX_DEVICE_PASS_TOKENS as u64) as usize;
        (fitting / DEVICE_PASS_STEP * DEVICE_PASS_STEP).max(DEVICE_PASS_STEP)
    }

    /// Most attention score cells per head a pass may take on a device with `free_bytes` of
    /// memory free after the weights are loaded, for routes that hold a pass's scores in memory
    /// (the cascade: a float32 score and a weight per cell and query head, `query_heads` of them):
    /// a quarter of the free memory, beside the half [`Self::tokens_for_memory`] gives the
    /// activations. At least one cell (an item too large for it still gets a pass of its own).
    pub fn attention_cells_for_memory(free_bytes: u64, query_heads: usize) -> usize {
        let cell_bytes = (query_heads as u64 * SCORE_CELL_BYTES).max(1);
        usize::try_from(free_bytes / 4 / cell_bytes).unwrap_or(usize::MAX).max(1)
    }
}

/// Bytes of one cascade score cell of one head at most: its float32 score and its weight
/// (float32 at most).
const SCORE_CELL_BYTES: u64 = 8;

/// One item to schedule: its own length, the length of the prefix it attends to, and its
/// request (`group`) with that request's number of labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ItemShape {
    pub prefix_len: usize,
    pub len: usize,
    pub group: usize,
    pub labels: usize,
}

/// Groups item indices into passes. Every item lands in exactly one pass; an item too large for
/// the budget on its own still gets a pass of its own.
pub fn plan_passes(items: &[ItemShape], budget: PassBudget) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| items[i].len);
    let mut passes: Vec<Vec<usize>> = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut prefix_sum = 0;
    // The requests in the current pass and the sum of their label counts.
    let mut groups: Vec<usize> = Vec::new();
    let mut label_sum = 0;
    for index in order {
        let item = items[index];
        // Items come sorted by length, so this item sets the padded length of the pass.
        let padded = item.len;
        let count = current.len() + 1;
        let cells = padded * (prefix_sum + item.prefix_len + count * padded);
        let new_group = !groups.contains(&item.group);
        let label_cells = count * (label_sum + if new_group { item.labels } else { 0 });
        let over = count * padded > budget.max_tokens || cells > budget.max_attention_cells || label_cells > budget.max_label_cells;
        if over && !current.is_empty() {
            passes.push(std::mem::take(&mut current));
            (prefix_sum, label_sum) = (0, 0);
            groups.clear();
        }
        if !groups.contains(&item.group) {
            groups.push(item.group);
            label_sum += item.labels;
        }
        current.push(index);
        prefix_sum += item.prefix_len;
    }
    if !current.is_empty() {
        passes.push(current);
    }
    passes
}

/// The padded item tokens of `pass` (indices into `items`, as [`plan_passes`] returns them): its
/// items, each padded to its longest.
pub fn padded_tokens(items: &[ItemShape], pass: &[usize]) -> usize {
    pass.len() * pass.iter().map(|&i| items[i].len).max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNLIMITED: PassBudget = PassBudget { max_tokens: usize::MAX, max_attention_cells: usize::MAX, max_label_cells: usize::MAX };

    fn shapes(prefix_len: usize, lens: &[usize]) -> Vec<ItemShape> {
        lens.iter().map(|&len| ItemShape { prefix_len, len, group: 0, labels: 2 }).collect()
    }

    #[test]
    fn device_budgets_use_half_the_free_memory_in_steps_between_the_bounds() {
        let per_token = 100_000;
        // An 80 GB GPU with the weights loaded: capped.
        assert_eq!(PassBudget::tokens_for_memory(78 << 30, per_token), MAX_DEVICE_PASS_TOKENS);
        // 1 GB free: 5,368 tokens fit in half of it, 5,120 in steps of 512.
        assert_eq!(PassBudget::tokens_for_memory(1 << 30, per_token), 5_120);
        // Just under and at one step.
        assert_eq!(PassBudget::tokens_for_memory(2 * 512 * per_token - 1, per_token), 512);
        assert_eq!(PassBudget::tokens_for_memory(2 * 1024 * per_token, per_token), 1024);
        // Nothing free still leaves a pass of the smallest step.
        assert_eq!(PassBudget::tokens_for_memory(0, per_token), 512);
    }

    #[test]
    fn everything_fits_in_one_pass_under_a_large_budget() {
        assert_eq!(plan_passes(&shapes(10, &[3, 1, 2]), PassBudget::default()), vec![vec![1, 2, 0]]);
    }

    #[test]
    fn device_cell_budgets_use_a_quarter_of_the_free_memory() {
        // An H200 with a 0.6B model loaded, 16 query heads: S1's 20.4 M cells a head fit one pass.
        assert_eq!(PassBudget::attention_cells_for_memory(138 << 30, 16), (138usize << 30) / 4 / 128);
        assert!(PassBudget::attention_cells_for_memory(138 << 30, 16) > 10_000 * 2_040);
        // Just under and at one cell's bytes a quarter; nothing free still leaves one cell.
        assert_eq!(PassBudget::attention_cells_for_memory(4 * 128 * 1000 - 1, 16), 999);
        assert_eq!(PassBudget::attention_cells_for_memory(4 * 128 * 1000, 16), 1000);
        assert_eq!(PassBudget::attention_cells_for_memory(0, 16), 1);
    }

    #[test]
    fn splits_by_tokens_and_by_attention_cells() {
        let lens = [4, 4, 4, 4, 1];
        let (no_prefix, long_prefix) = (shapes(0, &lens), shapes(100, &lens));
        let by_tokens = plan_passes(&no_prefix, PassBudget { max_tokens: 8, ..UNLIMITED });
        assert_eq!(by_tokens, vec![vec![4, 0], vec![1, 2], vec![3]]);
        // Two items padded to 4 rows cost 2 × 4 × (100 + 4) = 832 cells > 800: one item per pass.
        let by_cells = plan_passes(&long_prefix, PassBudget { max_attention_cells: 800, ..UNLIMITED });
        assert_eq!(by_cells, vec![vec![4], vec![0], vec![1], vec![2], vec![3]]);
    }

    #[test]
    fn an_oversized_item_gets_its_own_pass() {
        let items = shapes(0, &[1, 50, 1]);
        let passes = plan_passes(&items, PassBudget { max_tokens: 10, ..UNLIMITED });
        assert_eq!(passes, vec![vec![0, 2], vec![1]]);
        // Past the budget: what a caller that adds rows to a pass has to check.
        assert_eq!(passes.iter().map(|pass| padded_tokens(&items, pass)).collect::<Vec<_>>(), [2, 50]);
    }

    #[test]
    fn a_pass_pads_every_item_to_its_longest() {
        let items = shapes(0, &[4, 1, 7, 2]);
        assert_eq!(padded_tokens(&items, &[0, 1, 3]), 3 * 4);
        assert_eq!(padded_tokens(&items, &[2]), 7);
        assert_eq!(padded_tokens(&items, &[]), 0);
    }

    #[test]
    fn attention_cost_counts_each_items_own_prefix() {
        // Two 2-token items: 2 × (10 + 2) + 2 × (30 + 2) = 88 cells > 80, so they split.
        let mixed = [ItemShape { prefix_len: 10, len: 2, group: 0, labels: 2 }, ItemShape { prefix_len: 30, len: 2, group: 1, labels: 2 }];
        let budget = PassBudget { max_attention_cells: 80, ..UNLIMITED };
        assert_eq!(plan_passes(&mixed, budget), vec![vec![0], vec![1]]);
        assert_eq!(plan_passes(&mixed, PassBudget { max_attention_cells: 88, ..budget }), vec![vec![0, 1]]);
    }

    #[test]
    fn label_cells_count_each_requests_labels_once() {
        // Request 0: 3 items × 1,000 labels; request 1: 1 item × 10 labels.
        let mut items: Vec<ItemShape> = (0..3).map(|_| ItemShape { prefix_len: 0, len: 1, group: 0, labels: 1000 }).collect();
        items.push(ItemShape { prefix_len: 0, len: 1, group: 1, labels: 10 });
        // All four: 4 × 1,010 = 4,040 cells.
        assert_eq!(plan_passes(&items, PassBudget { max_label_cells: 4040, ..UNLIMITED }).len(), 1);
        let passes = plan_passes(&items, PassBudget { max_label_cells: 2000, ..UNLIMITED });
        // A third item of request 0 (3,000) or adding request 1 to it (2 × 1,010) is too much.
        assert_eq!(passes, vec![vec![0, 1], vec![2], vec![3]]);
        for pass in passes {
            let labels: usize = [0, 1].iter().filter(|g| pass.iter().any(|&i| items[i].group == **g)).map(|&g| if g == 0 { 1000 } else { 10 }).sum();
            assert!(pass.len() * labels <= 2000);
        }
    }
}
