//! Multi-item attention in plain Burn ops: the reference path, and the CPU path.
//!
//! Items of one pass are padded to a common length `L` and laid out as `[N, L]`. An item row
//! attends to (a) every key of the shared prefix (the query) and (b) its own item's keys up to
//! itself. The two parts are computed separately and merged with a shared softmax maximum, so
//! no mask over prefix + all items is ever built: the only mask is the `L × L` causal one.
//! Padding rows produce garbage that nobody reads; padding keys sit after every real row, so
//! the causal mask already hides them.

use burn::tensor::{backend::Backend, Tensor, TensorData};

/// K/V of a shared prefix for one layer, `[kv_heads, prefix_len, head_dim]`, RoPE applied.
#[derive(Clone, Debug)]
pub struct PrefixKv<B: Backend> {
    pub keys: Tensor<B, 3>,
    pub values: Tensor<B, 3>,
}

/// `queries`: `[N, L, q_heads, head_dim]`; `keys`/`values`: `[N, L, kv_heads, head_dim]`.
/// Returns `[N, L, q_heads * head_dim]`.
pub fn multi_item_attention<B: Backend>(
    queries: Tensor<B, 4>,
    keys: Tensor<B, 4>,
    values: Tensor<B, 4>,
    prefix: &PrefixKv<B>,
) -> Tensor<B, 3> {
    let [items, len, q_heads, head_dim] = queries.dims();
    let kv_heads = keys.dims()[2];
    let group = q_heads / kv_heads;
    let rows = len * group;
    let scale = (head_dim as f64).powf(-0.5);
    let device = queries.device();

    // Query heads of one KV head are adjacent, so a [.., L, kv, group, d] view puts every row
    // that shares a KV head next to each other: GQA without repeating K/V.
    let queries = queries.mul_scalar(scale).reshape([items, len, kv_heads, group, head_dim]).swap_dims(1, 2); // [N, kv, L, g, d]
    let own_queries = queries.clone().reshape([items, kv_heads, rows, head_dim]);
    let own_keys = keys.swap_dims(1, 2); // [N, kv, L, d]
    let own_values = values.swap_dims(1, 2);

    let own_scores = own_queries.matmul(own_keys.swap_dims(2, 3)) + causal_bias::<B>(len, group, &device).unsqueeze::<4>();
    let own_max = own_scores.clone().max_dim(3); // [N, kv, rows, 1]

    if prefix.keys.dims()[1] == 0 {
        let weights = (own_scores - own_max).exp();
        let norm = weights.clone().sum_dim(3);
        return merge_heads(weights.matmul(own_values) / norm, items, len, q_heads * head_dim, group);
    }

    // Prefix part, laid out [kv, N·rows, P] so that one batched matmul per KV head covers all items.
    let prefix_queries = queries.swap_dims(0, 1).reshape([kv_heads, items * rows, head_dim]);
    let prefix_scores = prefix_queries.matmul(prefix.keys.clone().swap_dims(1, 2));
    let prefix_max = to_item_major(prefix_scores.clone().max_dim(2), items, rows);

    let max = own_max.max_pair(prefix_max);
    let own_weights = (own_scores - max.clone()).exp();
    let prefix_weights = (prefix_scores - to_head_major(max, items, rows)).exp();

    let norm = own_weights.clone().sum_dim(3) + to_item_major(prefix_weights.clone().sum_dim(2), items, rows);
    let mixed = own_weights.matmul(own_values) + to_item_major(prefix_weights.matmul(prefix.values.clone()), items, rows);
    merge_heads(mixed / norm, items, len, q_heads * head_dim, group)
}

/// `[L·group, L]` additive mask: row `r` (position `r / group`) sees keys `0..=r / group`.
fn causal_bias<B: Backend>(len: usize, group: usize, device: &B::Device) -> Tensor<B, 2> {
    let bias: Vec<f32> = (0..len * group)
        .flat_map(|row| (0..len).map(move |key| if key <= row / group { 0.0 } else { f32::NEG_INFINITY }))
        .collect();
    Tensor::from_data(TensorData::new(bias, [len * group, len]), device)
}

/// `[kv, N·rows, x]` → `[N, kv, rows, x]`.
fn to_item_major<B: Backend>(t: Tensor<B, 3>, items: usize, rows: usize) -> Tensor<B, 4> {
    let [kv_heads, _, width] = t.dims();
    t.reshape([kv_heads, items, rows, width]).swap_dims(0, 1)
}

/// `[N, kv, rows, x]` → `[kv, N·rows, x]`.
fn to_head_major<B: Backend>(t: Tensor<B, 4>, items: usize, rows: usize) -> Tensor<B, 3> {
    let [_, kv_heads, _, width] = t.dims();
    t.swap_dims(0, 1).reshape([kv_heads, items * rows, width])
}

/// `[N, kv, L·g, d]` → `[N, L, q_heads·d]`, heads in checkpoint order.
fn merge_heads<B: Backend>(t: Tensor<B, 4>, items: usize, len: usize, width: usize, group: usize) -> Tensor<B, 3> {
    let [_, kv_heads, _, head_dim] = t.dims();
    t.reshape([items, kv_heads, len, group, head_dim]).swap_dims(1, 2).reshape([items, len, width])
}
