//! Multi-item attention in plain Burn ops: the reference path, and the CPU path.
//!
//! Items arrive packed (`[tokens, heads, head_dim]`, see [`ItemLayout`]); this path pads them
//! to a common length `L` as `[N, L]` and back, with gathers planned once per pass
//! ([`PaddedPlan`]). Items come in groups, each group sharing one prefix (the query of one
//! request), read from the pass's joined prefix K/V at the group's span. An item row attends to (a) every key of its group's
//! prefix and (b) its own item's keys up to itself. The two parts are computed separately,
//! each with its log-sum-exp, and merged exactly (cascade attention), so no mask over
//! prefix + all items is ever built: the only mask is the `L × L` causal one. Padding rows
//! produce garbage that nobody reads; padding keys sit after every real row, so the causal
//! mask already hides them.
//!
//! The log-sum-exps and the merge are float32 whatever the model's dtype, as a fused kernel
//! keeps them in registers: a 16-bit log-sum-exp of 20 is off by up to 0.06, which moves a
//! part's weight in the merge by 6%. The scores are float32 where the backend's matmul writes
//! them so at no extra pass ([`Matmul::matmul_wide`]: cuBLASLt).

use burn::tensor::{backend::Backend, DType, Int, Tensor, TensorData};

use crate::kv::PrefixKv;
use crate::layout::ItemLayout;
use crate::matmul::Matmul;

/// What the padded path computes once per pass and every layer reuses: the gathers between
/// packed and padded rows and the causal mask.
pub struct PaddedPlan<B: Backend> {
    /// Padded slot (n, k) reads packed row `offsets[n] + min(k, len_n − 1)`.
    padded_rows: Tensor<B, 1, Int>,
    /// Packed row `offsets[n] + k` reads padded slot `n·L + k`.
    packed_rows: Tensor<B, 1, Int>,
    causal_bias: Tensor<B, 2>,
    /// Per group: its prefix's (first token, length) in the joined prefix K/V, and its items.
    groups: Vec<((usize, usize), usize)>,
    items: usize,
    len: usize,
    /// The row softmax a backend's kernel runs in place of Burn's ops (`None`: Burn's ops).
    softmax: Option<RowSoftmax<B>>,
}

/// A row softmax with its log-sum-exp, as [`softmax_lse`] computes it: the weights in the
/// dtype given, the log-sum-exp in float32.
pub type RowSoftmax<B> = fn(Tensor<B, 2>, DType) -> (Tensor<B, 2>, Tensor<B, 2>);

impl<B: Matmul> PaddedPlan<B> {
    /// `prefix_spans[g]`: (first token, length) of group `g`'s prefix in the joined prefix K/V;
    /// `group`: query heads per KV head.
    pub fn new(layout: &ItemLayout, prefix_spans: &[(usize, usize)], group: usize, device: &B::Device) -> Self {
        let (items, len) = (layout.items(), layout.max_item_len());
        let padded_rows: Vec<i64> = (0..items)
            .flat_map(|n| (0..len).map(move |k| (layout.offsets()[n] + k.min(layout.item_len(n) - 1)) as i64))
            .collect();
        let packed_rows: Vec<i64> = (0..items).flat_map(|n| (0..layout.item_len(n)).map(move |k| (n * len + k) as i64)).collect();
        let index = |rows: Vec<i64>| {
            let count = rows.len();
            Tensor::<B, 1, Int>::from_data(TensorData::new(rows, [count]), device)
        };
        PaddedPlan {
            padded_rows: index(padded_rows),
            packed_rows: index(packed_rows),
            // In the dtype the scores it is added to come in.
            causal_bias: cast(causal_bias(len, group, device), B::wide_dtype(<B::FloatElem as burn::tensor::Element>::dtype())),
            groups: prefix_spans.iter().copied().zip(layout.group_sizes()).collect(),
            items,
            len,
            softmax: None,
        }
    }

    /// The same plan with its softmaxes run by `softmax` (a backend's kernel) in place of Burn's ops.
    pub fn with_softmax(self, softmax: RowSoftmax<B>) -> Self {
        PaddedPlan { softmax: Some(softmax), ..self }
    }

    /// Whether a backend's kernel runs the softmaxes.
    pub fn has_softmax_kernel(&self) -> bool {
        self.softmax.is_some()
    }

    fn softmax(&self) -> RowSoftmax<B> {
        self.softmax.unwrap_or(softmax_lse::<B>)
    }
}

