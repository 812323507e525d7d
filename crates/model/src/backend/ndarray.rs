//! [`ScoringBackend`] on the CPU (burn-ndarray): no kernels of its own, so every hot path is
//! the trait's plain-Burn default and every route asked for runs as [`Routes::PLAIN`](crate::Routes::PLAIN).

use burn::backend::NdArray;

use super::ScoringBackend;
use crate::matmul::Matmul;

impl Matmul for NdArray<f32> {}

impl ScoringBackend for NdArray<f32> {}
