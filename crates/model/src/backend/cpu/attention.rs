//! Multi-item attention on the host (`--attention kernel` on the CPU): each item row attends to
//! its group's prefix and to its own item up to itself, in one softmax — no padding, no
//! log-sum-exp merge, no score tensor for the whole pass.
//!
//! The work is cut into tasks of one (group, KV head, query head of that KV head, block of up to
//! [`BLOCK_ROWS`] of the group's token rows), spread over the cores by rayon. A task multiplies
//! its rows' queries by the prefix keys in one matmul (`gemm`, single-threaded), and by the
//! keys of each item its rows belong to (the rows of an item only ever see that item), masks
//! the keys after each row, takes the softmax of each row across both parts, and multiplies
//! by the values the same way, writing its rows of the output directly. Scores take
//! `BLOCK_ROWS × (prefix + longest own window)` floats per task, whatever the pass's size.

use std::ops::Range;

use rayon::prelude::*;

use super::SharedOutput;
use crate::layout::ItemLayout;

/// Token rows of one task: a block's scores against a 2,000-token prefix (512 KiB) stay in a
/// core's L2 cache.
pub const BLOCK_ROWS: usize = 64;

/// What a pass's attention needs to know of its layout, computed once and read by every layer.
pub struct HostAttentionPlan {
    /// Per group: its token rows and its prefix's span (first token, length) in the joined prefix.
    groups: Vec<(Range<usize>, (usize, usize))>,
    /// The first row of the item each row belongs to.
    item_start: Vec<usize>,
    /// Query heads per KV head.
    group_heads: usize,
}

