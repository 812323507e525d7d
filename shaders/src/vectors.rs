//! How many elements the elementwise kernels move a load: the widest vector the device reads in
//! one instruction (16 bytes on CUDA: 8 bf16 or 4 float32; 4 elements on wgpu) that divides every
//! run of elements the kernel reads as vectors and keeps every tensor's start aligned to it.
//! On the H200 the kernels read one 2-byte element a load: a warp instruction moved 64 bytes, and
//! their instructions, not the memory, set their time (3–9× over their bytes, 2026-11-27).

use burn_cubecl::cubecl::prelude::ComputeClient;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;

/// The widest vector (in elements of `element_bytes`) `client` reads in one load that divides
/// each of `runs` and to which every tensor of `tensors` starts aligned; 1 where none does.
pub(crate) fn vector_width<R: CubeRuntime>(client: &ComputeClient<R>, element_bytes: usize, runs: &[usize], tensors: &[&CubeTensor<R>]) -> usize {
    let aligned = |width: usize| tensors.iter().all(|tensor| tensor.handle.offset_start.unwrap_or(0).is_multiple_of((width * element_bytes) as u64));
    client.io_optimized_vector_sizes(element_bytes).find(|&width| runs.iter().all(|run| run.is_multiple_of(width)) && aligned(width)).unwrap_or(1)
}
