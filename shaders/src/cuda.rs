//! What generic CubeCL code needs to know of CUDA (feature `cublas`): whether a runtime is
//! CUDA, its tensors typed as CUDA's, the device's free memory, CUDA's profiler switch for
//! `ncu` (cudarc, CubeCL's own CUDA binding), how NVRTC treats denormals, and CUDA's backend
//! without Burn's fusion layer.

use std::any::{Any, TypeId};

use burn_cubecl::cubecl::cuda::{CudaDevice, CudaRuntime};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime};
use cudarc::driver::{result as driver, sys as driver_sys, CudaContext, DriverError};

/// CUDA without Burn's fusion layer (`burn::backend::Cuda` is `Fusion` of this): Burn's ops go
/// to CubeCL one at a time, and tally's kernels and cuBLASLt take their inputs as they are. On
/// the fusion layer each of those first waits for fusion's thread to resolve every input, ~28
/// round trips a layer, and every op is queued there and searched for fusions: one warm S1
/// request on the offline CUDA runtime (flash attention, tally's elementwise kernels) takes
/// 3–8 ms of host time unfused against 20–50 ms fused, for the same launches within two
/// (`tests/cuda_launches.rs`). Where the layers' elementwise steps are Burn's ops, fusion is
/// what merges them (1,742 launches a request unfused against 1,010).
pub type Unfused<F> = CubeBackend<CudaRuntime, F, i32, u8>;

pub fn is_cuda<R: CubeRuntime>() -> bool {
    TypeId::of::<R>() == TypeId::of::<CudaRuntime>()
}

/// The same tensor, typed as the runtime it is (`None` if `R` is not CUDA).
pub fn as_cuda<R: CubeRuntime>(tensor: CubeTensor<R>) -> Option<CubeTensor<CudaRuntime>> {
    downcast(tensor)
}

/// The inverse of [`as_cuda`].
pub fn from_cuda<R: CubeRuntime>(tensor: CubeTensor<CudaRuntime>) -> Option<CubeTensor<R>> {
    downcast(tensor)
}

fn downcast<From: Any, To: Any>(value: From) -> Option<To> {
    (Box::new(value) as Box<dyn Any>).downcast::<To>().ok().map(|boxed| *boxed)
}

/// Bytes free on `device` now, if it is a CUDA device the driver answers for.
pub fn free_memory<R: CubeRuntime>(device: &R::Device) -> Option<u64> {
    let index = as_cuda_device(device)?.index;
    // Binds the device's primary context (the one CubeCL uses) to this thread.
    let _context = CudaContext::new(index).ok()?;
    driver::mem_get_info().ok().map(|(free, _total)| free as u64)
}

/// `device` as a CUDA device, if it is one (a backend's device type, known only generically).
pub fn as_cuda_device(device: &dyn Any) -> Option<&CudaDevice> {
    device.downcast_ref()
}

/// Compiles CubeCL's CUDA kernels with single-precision denormals flushed to zero (NVRTC
/// `--ftz=true`, what FlashAttention builds with): each exponential of the attention kernels'
/// softmax is one `ex2.approx.ftz` where it carried a three-instruction denormal fix-up (sm_90a,
/// a full key step of the flash kernel: 628 → 525 instructions a warp with cp.async). A weight
/// under 2⁻¹²⁶ becomes 0, which no score can tell. Takes effect for devices first used after
/// the call, whose PTX is cached apart (patched `vendor/cubecl-cuda`).
pub fn set_flush_denormals(flush: bool) {
    burn_cubecl::cubecl::cuda::set_flush_denormals(flush);
}

/// Starts (`true`) or stops CUDA's profiler on `device`'s context: `ncu --profile-from-start off`
/// then profiles only the kernels launched in between.
pub fn set_profiling(device: &CudaDevice, active: bool) -> Result<(), DriverError> {
    // Binds the device's primary context (the one CubeCL launches on) to this thread.
    let _context = CudaContext::new(device.index)?;
    // SAFETY: no arguments; it acts on the context just made current.
    unsafe { if active { driver_sys::cuProfilerStart() } else { driver_sys::cuProfilerStop() } }.result()
}
