//! Matmuls that keep float32 at float32. cubek's tiled matmuls stage float32 operands as tf32
//! on tensor cores wherever the device has tf32 (CUDA, Ampere on): 10 mantissa bits, PyTorch's
//! `allow_tf32`, which puts scores 1e-3 – 4e-2 off on the sharp fixtures. On such devices
//! tally's float32 matmuls go through a unit (CUDA-core) tiled matmul instead, whose stages and
//! registers stay float32. Elsewhere (wgpu, WebGPU) the ordinary matmul is already float32.

use burn_backend::{calculate_matmul_output, DType, TensorMetadata};
use burn_cubecl::cubecl::{prelude::CubePrimitive, tf32};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems};
use cubek::matmul::launch::{launch_ref, Strategy};
use cubek::matmul::routines::{simple_unit::SimpleUnitSelectionArgs, BlueprintStrategy};
use cubek::std::InputBinding;

/// Whether the ordinary matmul of a `dtype` tensor on `client`'s device rounds its operands to
/// tf32: float32 on a device with tf32.
pub fn matmul_rounds_to_tf32<R: CubeRuntime>(client: &burn_cubecl::cubecl::client::ComputeClient<R>, dtype: DType) -> bool {
    dtype == DType::F32 && client.properties().supports_type(tf32::as_type_native_unchecked().storage_type())
}

/// `lhs · rhs` for float32 tensors of any rank (batch dimensions as in `Tensor::matmul`), every
/// product and sum in float32. The output is contiguous.
pub fn f32_matmul<R: CubeRuntime>(lhs: CubeTensor<R>, rhs: CubeTensor<R>) -> CubeTensor<R> {
    assert!(lhs.dtype == DType::F32 && rhs.dtype == DType::F32, "f32_matmul multiplies float32 tensors");
    let shape = calculate_matmul_output(&lhs.shape(), &rhs.shape()).expect("matmul operands of matching shapes");
    let out = empty_device_contiguous_dtype(lhs.client.clone(), lhs.device.clone(), shape, DType::F32);
    let client = out.client.clone();
    let launch = |strategy: &Strategy| {
        let mut dtypes = MatmulElems::from_globals(&MatmulGlobalElems { lhs: DType::F32.into(), rhs: DType::F32.into(), out: DType::F32.into() });
        launch_ref(
            strategy,
            &client,
            InputBinding::new(lhs.clone().binding(), DType::F32.into()),
            InputBinding::new(rhs.clone().binding(), DType::F32.into()),
            out.clone().binding(),
            &mut dtypes,
        )
    };
    // The unit matmul declines shapes it has no tiling for; the naive kernel takes any.
    let unit = Strategy::SimpleUnit(BlueprintStrategy::Inferred(SimpleUnitSelectionArgs::default()));
    if launch(&unit).is_err() {
        launch(&Strategy::Naive).expect("the naive matmul launches for any float32 shapes");
    }
    out
}
