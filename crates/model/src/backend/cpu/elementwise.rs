//! The layers' elementwise steps on the host (`--elementwise kernels` on the CPU): residual add +
//! RMSNorm, the q/k norm with RoPE, and `silu(gate) · up`, each one pass over its rows spread
//! over the cores, where Burn's ops take four to eight passes on one core, each allocating its
//! result. Same formulas as [`crate::elementwise`], the reference they are tested against.

use rayon::prelude::*;

/// Rows handed to a core at a time: enough work to be worth the hand-off.
const MIN_ROWS_PER_TASK: usize = 16;

/// `(x + delta, rms_norm(x + delta) · gain)` of rows `gain.len()` wide; `(x, rms_norm(x) ·
/// gain)` without `delta`. `x` becomes the sum; the normed rows are returned.
pub fn add_rms_norm(x: &mut [f32], delta: Option<&[f32]>, gain: &[f32], eps: f32) -> Vec<f32> {
    let width = gain.len();
    let mut normed = vec![0f32; x.len()];
    let rows = x.par_chunks_mut(width).zip(normed.par_chunks_mut(width)).enumerate().with_min_len(MIN_ROWS_PER_TASK);
    rows.for_each(|(row, (x, normed))| {
        if let Some(delta) = delta {
            x.iter_mut().zip(&delta[row * width..(row + 1) * width]).for_each(|(x, d)| *x += d);
        }
        rms_norm_into(x, gain, eps, normed);
    });
    normed
}

/// `out = x / rms(x) · gain`.
fn rms_norm_into(x: &[f32], gain: &[f32], eps: f32, out: &mut [f32]) {
    let mean_square = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inverse_rms = 1.0 / (mean_square + eps).sqrt();
    out.iter_mut().zip(x).zip(gain).for_each(|((out, x), gain)| *out = x * inverse_rms * gain);
}

/// `rope(rms_norm(x) · gain)` in place for `x: [tokens, heads, head_dim]` (`rope(x)` without
/// `gain`); `cos`, `sin`: `[tokens, head_dim]`, transformers' rotate-half layout.
pub fn norm_rope(x: &mut [f32], head_dim: usize, gain: Option<&[f32]>, cos: &[f32], sin: &[f32], eps: f32) {
    let tokens = cos.len() / head_dim;
    let token_width = x.len() / tokens;
    let half = head_dim / 2;
    let rows = x.par_chunks_mut(token_width).zip(cos.par_chunks(head_dim).zip(sin.par_chunks(head_dim))).with_min_len(MIN_ROWS_PER_TASK);
    rows.for_each_init(
        || vec![0f32; head_dim],
        |normed, (heads, (cos, sin))| {
            for head in heads.chunks_exact_mut(head_dim) {
                match gain {
                    Some(gain) => rms_norm_into(head, gain, eps, normed),
                    None => normed.copy_from_slice(head),
                }
                for i in 0..half {
                    let (low, high) = (normed[i], normed[i + half]);
                    head[i] = low * cos[i] - high * sin[i];
                    head[i + half] = high * cos[i + half] + low * sin[i + half];
                }
            }
        },
    );
}

/// `silu(gate) · up` of rows `[gate | up]`, `2 · intermediate` wide; returns `[rows, intermediate]`.
pub fn silu_mul(gate_up: &[f32], intermediate: usize) -> Vec<f32> {
    let mut out = vec![0f32; gate_up.len() / 2];
    let rows = out.par_chunks_mut(intermediate).zip(gate_up.par_chunks(2 * intermediate)).with_min_len(MIN_ROWS_PER_TASK);
    rows.for_each(|(out, gate_up)| {
        let (gate, up) = gate_up.split_at(intermediate);
        out.iter_mut().zip(gate).zip(up).for_each(|((out, &g), &u)| *out = g / (1.0 + (-g).exp()) * u);
    });
    out
}

#[cfg(test)]
mod tests {
    use burn::tensor::Tensor;

    use super::*;
    use crate::backend::cpu::test_support::{random, tensor, Cpu};
    use crate::elementwise as reference;


