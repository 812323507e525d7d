//! Matmuls that keep float32 at float32. cubek's tiled matmuls stage float32 operands as tf32
//! on tensor cores wherever the device has tf32 (CUDA, Ampere on): 10 mantissa bits, PyTorch's
//! `allow_tf32`, which puts scores 1e-3 – 4e-2 off on the sharp fixtures. On such devices
//! tally's float32 matmuls go through a unit (CUDA-core) tiled matmul instead, whose stages and
//! registers stay float32. Elsewhere (wgpu, WebGPU) the ordinary matmul is already float32.

use burn_backend::DType;
use burn_cubecl::cubecl::{prelude::CubePrimitive, tf32};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubek::matmul::launch::Strategy;
use cubek::matmul::routines::{simple_unit::SimpleUnitSelectionArgs, BlueprintStrategy};

use crate::matmul_choice::launch_cubek;

/// Whether the ordinary matmul of a `dtype` tensor on `client`'s device rounds its operands to
/// tf32: float32 on a device with tf32.
pub fn matmul_rounds_to_tf32<R: CubeRuntime>(client: &burn_cubecl::cubecl::client::ComputeClient<R>, dtype: DType) -> bool {
    dtype == DType::F32 && client.properties().supports_type(tf32::as_type_native_unchecked().storage_type())
}

/// `lhs · rhs` for float32 tensors of any rank (batch dimensions as in `Tensor::matmul`), every
/// product and sum in float32. The output is contiguous.
pub fn f32_matmul<R: CubeRuntime>(lhs: CubeTensor<R>, rhs: CubeTensor<R>) -> CubeTensor<R> {
    assert!(lhs.dtype == DType::F32 && rhs.dtype == DType::F32, "f32_matmul multiplies float32 tensors");
    // The unit matmul declines shapes it has no tiling for; the naive kernel takes any.
    let unit = Strategy::SimpleUnit(BlueprintStrategy::Inferred(SimpleUnitSelectionArgs::default()));
    launch_cubek(&unit, &lhs, &rhs).or_else(|| launch_cubek(&Strategy::Naive, &lhs, &rhs)).expect("the naive matmul launches for any float32 shapes")
}
