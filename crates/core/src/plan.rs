//! Splits a request's items into forward passes that share the query's K/V.
//!
//! A pass pads its items to its longest one, so items are grouped by length; each pass stays
//! under a token budget and an attention budget (the score cells of item rows against the
//! query and their own item), which bound activation memory whatever the request's size.

/// Upper bounds for one items pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PassBudget {
    /// Padded item tokens per pass.
    pub max_tokens: usize,
    /// Attention score cells per pass and per head: padded item tokens × (prefix + item length).
    pub max_attention_cells: usize,
}

impl Default for PassBudget {
    fn default() -> Self {
        PassBudget { max_tokens: 8192, max_attention_cells: 1 << 24 }
    }
}

/// Groups item indices into passes. Every item lands in exactly one pass; an item too large for
/// the budget on its own still gets a pass of its own.
pub fn plan_passes(prefix_len: usize, item_lens: &[usize], budget: PassBudget) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..item_lens.len()).collect();
    order.sort_by_key(|&i| item_lens[i]);
    let mut passes: Vec<Vec<usize>> = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    for index in order {
        // Items come sorted by length, so this item sets the padded length of the pass.
        let padded = item_lens[index];
        let rows = (current.len() + 1) * padded;
        let fits = rows <= budget.max_tokens && rows * (prefix_len + padded) <= budget.max_attention_cells;
        if !fits && !current.is_empty() {
            passes.push(std::mem::take(&mut current));
        }
        current.push(index);
    }
    if !current.is_empty() {
        passes.push(current);
    }
    passes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn everything_fits_in_one_pass_under_a_large_budget() {
        assert_eq!(plan_passes(10, &[3, 1, 2], PassBudget::default()), vec![vec![1, 2, 0]]);
    }

    #[test]
    fn splits_by_tokens_and_by_attention_cells() {
        let lens = [4, 4, 4, 4, 1];
        let by_tokens = plan_passes(0, &lens, PassBudget { max_tokens: 8, max_attention_cells: usize::MAX });
        assert_eq!(by_tokens, vec![vec![4, 0], vec![1, 2], vec![3]]);
        // Two items padded to 4 rows cost 2 × 4 × (100 + 4) = 832 cells > 800: one item per pass.
        let by_cells = plan_passes(100, &lens, PassBudget { max_tokens: usize::MAX, max_attention_cells: 800 });
        assert_eq!(by_cells, vec![vec![4], vec![0], vec![1], vec![2], vec![3]]);
    }

    #[test]
    fn an_oversized_item_gets_its_own_pass() {
        let passes = plan_passes(0, &[1, 50, 1], PassBudget { max_tokens: 10, max_attention_cells: usize::MAX });
        assert_eq!(passes, vec![vec![0, 2], vec![1]]);
    }
}
