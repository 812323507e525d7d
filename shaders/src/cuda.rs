//! What generic CubeCL code needs to know of CUDA (feature `cublas`): whether a runtime is
//! CUDA, its tensors typed as CUDA's, and the device's free memory (cudarc, CubeCL's own CUDA
//! binding).

use std::any::{Any, TypeId};

use burn_cubecl::cubecl::cuda::{CudaDevice, CudaRuntime};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cudarc::driver::{result as driver, CudaContext};

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
    let index = (device as &dyn Any).downcast_ref::<CudaDevice>()?.index;
    // Binds the device's primary context (the one CubeCL uses) to this thread.
    let _context = CudaContext::new(index).ok()?;
    driver::mem_get_info().ok().map(|(free, _total)| free as u64)
}
