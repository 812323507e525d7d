//! Which kernel multiplies (`--matmul`): CubeCL's autotuned cubek kernels, tally's register-block
//! kernel ([`crate::block_matmul`], every CubeCL runtime, or per shape a checked choice), or cuBLASLt ([`crate::cublas`],
//! feature `cublas`, CUDA only). One process-wide choice, set once by the command line (or the
//! browser page) before the model runs.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use burn_backend::DType;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulRoute {
    /// Burn's autotuned matmul (cubek, `mma.sync` on tensor cores), or tally's float32 unit
    /// matmul where the tensor-core one would round to tf32.
    Cubecl,
    /// cuBLASLt on CUDA (wgmma on Hopper), float32 accumulation, float32 kept float32.
    Cublas,
    /// tally's register-block kernel for 2-D matmuls (the model's projections and LM head; other
    /// ranks stay on cubek): no shared memory or barriers, which is what software adapters
    /// (lavapipe, SwiftShader) are slow at. Per shape class, the kernel a checked timing chose
    /// instead, where one did ([`crate::matmul_choice`]: the browser page tunes them).
    Block,
}

static ROUTE: AtomicU8 = AtomicU8::new(MatmulRoute::Cubecl as u8);

/// Picks the route for every later matmul of the process. [`MatmulRoute::Cublas`] takes effect
/// in a build with feature `cublas`, on CUDA.
pub fn set_matmul_route(route: MatmulRoute) {
    ROUTE.store(route as u8, Ordering::Relaxed);
}

pub fn matmul_route() -> MatmulRoute {
    match ROUTE.load(Ordering::Relaxed) {
        route if route == MatmulRoute::Cublas as u8 => MatmulRoute::Cublas,
        route if route == MatmulRoute::Block as u8 => MatmulRoute::Block,
        _ => MatmulRoute::Cubecl,
    }
}

/// Whether matmuls of `dtype` go to tally's register-block kernel (2-D ones; the kernel
/// declines others).
pub fn routes_to_block(dtype: DType) -> bool {
    matmul_route() == MatmulRoute::Block && matches!(dtype, DType::F32 | DType::BF16 | DType::F16)
}

/// Whether `R`'s matmuls of `dtype` go to cuBLASLt: the route is picked, this is CUDA and a
/// float type cuBLASLt multiplies.
pub fn routes_to_cublas<R: CubeRuntime>(dtype: DType) -> bool {
    #[cfg(feature = "cublas")]
    let cuda = crate::cuda::is_cuda::<R>();
    #[cfg(not(feature = "cublas"))]
    let cuda = false;
    cuda && matmul_route() == MatmulRoute::Cublas && matches!(dtype, DType::F32 | DType::BF16 | DType::F16)
}

static WIDE_PRODUCTS_IN_MODEL_DTYPE: AtomicBool = AtomicBool::new(false);

/// Whether cuBLASLt writes the products read at float32 precision after them (the cascade's
/// scores, `Matmul::matmul_wide`) in float32, the process's default, or in their 16-bit
/// operands' dtype (`--cascade-scores model`: half the bytes written and read again, at bf16's
/// 2⁻⁹ relative rounding).
pub fn set_wide_products_in_float32(float32: bool) {
    WIDE_PRODUCTS_IN_MODEL_DTYPE.store(!float32, Ordering::Relaxed);
}

/// The dtype `R`'s wide products of `dtype` operands come in: float32 on the cuBLASLt route
/// (unless [`set_wide_products_in_float32`] said otherwise), which writes its float32
/// accumulators as they are; `dtype` elsewhere, where float32 would cost a pass of its own.
pub fn wide_product_dtype<R: CubeRuntime>(dtype: DType) -> DType {
    if dtype != DType::F32 && routes_to_cublas::<R>(dtype) && !WIDE_PRODUCTS_IN_MODEL_DTYPE.load(Ordering::Relaxed) {
        DType::F32
    } else {
        dtype
    }
}

/// `lhs · rhs` through cuBLASLt, as `out` (the operands' dtype or float32), or `None` where it
/// declines the shapes (broadcast batches, an empty dimension): the caller's own matmul runs
/// then. A library or driver failure panics with its message (a half-done GEMM leaves nothing
/// to fall back to).
pub fn cublas_matmul<R: CubeRuntime>(lhs: &CubeTensor<R>, rhs: &CubeTensor<R>, out: DType) -> Option<CubeTensor<R>> {
    #[cfg(feature = "cublas")]
    {
        let (lhs, rhs) = (crate::cuda::as_cuda(lhs.clone())?, crate::cuda::as_cuda(rhs.clone())?);
        match crate::cublas::matmul(lhs, rhs, out) {
            Ok(product) => crate::cuda::from_cuda(product),
            Err(crate::cublas::CublasError::Declined(_)) => None,
            Err(failure) => panic!("{failure}"),
        }
    }
    #[cfg(not(feature = "cublas"))]
    {
        let _ = (lhs, rhs, out);
        None
    }
}
