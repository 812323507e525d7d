//! tally-bench: tally's benchmarks, behind `tally bench`. Each reports JSON (and a table) with
//! the machine it ran on; speed goals live here, not in timed tests.
//!
//! - [`load`]: Poisson arrivals against a running server's `/v1/score`: latency percentiles, items/s.
//! - [`soak`]: a server under mixed valid and invalid load past its capacity, for minutes.
//! - [`scenario`]: the seed scenarios (S1, S2) through the engine, on any backend.
//! - [`attention`]: one layer's multi-item attention per route against dense-masked attention.
//! - [`child_server`]: `tally serve` as a child process (soak and the end-to-end tests use it).
//! - [`results`]: a results folder read; [`chart`] draws it as a PNG (scenarios beside the
//!   PyTorch peers, attention per route, load's P99), [`summary`] prints it as one table,
//!   [`goals`] first: the issues' goals it has a number for, met or how far off.
//! - [`request_shape`]: the requests `load` and `soak` send; [`rng`], [`report`], [`timing`]:
//!   what the benchmarks share.

pub mod attention;
pub mod chart;
pub mod child_server;
pub mod goals;
pub mod load;
pub mod report;
pub mod request_shape;
pub mod results;
pub mod rng;
pub mod scenario;
pub mod soak;
pub mod summary;
pub mod timing;

/// What a run computed on, as its result records it.
#[derive(Clone, Debug)]
pub struct RunsOn {
    /// `cpu`, `wgpu` or `cuda`.
    pub backend: String,
    /// `float32` or `bfloat16`.
    pub dtype: String,
    /// The attention route: `kernel`, `tiled`, `flash` or `cascade`.
    pub attention: String,
    /// The elementwise route: `burn` or `kernels`.
    pub elementwise: String,
    /// The tile attention kernels' tile, `ROWSxKEYS`.
    pub tile: String,
    /// Which library multiplies: `cubecl` or `cublas` (`cublas-sync`: host-synced; `cublas-algosN`:
    /// the fastest of the heuristic's first N algorithms).
    pub matmul: String,
    /// CUDA kernels compiled with denormals flushed to zero (`--flush-denormals`).
    pub flush_denormals: bool,
    /// Through Burn's fusion layer (`--fusion`; never on the CPU).
    pub fused: bool,
    /// The GPU's name, or the CPU's with its thread count.
    pub device: String,
}