/// One layer's operands, row-major as the decoder's tensors lay them out.
pub struct Operands<'a> {
    /// `[tokens, q_heads, head_dim]`.
    pub queries: &'a [f32],
    /// `[tokens, kv_heads, head_dim]`.
    pub keys: &'a [f32],
    pub values: &'a [f32],
    /// The joined prefix of the pass, `[kv_heads, prefix_tokens, head_dim]`.
    pub prefix_keys: &'a [f32],
    pub prefix_values: &'a [f32],
    pub prefix_tokens: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl HostAttentionPlan {
    /// `prefix_spans[g]`: group `g`'s prefix in the joined prefix; `group_heads`: query heads per KV head.
    pub fn new(layout: &ItemLayout, prefix_spans: &[(usize, usize)], group_heads: usize) -> Self {
        let offsets = layout.offsets();
        let mut item_start = Vec::with_capacity(layout.tokens());
        for item in 0..layout.items() {
            item_start.extend(std::iter::repeat_n(offsets[item], layout.item_len(item)));
        }
        let mut groups = Vec::with_capacity(prefix_spans.len());
        let mut first_item = 0;
        for (&span, items) in prefix_spans.iter().zip(layout.group_sizes()) {
            groups.push((offsets[first_item]..offsets[first_item + items], span));
            first_item += items;
        }
        HostAttentionPlan { groups, item_start, group_heads }
    }

    /// The attention output, `[tokens, q_heads, head_dim]`.
    pub fn run(&self, operands: &Operands<'_>) -> Vec<f32> {
        let Operands { kv_heads, head_dim, .. } = *operands;
        let q_heads = kv_heads * self.group_heads;
        let tokens = self.item_start.len();
        assert_eq!(operands.queries.len(), tokens * q_heads * head_dim, "queries are [tokens, q_heads, head_dim]");
        let mut tasks = Vec::new();
        for (rows, span) in &self.groups {
            for head in 0..q_heads {
                for start in rows.clone().step_by(BLOCK_ROWS) {
                    tasks.push(Task { rows: start..rows.end.min(start + BLOCK_ROWS), prefix: *span, head });
                }
            }
        }
        // NaN until written: a row a task missed cannot pass for a result.
        let mut out = vec![f32::NAN; tokens * q_heads * head_dim];
        let out_rows = SharedOutput(out.as_mut_ptr());
        tasks.into_par_iter().for_each_init(Vec::new, |scores, task| self.run_task(operands, &task, scores, &out_rows));
        out
    }

    /// One task: its rows' attention for one query head, written into `out`.
    fn run_task(&self, o: &Operands<'_>, task: &Task, scores: &mut Vec<f32>, out: &SharedOutput) {
        let (d, kv_heads) = (o.head_dim, o.kv_heads);
        let q_heads = kv_heads * self.group_heads;
        let kv_head = task.head / self.group_heads;
        let rows = task.rows.clone();
        let (prefix_start, prefix_len) = task.prefix;
        // Own keys of a row: its item's rows up to itself; the widest row sets the width.
        let own_width = rows.clone().map(|row| row - self.item_start[row] + 1).max().unwrap_or(0);
        let width = prefix_len + own_width;
        scores.clear();
        scores.resize(rows.len() * width, f32::NEG_INFINITY);
        let scale = (d as f32).powf(-0.5);
        let row_stride = (q_heads * d) as isize;
        let kv_row_stride = (kv_heads * d) as isize;
        let query = |row: usize| o.queries[(row * q_heads + task.head) * d..].as_ptr();
        let key = |row: usize| o.keys[(row * kv_heads + kv_head) * d..].as_ptr();
        let value = |row: usize| o.values[(row * kv_heads + kv_head) * d..].as_ptr();
        let prefix_offset = (kv_head * o.prefix_tokens + prefix_start) * d;

        if prefix_len > 0 {
            // scores[:, ..prefix_len] = scale · Q · K_prefixᵀ
            // SAFETY: Q rows `rows` of head `task.head` (row stride q_heads·d), the prefix keys
            // `[prefix_len, d]` of this KV head read transposed (column stride d), and
            // `scores` `[rows, width]` — all in bounds of their slices.
            unsafe {
                multiply(
                    Product { m: rows.len(), n: prefix_len, k: d },
                    (scores.as_mut_ptr(), width as isize, false),
                    (query(rows.start), row_stride, 1),
                    (o.prefix_keys[prefix_offset..].as_ptr(), 1, d as isize),
                    scale,
                );
            }
        }
        for item in self.items_in(rows.clone()) {
            // scores[item rows, prefix_len..] = scale · Q_item · K_itemᵀ (keys from the item's
            // first row to the block's last row of it)
            let keys = item.end - self.item_start[item.start];
            // SAFETY: as above, the item's keys row-strided by kv_heads·d.
            unsafe {
                multiply(
                    Product { m: item.len(), n: keys, k: d },
                    (scores[(item.start - rows.start) * width + prefix_len..].as_mut_ptr(), width as isize, false),
                    (query(item.start), row_stride, 1),
                    (key(self.item_start[item.start]), 1, kv_row_stride),
                    scale,
                );
            }
        }
        for (local, row) in rows.clone().enumerate() {
            let row_scores = &mut scores[local * width..(local + 1) * width];
            // Keys after the row itself (its item's later rows, or none written) are masked.
            row_scores[prefix_len + row - self.item_start[row] + 1..].fill(f32::NEG_INFINITY);
            softmax_in_place(row_scores);
        }
        let out_start = (rows.start * q_heads + task.head) * d;
        if prefix_len > 0 {
            // out[rows] = P_prefix · V_prefix
            // SAFETY: this task alone writes rows `rows` of head `task.head` (see `run`).
            unsafe {
                multiply(
                    Product { m: rows.len(), n: d, k: prefix_len },
                    (out.at(out_start), row_stride, false),
                    (scores.as_ptr(), width as isize, 1),
                    (o.prefix_values[prefix_offset..].as_ptr(), d as isize, 1),
                    1.0,
                );
            }
        }
        for item in self.items_in(rows.clone()) {
            let keys = item.end - self.item_start[item.start];
            // out[item rows] += P_item · V_item
            // SAFETY: as above.
            unsafe {
                multiply(
                    Product { m: item.len(), n: d, k: keys },
                    (out.at((item.start * q_heads + task.head) * d), row_stride, prefix_len > 0),
                    (scores[(item.start - rows.start) * width + prefix_len..].as_ptr(), width as isize, 1),
                    (value(self.item_start[item.start]), kv_row_stride, 1),
                    1.0,
                );
            }
        }
    }

    /// The parts of `rows` that lie in one item each, in order.
    fn items_in(&self, rows: Range<usize>) -> impl Iterator<Item = Range<usize>> + '_ {
        let mut start = rows.start;
        std::iter::from_fn(move || {
            (start < rows.end).then(|| {
                let item = self.item_start[start];
                let end = (start + 1..rows.end).find(|&row| self.item_start[row] != item).unwrap_or(rows.end);
                let part = start..end;
                start = end;
                part
            })
        })
    }
}

/// One unit of work: a block of one group's rows, one query head.
struct Task {
    rows: Range<usize>,
    prefix: (usize, usize),
    head: usize,
}

/// Sizes of `dst[m, n] (+)= alpha · lhs[m, k] · rhs[k, n]`.
struct Product {
    m: usize,
    n: usize,
    k: usize,
}

/// `dst (+)= alpha · lhs · rhs`, single-threaded. Each operand is a pointer and its strides:
/// `dst` (pointer, row stride, add to what is there), `lhs`/`rhs` (pointer, row stride,
/// column stride).
///
/// # Safety
/// Every element the strides reach for the given sizes must be in bounds of its allocation,
/// and `dst`'s must be written by no one else meanwhile.
unsafe fn multiply(size: Product, dst: (*mut f32, isize, bool), lhs: (*const f32, isize, isize), rhs: (*const f32, isize, isize), alpha: f32) {
    let Product { m, n, k } = size;
    if m == 0 || n == 0 {
        return;
    }
    let (dst, dst_rs, accumulate) = dst;
    // SAFETY: the caller's promise, passed on.
    unsafe {
        gemm::gemm(m, n, k, dst, 1, dst_rs, accumulate, lhs.0, lhs.2, lhs.1, rhs.0, rhs.2, rhs.1, 1.0, alpha, false, false, false, gemm::Parallelism::None);
    }
}

