//! The layers' elementwise steps in plain Burn ops: RMSNorm with the residual add before it,
//! the q/k norm with RoPE after it, and SwiGLU's `silu(gate) · up`. The reference for tally-shaders' fused kernels, and what
//! every backend runs unless `--elementwise kernels` routes them to those.

use burn::tensor::{activation::silu, backend::Backend, Tensor};

/// RMSNorm over the last dimension with a learned gain.
pub fn rms_norm<B: Backend, const D: usize>(x: Tensor<B, D>, gain: &Tensor<B, 1>, eps: f64) -> Tensor<B, D> {
    let rms = (x.clone().powi_scalar(2).mean_dim(D - 1) + eps).sqrt();
    x / rms * gain.clone().unsqueeze::<D>()
}

/// `(x + delta, rms_norm(x + delta) · gain)`; `(x, rms_norm(x) · gain)` without `delta`.
pub fn add_rms_norm<B: Backend, const D: usize>(x: Tensor<B, D>, delta: Option<Tensor<B, D>>, gain: &Tensor<B, 1>, eps: f64) -> (Tensor<B, D>, Tensor<B, D>) {
    let x = match delta {
        Some(delta) => x + delta,
        None => x,
    };
    (x.clone(), rms_norm(x, gain, eps))
}

/// `silu(gate) · up` of the fused gate/up projection `[rows, 2 · intermediate]`, gate first.
pub fn silu_mul<B: Backend>(gate_up: Tensor<B, 2>) -> Tensor<B, 2> {
    let intermediate = gate_up.dims()[1] / 2;
    let gate = gate_up.clone().narrow(1, 0, intermediate);
    let up = gate_up.narrow(1, intermediate, intermediate);
    silu(gate) * up
}

/// `rope(rms_norm(x) · gain)` for `x: [tokens, heads, head_dim]`, or `rope(x)` without `gain`;
/// `cos`, `sin`: `[tokens, 1, head_dim]`, transformers' rotate-half layout.
pub fn norm_rope<B: Backend>(x: Tensor<B, 3>, gain: Option<&Tensor<B, 1>>, cos: &Tensor<B, 3>, sin: &Tensor<B, 3>, eps: f64) -> Tensor<B, 3> {
    let x = match gain {
        Some(gain) => rms_norm(x, gain, eps),
        None => x,
    };
    let half = x.dims()[2] / 2;
    let rotated = Tensor::cat(vec![x.clone().narrow(2, half, half).neg(), x.clone().narrow(2, 0, half)], 2);
    x * cos.clone() + rotated * sin.clone()
}