/// Attention output (the values' dtype) with its per-row log-sum-exp (float32), both
/// item-major: `[N, kv, rows, d]`, `[N, kv, rows, 1]`.
struct Partial<B: Backend> {
    output: Tensor<B, 4>,
    lse: Tensor<B, 4>,
}

/// `queries`: `[tokens, q_heads, head_dim]`; `keys`/`values`: `[tokens, kv_heads, head_dim]`,
/// packed as planned; `prefix`: every group's prefix end to end, at the planned spans (see
/// [`PrefixKv::join`]). Returns `[tokens, q_heads, head_dim]`.
pub fn multi_item_attention<B: Matmul>(queries: Tensor<B, 3>, keys: Tensor<B, 3>, values: Tensor<B, 3>, prefix: &PrefixKv<B>, plan: &PaddedPlan<B>) -> Tensor<B, 3> {
    let [tokens, q_heads, head_dim] = queries.dims();
    let (items, len) = (plan.items, plan.len);
    let pad = |t: Tensor<B, 3>| {
        let heads = t.dims()[1];
        t.select(0, plan.padded_rows.clone()).reshape([items, len, heads, head_dim])
    };
    let padded = padded_attention(pad(queries), pad(keys), pad(values), prefix, plan);
    padded.reshape([items * len, q_heads, head_dim]).select(0, plan.packed_rows.clone()).reshape([tokens, q_heads, head_dim])
}

/// `queries`: `[N, L, q_heads, head_dim]`; `keys`/`values`: `[N, L, kv_heads, head_dim]`.
/// Returns `[N, L, q_heads * head_dim]`.
fn padded_attention<B: Matmul>(queries: Tensor<B, 4>, keys: Tensor<B, 4>, values: Tensor<B, 4>, prefix: &PrefixKv<B>, plan: &PaddedPlan<B>) -> Tensor<B, 3> {
    let [items, len, q_heads, head_dim] = queries.dims();
    let kv_heads = keys.dims()[2];
    let group = q_heads / kv_heads;
    let scale = (head_dim as f64).powf(-0.5);

    // Query heads of one KV head are adjacent, so a [.., L, kv, group, d] view puts every row
    // that shares a KV head next to each other: GQA without repeating K/V.
    let queries = queries.mul_scalar(scale).reshape([items, len, kv_heads, group, head_dim]).swap_dims(1, 2); // [N, kv, L, g, d]
    let own = own_item_attention(queries.clone(), keys.swap_dims(1, 2), values.swap_dims(1, 2), &plan.causal_bias, plan.softmax());
    let output = if plan.groups.iter().all(|&((_, prefix_len), _)| prefix_len == 0) {
        own.output
    } else {
        let prefix = prefix_attention(queries, prefix, &plan.groups, plan.softmax());
        // Exact merge of two softmax-normalised parts by their log-sum-exps, in float32.
        let dtype = own.output.dtype();
        let max = own.lse.clone().max_pair(prefix.lse.clone());
        let own_weight = (own.lse - max.clone()).exp();
        let prefix_weight = (prefix.lse - max).exp();
        let merged = (cast(own.output, DType::F32) * own_weight.clone() + cast(prefix.output, DType::F32) * prefix_weight.clone()) / (own_weight + prefix_weight);
        cast(merged, dtype)
    };
    // [N, kv, L·g, d] → [N, L, q_heads·d], heads in checkpoint order.
    output.reshape([items, kv_heads, len, group, head_dim]).swap_dims(1, 2).reshape([items, len, q_heads * head_dim])
}

/// Each item against its own keys, causally. `queries`: `[N, kv, L, g, d]`, keys/values `[N, kv, L, d]`.
fn own_item_attention<B: Matmul>(queries: Tensor<B, 5>, keys: Tensor<B, 4>, values: Tensor<B, 4>, causal_bias: &Tensor<B, 2>, softmax: RowSoftmax<B>) -> Partial<B> {
    let [items, kv_heads, len, group, head_dim] = queries.dims();
    let queries = queries.reshape([items, kv_heads, len * group, head_dim]);
    let scores = B::matmul_wide(queries, keys.swap_dims(2, 3)) + causal_bias.clone().unsqueeze::<4>();
    let (output, lse) = softmax_times_values(scores, values, softmax);
    Partial { output, lse }
}

