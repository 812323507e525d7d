//! [`ScoringBackend`] on the CPU (burn-ndarray): no kernels of its own, so every hot path but one
//! is the trait's plain-Burn default and every route asked for runs as
//! [`Routes::PLAIN`](crate::Routes::PLAIN). The one: weight matrices stay in their file's
//! format ([`BlockMatrix`]: quantised blocks, 16-bit floats) and are multiplied a panel of rows
//! at a time — the panel dequantised to float32 (in parallel), then one float matmul
//! (matrixmultiply, the same routine burn-ndarray calls) — so a model needs its file's size in
//! memory, not four to eight times it, for the cost of dequantising each weight once a pass.

use std::ops::Range;

use burn::backend::NdArray;
use burn::tensor::{Tensor, TensorData};
use ndarray::{s, Array2, ArrayView2};
use rayon::prelude::*;

use super::{BlockWeight, ScoringBackend};
use crate::blocks::BlockMatrix;
use crate::matmul::Matmul;

/// Float32 bytes of a dequantised panel: large panels mean fewer matmul calls, each of which
/// packs the activations again (1,024 rows of SmolLM2's 576-wide matrices: 5% faster than 256).
const PANEL_BYTES: usize = 8 << 20;

/// Weight rows dequantised at a time for rows `cols` wide.
fn panel_rows(cols: usize) -> usize {
    (PANEL_BYTES / (4 * cols)).clamp(64, 1024)
}

impl Matmul for NdArray<f32> {}

impl BlockWeight for BlockMatrix {
    fn rows(&self) -> usize {
        BlockMatrix::rows(self)
    }

    fn stored_bytes(&self) -> usize {
        BlockMatrix::stored_bytes(self)
    }
}

impl ScoringBackend for NdArray<f32> {
    type BlockWeight = BlockMatrix;

    fn block_weight(matrix: BlockMatrix, _device: &Self::Device) -> Option<BlockMatrix> {
        Some(matrix)
    }

    fn block_matmul(x: Tensor<Self, 2>, w: &BlockMatrix, rows: Range<usize>) -> Tensor<Self, 2> {
        let device = x.device();
        let [m, k] = x.dims();
        assert_eq!(k, w.cols(), "x · wᵀ needs x's width to be w's");
        let x = x.into_data().into_vec::<f32>().expect("float32 activations");
        let out = matmul_transposed(&x, m, w, rows.clone(), panel_rows(k));
        Tensor::from_data(TensorData::new(out, [m, rows.len()]), &device)
    }

    fn block_rows(w: &BlockMatrix, ids: &[u32], device: &Self::Device) -> Tensor<Self, 2> {
        let values = w.dequantize_rows(ids.iter().map(|&id| id as usize));
        Tensor::from_data(TensorData::new(values, [ids.len(), w.cols()]), device)
    }
}

