//! Backend selection: the backends compiled in (cargo features `ndarray`, `wgpu`, `cuda`) and
//! a generic dispatch into code written once over `burn::tensor::backend::Backend`.

use anyhow::Result;
use clap::ValueEnum;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// CPU through burn-ndarray.
    Cpu,
    /// Vulkan / Metal / DX12 through wgpu.
    Wgpu,
    /// NVIDIA GPUs through CUDA.
    Cuda,
}

impl Default for BackendKind {
    /// The CPU when it is compiled in (it always works), else the first GPU backend built.
    fn default() -> Self {
        if cfg!(feature = "ndarray") {
            BackendKind::Cpu
        } else if cfg!(feature = "cuda") {
            BackendKind::Cuda
        } else {
            BackendKind::Wgpu
        }
    }
}

/// Code generic over the backend, run with the backend the user picked.
pub trait WithBackend {
    type Output;
    fn run<B: burn::tensor::backend::Backend>(self, device: B::Device) -> Result<Self::Output>;
}

pub fn dispatch<T: WithBackend>(kind: BackendKind, job: T) -> Result<T::Output> {
    match kind {
        #[cfg(feature = "ndarray")]
        BackendKind::Cpu => job.run::<burn::backend::NdArray<f32>>(Default::default()),
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu => job.run::<burn::backend::Wgpu>(Default::default()),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => {
            ensure_cuda_driver()?;
            job.run::<burn::backend::Cuda>(Default::default())
        }
        #[allow(unreachable_patterns)]
        other => anyhow::bail!(
            "this tally was built without the {other:?} backend; rebuild with `--features {}`",
            match other {
                BackendKind::Cpu => "ndarray",
                BackendKind::Wgpu => "wgpu",
                BackendKind::Cuda => "cuda",
            }
        ),
    }
}

/// cudarc panics at the first operation when the driver library is missing; check up front.
#[cfg(feature = "cuda")]
fn ensure_cuda_driver() -> Result<()> {
    // SAFETY: loading the system CUDA driver runs only its initialisers, as cudarc itself would.
    let found = ["libcuda.so.1", "libcuda.so", "nvcuda.dll"].iter().any(|name| unsafe { libloading::Library::new(name) }.is_ok());
    anyhow::ensure!(found, "no CUDA driver (libcuda) on this machine: use --backend cpu or --backend wgpu");
    Ok(())
}
