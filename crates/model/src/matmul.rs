//! Who multiplies: every matmul of the model (the linears, the LM head, the cascade's) goes
//! through [`Matmul`], so one place per backend picks the library.

use burn::tensor::{backend::Backend, DType, Tensor};

/// A backend's matmul, as tally calls it. Burn's own by default; CubeCL backends replace it
/// with cuBLASLt (`--matmul cublas`, CUDA) and where Burn's would round float32 to tf32.
pub trait Matmul: Backend {
    /// `lhs · rhs`, batched over leading dimensions.
    fn matmul<const D: usize>(lhs: Tensor<Self, D>, rhs: Tensor<Self, D>) -> Tensor<Self, D> {
        lhs.matmul(rhs)
    }

    /// `lhs · rhs` for a product read at float32 precision after it (the cascade's attention
    /// scores, which a softmax exponentiates): float32 where this backend's matmul writes its
    /// float32 accumulators as they are for 16-bit operands (cuBLASLt, unless
    /// `--cascade-scores model`), else as [`Self::matmul`] gives it — a cast after the fact
    /// would add a pass and no precision.
    fn matmul_wide<const D: usize>(lhs: Tensor<Self, D>, rhs: Tensor<Self, D>) -> Tensor<Self, D> {
        Self::matmul(lhs, rhs)
    }

    /// The dtype [`Self::matmul_wide`] writes for `dtype` operands.
    fn wide_dtype(dtype: DType) -> DType {
        dtype
    }

    /// Whether [`Self::matmul`] of `dtype` operands on `device` is another route than the
    /// backend's own matmul (which fusion could fuse into its neighbours).
    fn replaces_matmul(_dtype: DType, _device: &Self::Device) -> bool {
        false
    }
}