/// `x · w[rows]ᵀ`, row-major: `x` is `[m, w.cols()]`, the result `[m, rows.len()]`; `panel`
/// rows of `w` dequantised at a time.
fn matmul_transposed(x: &[f32], m: usize, w: &BlockMatrix, rows: Range<usize>, panel: usize) -> Vec<f32> {
    let k = w.cols();
    let x = ArrayView2::from_shape((m, k), x).expect("x is [m, k]");
    let mut out = Array2::<f32>::zeros((m, rows.len()));
    let (panel_size, mut panel) = (panel, vec![0f32; panel.min(rows.len()) * k]);
    for panel_rows in BlockMatrix::panels(rows.clone(), panel_size) {
        let panel = &mut panel[..panel_rows.len() * k];
        panel.par_chunks_mut(k).zip(panel_rows.clone()).for_each(|(values, row)| w.dequantize_row(row, values));
        // The panel is `[rows, k]`; its transpose `[k, rows]` is a strided view, no copy.
        let panel_t = ArrayView2::from_shape((panel_rows.len(), k), &*panel).expect("the panel is [rows, k]").reversed_axes();
        let columns = panel_rows.start - rows.start..panel_rows.end - rows.start;
        ndarray::linalg::general_mat_mul(1.0, &x, &panel_t, 0.0, &mut out.slice_mut(s![.., columns]));
    }
    out.into_raw_vec_and_offset().0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocks::{BlockBytes, BlockRows};
    use crate::gguf::TensorType;

    /// Seeded Q8_0 and Q4_1 rows (random scales, mins and quants) and their float64 values.
    fn random_rows(kind: TensorType, rows: usize, cols: usize, seed: u64) -> (BlockRows, Vec<f64>) {
        let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let mut next = move || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 33) as u32
        };
        let mut bytes = Vec::new();
        let mut values = Vec::new();
        for _ in 0..rows * cols / 32 {
            let d = half::f16::from_f32((next() % 1000) as f32 / 20_000.0 + 0.001);
            bytes.extend(d.to_le_bytes());
            match kind {
                TensorType::Q8_0 => {
                    let q: Vec<i8> = (0..32).map(|_| (next() % 255) as i16 as i8).collect();
                    bytes.extend(q.iter().map(|&q| q as u8));
                    values.extend(q.iter().map(|&q| f64::from(q) * f64::from(d.to_f32())));
                }
                TensorType::Q4_1 => {
                    let m = half::f16::from_f32(-((next() % 100) as f32) / 1000.0);
                    bytes.extend(m.to_le_bytes());
                    let q: Vec<u8> = (0..32).map(|_| (next() % 16) as u8).collect();
                    bytes.extend((0..16).map(|j| q[j] | (q[j + 16] << 4)));
                    values.extend(q.iter().map(|&q| f64::from(q) * f64::from(d.to_f32()) + f64::from(m.to_f32())));
                }
                _ => unreachable!("the formats this test writes"),
            }
        }
        (BlockRows::new(kind, BlockBytes::Owned(bytes.into()), rows).unwrap(), values)
    }

    /// Across panel edges (panels of 128 rows: just under, at and past one, and several), one row
    /// of activations and many, a fused matrix of two formats, a row range inside it: each
    /// product within float32 rounding of the float64 product of the dequantised values.
    #[test]
    fn block_matmul_matches_float64_across_panel_edges() {
        let k = 96;
        let panel = 128;
        for (q8_rows, q41_rows) in [(100, 27), (64, 64), (100, 29), (200, 57), (300, 213)] {
            let (q8, mut reference) = random_rows(TensorType::Q8_0, q8_rows, k, 1);
            let (q41, more) = random_rows(TensorType::Q4_1, q41_rows, k, 2);
            reference.extend(more);
            let w = BlockMatrix::new(k, vec![q8, q41]).unwrap();
            for m in [1, 7, 33] {
                let x: Vec<f32> = (0..m * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0).collect();
                for rows in [0..w.rows(), 3..w.rows() - 2] {
                    let got = matmul_transposed(&x, m, &w, rows.clone(), panel);
                    for i in 0..m {
                        for (j, row) in rows.clone().enumerate() {
                            let terms = (0..k).map(|c| f64::from(x[i * k + c]) * reference[row * k + c]);
                            let (exact, magnitude) = terms.fold((0.0, 0.0), |(sum, size), t| (sum + t, size + t.abs()));
                            let error = (f64::from(got[i * rows.len() + j]) - exact).abs();
                            assert!(error <= 1e-5 * magnitude.max(1e-3), "{q8_rows}+{q41_rows} rows, m {m}, rows {rows:?}: ({i}, {row}) {} vs {exact}", got[i * rows.len() + j]);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn panels_hold_a_bounded_number_of_bytes() {
        assert_eq!(panel_rows(576), 1024, "small models: the most rows");
        assert_eq!(panel_rows(12_288), 170, "8 MiB of 12,288-wide rows");
        assert_eq!(panel_rows(1 << 20), 64, "never fewer than 64 rows");
    }
}
