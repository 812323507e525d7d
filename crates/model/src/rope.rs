//! Rotary position embedding in transformers' rotate-half layout, for arbitrary per-token
//! positions (items restart after the query), with any scaling folded into the frequencies.

use burn::tensor::{backend::Backend, Int, Tensor, TensorData};

/// `cos`/`sin` tables, `[tokens, 1, head_dim]`, broadcast over heads.
pub(crate) struct Rope<B: Backend> {
    cos: Tensor<B, 3>,
    sin: Tensor<B, 3>,
}

impl<B: Backend> Rope<B> {
    /// `inverse_frequencies`: `head_dim / 2` angular frequencies (see
    /// [`RopeConfig::inverse_frequencies`](crate::config::RopeConfig::inverse_frequencies)).
    pub(crate) fn new(positions: &[usize], inverse_frequencies: &[f64], device: &B::Device) -> Self {
        let head_dim = 2 * inverse_frequencies.len();
        // Positions repeat across items (query_len + k): compute each distinct one once.
        let mut distinct = positions.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        let (mut cos_rows, mut sin_rows) = (Vec::new(), Vec::new());
        for &position in &distinct {
            // Angles in f64: at positions in the thousands, f32 angles lose the low frequencies' digits.
            let angles: Vec<f64> = inverse_frequencies.iter().map(|f| position as f64 * f).collect();
            cos_rows.extend(angles.iter().chain(&angles).map(|a| a.cos() as f32));
            sin_rows.extend(angles.iter().chain(&angles).map(|a| a.sin() as f32));
        }
        // Each token's row of the distinct positions' tables, gathered on the device: a pass's
        // tables are `tokens × head_dim` (S1: 10,020 × 128 each), its distinct positions few
        // (S1: 40), so the host builds and uploads only those.
        let rows: Vec<i64> = positions.iter().map(|p| distinct.binary_search(p).expect("every position is in the table") as i64).collect();
        let rows = Tensor::<B, 1, Int>::from_data(TensorData::new(rows, [positions.len()]), device);
        let table = |values: Vec<f32>| Tensor::<B, 3>::from_data(TensorData::new(values, [distinct.len(), 1, head_dim]), device).select(0, rows.clone());
        Rope { cos: table(cos_rows), sin: table(sin_rows) }
    }

    /// The `cos` and `sin` tables: `x·cos + rotate_half(x)·sin` is the rotation (see
    /// [`crate::elementwise::norm_rope`]).
    pub(crate) fn tables(&self) -> (&Tensor<B, 3>, &Tensor<B, 3>) {
        (&self.cos, &self.sin)
    }
}