/// Each group's items against the group's prefix (`groups`: its span in `joined`, its item
/// count). Returns item-major partials for all `N` items; items whose prefix is empty get a
/// log-sum-exp of −∞, so the merge ignores them.
fn prefix_attention<B: Matmul>(queries: Tensor<B, 5>, joined: &PrefixKv<B>, groups: &[((usize, usize), usize)], softmax: RowSoftmax<B>) -> Partial<B> {
    let [_, kv_heads, len, group, head_dim] = queries.dims();
    let rows = len * group;
    let device = queries.device();
    let mut outputs = Vec::with_capacity(groups.len());
    let mut lses = Vec::with_capacity(groups.len());
    let mut first = 0;
    for &((prefix_start, prefix_len), count) in groups {
        if prefix_len == 0 {
            outputs.push(Tensor::zeros([count, kv_heads, rows, head_dim], (&device, queries.dtype())));
            lses.push(Tensor::full([count, kv_heads, rows, 1], f32::NEG_INFINITY, (&device, DType::F32)));
        } else {
            let prefix = joined.tokens(prefix_start, prefix_len);
            // [kv, count·rows, d]: one batched matmul per KV head covers every item of the group.
            let group_queries = queries.clone().narrow(0, first, count).swap_dims(0, 1).reshape([kv_heads, count * rows, head_dim]);
            let scores = B::matmul_wide(group_queries, prefix.keys.clone().swap_dims(1, 2));
            let (output, lse) = softmax_times_values(scores, prefix.values.clone(), softmax);
            let item_major = |t: Tensor<B, 3>| {
                let width = t.dims()[2];
                t.reshape([kv_heads, count, rows, width]).swap_dims(0, 1)
            };
            outputs.push(item_major(output));
            lses.push(item_major(lse));
        }
        first += count;
    }
    Partial { output: Tensor::cat(outputs, 0), lse: Tensor::cat(lses, 0) }
}

/// Softmax of `scores` over the last dimension (by `softmax`, over the scores as rows), times
/// `values`; with the log-sum-exp per row (float32).
fn softmax_times_values<B: Matmul, const D: usize>(scores: Tensor<B, D>, values: Tensor<B, D>, softmax: RowSoftmax<B>) -> (Tensor<B, D>, Tensor<B, D>) {
    let dims = scores.dims();
    let width = dims[D - 1];
    let (weights, lse) = softmax(scores.reshape([dims.iter().product::<usize>() / width.max(1), width]), values.dtype());
    let mut lse_dims = dims;
    lse_dims[D - 1] = 1;
    (B::matmul(weights.reshape(dims), values), lse.reshape(lse_dims))
}

/// `(exp(scores − lse), lse)` over the last dimension of `scores: [rows, width]`, `lse = log Σ
/// exp(scores)` `[rows, 1]`: the softmax in Burn's ops (the reference for backends' kernels),
/// in float32, the weights then cast to `weights_dtype`.
///
/// The weights are normalised before the matmul that follows, as `exp(scores − lse)`. Dividing
/// that matmul's output by the row sums instead, with those sums also feeding the log-sum-exp,
/// is computed wrong by burn-fusion 0.21 (wgpu; off by O(1), see `benches/gpu/NOTES.md`).
pub fn softmax_lse<B: Backend>(scores: Tensor<B, 2>, weights_dtype: DType) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let scores = cast(scores, DType::F32);
    let max = scores.clone().max_dim(1);
    let lse = max.clone() + (scores.clone() - max).exp().sum_dim(1).log();
    (cast((scores - lse.clone()).exp(), weights_dtype), lse)
}

/// `tensor` in `dtype`, untouched where it is already.
fn cast<B: Backend, const D: usize>(tensor: Tensor<B, D>, dtype: DType) -> Tensor<B, D> {
    if tensor.dtype() == dtype {
        tensor
    } else {
        tensor.cast(dtype)
    }
}

/// `[L·group, L]` additive mask: row `r` (position `r / group`) sees keys `0..=r / group`.
fn causal_bias<B: Backend>(len: usize, group: usize, device: &B::Device) -> Tensor<B, 2> {
    let bias: Vec<f32> = (0..len * group)
        .flat_map(|row| (0..len).map(move |key| if key <= row / group { 0.0 } else { f32::NEG_INFINITY }))
        .collect();
    Tensor::from_data(TensorData::new(bias, [len * group, len]), device)
}