/// Softmax of `scores` in place (−∞ entries become 0). A row always holds at least its own key.
fn softmax_in_place(scores: &mut [f32]) {
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for score in scores.iter_mut() {
        *score = (*score - max).exp();
        sum += *score;
    }
    let inverse = 1.0 / sum;
    scores.iter_mut().for_each(|score| *score *= inverse);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::{multi_item_attention, PaddedPlan};
    use crate::backend::cpu::test_support::{random, tensor, Cpu};
    use crate::kv::PrefixKv;


    /// Groups of (prefix length, item lengths), `q_heads`/`kv_heads`, `head_dim`: the host kernel
    /// against the cascade in Burn's ops (the reference), on seeded sharp inputs.
    fn check(groups: &[(usize, Vec<usize>)], q_heads: usize, kv_heads: usize, head_dim: usize, seed: u64) {
        let layout = ItemLayout::new(groups.iter().map(|(prefix, items)| (*prefix, items.as_slice())));
        let (t, d) = (layout.tokens(), head_dim);
        // Sharp scores (scale 2): softmax rows far from uniform.
        let (queries, keys, values) = (random(seed, t * q_heads * d, 2.0), random(seed + 1, t * kv_heads * d, 2.0), random(seed + 2, t * kv_heads * d, 1.0));
        let prefixes: Vec<PrefixKv<Cpu>> = groups
            .iter()
            .enumerate()
            .map(|(g, (len, _))| PrefixKv { keys: tensor(&random(seed + 10 + g as u64, kv_heads * len * d, 2.0), [kv_heads, *len, d]), values: tensor(&random(seed + 20 + g as u64, kv_heads * len * d, 1.0), [kv_heads, *len, d]) })
            .collect();
        let (prefix, spans) = PrefixKv::join(&prefixes.iter().collect::<Vec<_>>());
        let group = q_heads / kv_heads;
        let reference = PaddedPlan::<Cpu>::new(&layout, &spans, group, &Default::default());
        let expected = multi_item_attention(tensor(&queries, [t, q_heads, d]), tensor(&keys, [t, kv_heads, d]), tensor(&values, [t, kv_heads, d]), &prefix, &reference);
        let expected = expected.into_data().into_vec::<f32>().unwrap();
        let prefix_keys = prefix.keys.clone().into_data().into_vec::<f32>().unwrap();
        let prefix_values = prefix.values.clone().into_data().into_vec::<f32>().unwrap();
        let operands = Operands { queries: &queries, keys: &keys, values: &values, prefix_keys: &prefix_keys, prefix_values: &prefix_values, prefix_tokens: prefix.len(), kv_heads, head_dim };
        let got = HostAttentionPlan::new(&layout, &spans, group).run(&operands);
        let scale = expected.iter().fold(0f32, |m, v| m.max(v.abs()));
        let error = got.iter().zip(&expected).fold(0f32, |m, (g, e)| m.max((g - e).abs())) / scale;
        let prefix_lens: Vec<usize> = groups.iter().map(|(p, _)| *p).collect();
        assert!(got.iter().all(|v| v.is_finite()), "prefixes {prefix_lens:?}: rows left unwritten");
        assert!(error <= 1e-4, "prefixes {prefix_lens:?}, {q_heads}q/{kv_heads}kv, head_dim {d}: relative error {error:e}");
    }

    #[test]
    fn one_token_prefix_and_items_across_block_edges() {
        check(&[(1, vec![1, 17, 65, 2])], 4, 4, 16, 1);
    }

    #[test]
    fn long_prefix_gqa_4_head_dim_64() {
        check(&[(2050, vec![20, 7, 65, 1, 33])], 8, 2, 64, 2);
    }

    #[test]
    fn qwen3_heads_head_dim_128_several_groups_one_without_a_prefix() {
        check(&[(2020, vec![20, 20, 3]), (0, vec![5, 1]), (37, vec![64, 16, 17])], 16, 8, 128, 3);
    }

    #[test]
    fn five_hundred_uneven_items() {
        let items: Vec<usize> = (0..500).map(|i| 1 + (i * 7) % 13).collect();
        check(&[(130, items)], 4, 2, 16, 4);
    }

    #[test]
    fn a_query_prefill_is_one_causal_item_over_many_blocks() {
        check(&[(0, vec![300])], 2, 1, 64, 5);
        check(&[(512, vec![129])], 2, 1, 64, 6);
    }

    #[test]
    fn groups_just_under_at_and_past_a_block() {
        let b = BLOCK_ROWS;
        check(&[(15, vec![b - 1]), (16, vec![b]), (17, vec![b + 1])], 4, 1, 16, 7);
        check(&[(3, vec![b - 2, 1]), (0, vec![1, b, 1]), (9, vec![b / 2, b / 2 + 1, 2 * b + 1])], 6, 2, 24, 8);
        check(&[(33, vec![2, 3])], 64, 1, 16, 9);
    }
}