    fn values<const D: usize>(t: Tensor<Cpu, D>) -> Vec<f32> {
        t.into_data().into_vec::<f32>().unwrap()
    }

    fn assert_close(got: &[f32], expected: &[f32], what: &str) {
        assert_eq!(got.len(), expected.len(), "{what}");
        let scale = expected.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
        let error = got.iter().zip(expected).fold(0f32, |m, (g, e)| m.max((g - e).abs())) / scale;
        assert!(error <= 1e-5, "{what}: relative error {error:e}");
    }

    /// Row counts under, at and past a task's rows, widths of 1 to 4,097, with and without the add.
    #[test]
    fn add_rms_norm_matches_burns_ops() {
        let eps = 1e-6;
        for (seed, &(rows, width)) in [(1, 1), (3, 15), (MIN_ROWS_PER_TASK - 1, 64), (MIN_ROWS_PER_TASK, 64), (MIN_ROWS_PER_TASK + 1, 576), (2, 4097), (600, 64)].iter().enumerate() {
            let seed = 300 + seed as u64;
            let (x, delta, gain) = (random(seed, rows * width, 3.0), random(seed + 1, rows * width, 3.0), random(seed + 2, width, 1.5));
            for with_delta in [true, false] {
                let (sum, normed) = reference::add_rms_norm(tensor(&x, [rows, width]), with_delta.then(|| tensor(&delta, [rows, width])), &tensor(&gain, [width]), eps);
                let mut got_sum = x.clone();
                let got_normed = add_rms_norm(&mut got_sum, with_delta.then_some(&delta[..]), &gain, eps as f32);
                let what = format!("{rows} rows of {width}, add {with_delta}");
                assert_close(&got_sum, &values(sum), &what);
                assert_close(&got_normed, &values(normed), &what);
            }
        }
    }

    /// Head sizes 16 to 128, positions in the thousands, with and without the norm.
    #[test]
    fn norm_rope_matches_burns_ops() {
        let eps = 1e-6;
        for (seed, &(tokens, heads, head_dim)) in [(5, 2, 16), (37, 3, 24), (20, 4, 64), (9, 16, 128), (1, 1, 2)].iter().enumerate() {
            let seed = 500 + seed as u64;
            let x = random(seed, tokens * heads * head_dim, 2.0);
            let gain = random(seed + 1, head_dim, 1.5);
            let half = head_dim / 2;
            let (mut cos, mut sin) = (Vec::new(), Vec::new());
            for token in 0..tokens {
                let position = (token * 97 + 3) as f64;
                let angles: Vec<f64> = (0..half).map(|i| position * 10_000f64.powf(-(i as f64) / half as f64)).collect();
                cos.extend(angles.iter().chain(&angles).map(|a| a.cos() as f32));
                sin.extend(angles.iter().chain(&angles).map(|a| a.sin() as f32));
            }
            for norm in [true, false] {
                let gain_tensor = tensor(&gain, [head_dim]);
                let expected = reference::norm_rope(tensor(&x, [tokens, heads, head_dim]), norm.then_some(&gain_tensor), &tensor(&cos, [tokens, 1, head_dim]), &tensor(&sin, [tokens, 1, head_dim]), eps);
                let mut got = x.clone();
                norm_rope(&mut got, head_dim, norm.then_some(&gain[..]), &cos, &sin, eps as f32);
                assert_close(&got, &values(expected), &format!("{tokens} tokens × {heads} heads × {head_dim}, norm {norm}"));
            }
        }
    }

    #[test]
    fn silu_mul_matches_burns_ops() {
        for (seed, &(rows, intermediate)) in [(1, 1), (1, 257), (MIN_ROWS_PER_TASK + 1, 85), (7, 1536), (300, 17)].iter().enumerate() {
            let gate_up = random(400 + seed as u64, rows * 2 * intermediate, 6.0);
            let expected = reference::silu_mul(tensor(&gate_up, [rows, 2 * intermediate]));
            assert_close(&silu_mul(&gate_up, intermediate), &values(expected), &format!("{rows} rows of {intermediate}"));
        }
    }
}
