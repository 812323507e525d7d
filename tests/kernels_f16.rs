//! The attention kernel with f16 inputs and output (f32 inside), in a process of its own: see
//! `kernels.rs`.

#[path = "common/gpu.rs"]
mod gpu;
mod kernel_cases;

use burn::tensor::DType;
use kernel_cases::{assert_close, tensor, Case, Gpu};

#[test]
fn attention_in_f16_accumulates_in_f32() {
    if !gpu::gpu_or_skip("attention_in_f16_accumulates_in_f32") {
        return;
    }
    // f16 inputs and output, f32 inside: only the roundings of f16 remain.
    assert_eq!(tensor::<Gpu<half::f16>, 1>(&[1.0], [1]).dtype(), DType::F16, "the kernel must see f16 tensors");
    let case = Case { groups: vec![(700, vec![20, 65, 1]), (3, vec![17])], q_heads: 8, kv_heads: 4, head_dim: 64 };
    assert_close(&case.kernel::<half::f16>(9), &case.expected(9), 1e-2, "f16");
}
