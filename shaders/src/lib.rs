//! tally-shaders: the CubeCL kernels of tally's hot paths, for every CubeCL backend (CUDA, wgpu,
//! WebGPU).
//!
//! Planned here (issue "CubeCL kernels"): multi-item flash attention that never loads the tiles
//! of other items, and a fused label log-softmax that streams the vocabulary. Until they land,
//! `tally-model`'s plain Burn path (`attention.rs`) runs on every backend and is the reference
//! these kernels will be tested against.
