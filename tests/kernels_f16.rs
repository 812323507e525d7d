//! The attention kernel with f16 inputs and output (f32 inside), in a process of its own: see
//! `kernels.rs`.

#[path = "common/gpu.rs"]
mod gpu;
mod kernel_cases;

use burn::tensor::DType;
use kernel_cases::{assert_close, tensor, Case, Gpu};
use tally_shaders::{tensor_core_tiles, AttentionKernel};

#[test]
fn attention_in_f16_accumulates_in_f32() {
    if !gpu::gpu_or_skip("attention_in_f16_accumulates_in_f32") {
        return;
    }
    // f16 inputs and output, f32 inside: only the roundings of f16 remain.
    assert_eq!(tensor::<Gpu<half::f16>, 1>(&[1.0], [1]).dtype(), DType::F16, "the kernel must see f16 tensors");
    let case = Case { groups: vec![(700, vec![20, 65, 1]), (3, vec![17])], q_heads: 8, kv_heads: 4, head_dim: 64 };
    let expected = case.expected(9);
    let device = Default::default();
    let tensor_cores = tensor_core_tiles(&<kernel_cases::GpuRuntime as burn_cubecl::cubecl::Runtime>::client(&device), DType::F16);
    // On CUDA the tiled kernel multiplies f16 tiles on tensor cores; elsewhere in registers.
    println!("tiled kernel in f16 on tensor cores: {tensor_cores}");
    for kernel in [AttentionKernel::Rows, AttentionKernel::Tiled] {
        assert_close(&case.kernel::<half::f16>(9, kernel), &expected, 1e-2, &format!("f16, {kernel:?}"));
    }
}
