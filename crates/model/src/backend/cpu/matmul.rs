//! `x · w[rows]ᵀ` with `w` in its file's blocks, on the host: the rows are cut into panels, and
//! each core takes whole panels — dequantises one into a buffer of its own (small enough to stay
//! in its L2 cache), transposes it, and multiplies it at once, single-threaded, into its
//! columns of the output.
//!
//! Why not one threaded matmul per panel (what ran before): the panel was dequantised by one
//! thread pool (rayon) and multiplied by another (matrixmultiply's), so the two pools' threads
//! took turns on the same cores and every panel was written to memory in full before being read
//! back; one pool, one pass per panel measured 1.3× the throughput on the model's shapes
//! (2-core Zen 5). The multiply is the `gemm` crate's (AVX-512 where the CPU has it, AVX2+FMA
//! otherwise, chosen at run time), which matrixmultiply's AVX2 kernel trails on such CPUs.

use std::ops::Range;

use rayon::prelude::*;

use super::SharedOutput;
use crate::blocks::BlockMatrix;

/// Bytes of float32 a core dequantises at a time: about half of a core's L2 on current x86.
const PANEL_BYTES: usize = 512 << 10;

/// Rows of a panel of `rows` rows `cols` wide, so that panels are about [`PANEL_BYTES`] (at
/// least 32 rows, so the multiply is worth packing `x` for) and come in a multiple of `threads`.
pub fn panel_rows(rows: usize, cols: usize, threads: usize) -> usize {
    let target = (PANEL_BYTES / (4 * cols)).clamp(32, 256);
    let panels = rows.div_ceil(target).next_multiple_of(threads.max(1));
    rows.div_ceil(panels).max(1)
}

/// `x · w[rows]ᵀ`, row-major: `x` is `[m, w.cols()]`, the result `[m, rows.len()]`; panels of
/// `panel` rows of `w`, each dequantised and multiplied by one core.
pub fn matmul_transposed(x: &[f32], m: usize, w: &BlockMatrix, rows: Range<usize>, panel: usize) -> Vec<f32> {
    let k = w.cols();
    let n = rows.len();
    assert_eq!(x.len(), m * k, "x is [m, w.cols()]");
    let mut out = vec![0f32; m * n];
    let out_columns = SharedOutput(out.as_mut_ptr());
    let panels: Vec<Range<usize>> = BlockMatrix::panels(rows.clone(), panel).collect();
    panels.into_par_iter().for_each_init(
        || (vec![0f32; panel * k], vec![0f32; panel * k]),
        |(rows_buffer, columns_buffer), panel_rows| {
            let panel_len = panel_rows.len();
            let row_values = &mut rows_buffer[..panel_len * k];
            for (row, values) in panel_rows.clone().zip(row_values.chunks_exact_mut(k)) {
                w.dequantize_row(row, values);
            }
            // The panel transposed, `[k, panel_len]`: gemm multiplies the panel as the left
            // operand of `outᵀ = panel · xᵀ` and packs it for each slice of `x`'s rows unless
            // its columns are contiguous — packing row-major rows there is a scalar transpose
            // each time (a fifth of a Qwen3-0.6B score); transposing once here is one.
            let panel_t = &mut columns_buffer[..panel_len * k];
            transpose(row_values, panel_len, k, panel_t);
            let first_column = panel_rows.start - rows.start;
            // SAFETY: `out` is `[m, n]` row-major and outlives the loop; this panel writes only
            // columns `first_column..first_column + panel_len` of it, which no other panel
            // touches (the panels partition `rows`). `x` is `[m, k]` row-major; `panel_t` is
            // `[k, panel_len]` row-major. `read_dst = false`: the output is overwritten.
            unsafe {
                gemm::gemm(
                    m,
                    panel_len,
                    k,
                    out_columns.at(first_column),
                    1,
                    n as isize,
                    false,
                    x.as_ptr(),
                    1,
                    k as isize,
                    panel_t.as_ptr(),
                    1,
                    panel_len as isize,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                )
            }
        },
    );
    out
}

/// `to[c][r] = from[r][c]` for `from: [rows, cols]`, a strip of columns at a time (so the rows
/// being read stay in L1 while their columns are written).
fn transpose(from: &[f32], rows: usize, cols: usize, to: &mut [f32]) {
    const STRIP: usize = 64;
    for strip in (0..cols).step_by(STRIP) {
        for r in 0..rows {
            let row = &from[r * cols..(r + 1) * cols];
            for c in strip..cols.min(strip + STRIP) {
                to[c * rows + r] = row[c];
            }
        }
    }
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
    fn panels_fit_a_cache_and_split_evenly_between_threads() {
        assert_eq!(panel_rows(576, 576, 2), 144, "227 rows fit; 4 panels for 2 threads");
        assert_eq!(panel_rows(6144, 1024, 2), 128, "128 rows of 1,024 are 512 KiB");
        assert_eq!(panel_rows(1024, 12_288, 2), 32, "never fewer than 32 rows");
        assert_eq!(panel_rows(5, 576, 2), 3, "a small matrix still splits between the threads");
        assert_eq!(panel_rows(1, 576, 4), 1);
        for (rows, cols, threads) in [(576, 576, 2), (1000, 1536, 3), (151_936, 1024, 2), (7, 64, 16)] {
            let panel = panel_rows(rows, cols, threads);
            assert!(panel * 4 * cols <= PANEL_BYTES.max(32 * 4 * cols), "{rows}x{cols}: {panel} rows");
            assert!(panel * rows.div_ceil(panel) >= rows);
        }
    }
}
