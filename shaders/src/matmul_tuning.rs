//! Choosing a shape class's matmul kernel by timing every candidate, but trusting none unchecked:
//! each one's product on seeded operands of the class's shape is compared with a float64 product
//! on the host first, and only those within the dtype's tolerance are timed. A candidate that
//! declines, writes nothing or writes wrong is reported as such and never chosen — CubeCL's own
//! autotune on WebGPU kept matmuls that wrote nothing, because it times without looking.
//!
//! Asynchronous throughout (the browser cannot block on the GPU); natively a blocking executor
//! runs it. The page tunes the classes its scores meet ([`crate::matmul_choice`]) and keeps
//! the choices per adapter.

use burn_backend::ops::FloatTensorOps;
use burn_backend::{DType, TensorData};
use burn_cubecl::cubecl::client::ComputeClient;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime};
use web_time::Instant;

use crate::matmul_choice::{set_matmul_choice, MatmulKernel, MatmulShape};

/// Output columns compared with the float64 product (all rows of each), spread over the width
/// from the first to the last: enough to catch a kernel that skips or misplaces tiles, cheap on
/// the host for a 1024-row class.
const CHECKED_COLUMNS: usize = 48;

/// Timed products of a candidate that is not already far behind the fastest.
const TIMED_RUNS: usize = 3;

/// A candidate whose first timed product takes this many times the fastest so far's is not
/// timed again (slow candidates on a software adapter take seconds).
const FAR_BEHIND: f64 = 3.0;

/// Largest error allowed, relative to the sum of the products' magnitudes (`Σ|a·b|`) of each
/// output: float32 rounding leaves ~1e-7; half-precision outputs round at 4e-3 (bf16).
fn tolerance(dtype: DType) -> f64 {
    if dtype == DType::F32 {
        1e-4
    } else {
        1e-2
    }
}

/// What became of one candidate.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// It does not take these shapes or this device.
    Declined,
    /// Its product is off the float64 one by more than the dtype allows (or not finite).
    Wrong { max_error: f64 },
    /// Its product could not be read back.
    Failed(String),
    /// Right, taking `millis` per product: the fastest of its timed runs, or for a candidate
    /// far behind the fastest, the one run that showed it (its compilation included).
    Right { millis: f64, max_error: f64 },
}

/// One candidate's name and outcome.
#[derive(Clone, Debug)]
pub struct CandidateTrial {
    pub name: String,
    pub outcome: Outcome,
}

/// The outcome of tuning one class: every candidate's trial and the index of the chosen one
/// (the fastest right one; `None` if none was right).
#[derive(Clone, Debug)]
pub struct ShapeTrial {
    pub shape: MatmulShape,
    pub trials: Vec<CandidateTrial>,
    pub chosen: Option<usize>,
}

/// How a candidate multiplies (`None`: it declines).
pub type Multiply<'a, R> = &'a dyn Fn(&CubeTensor<R>, &CubeTensor<R>) -> Option<CubeTensor<R>>;

/// A candidate: its name and how it multiplies.
pub type Candidate<'a, R> = (String, Multiply<'a, R>);

/// Times and checks [`MatmulKernel::CANDIDATES`] on `shape` and uses the fastest right one for
/// the class from now on. With none right the class keeps the default kernel and the trial says
/// so: the caller should stop trusting the kernels on this adapter.
pub async fn tune_matmul<R: CubeRuntime>(device: &R::Device, shape: MatmulShape) -> ShapeTrial {
    let mut tuning = ClassTuning::new(shape);
    while tuning.try_next_kernel::<R>(device).await {}
    tuning.choose()
}

/// Every candidate on seeded operands of `shape`: checked against the float64 product, then
/// timed if right. Chooses nothing by itself ([`tune_matmul`] does).
pub async fn time_checked<R: CubeRuntime>(device: &R::Device, shape: MatmulShape, candidates: &[Candidate<'_, R>]) -> ShapeTrial {
    let mut tuning = ClassTuning::new(shape);
    for (name, multiply) in candidates {
        tuning.try_candidate(device, name, *multiply).await;
    }
    tuning.trial()
}

/// The tuning of one class, a candidate at a time: the browser page lets a score go between two
/// (a slow candidate on a software adapter takes seconds).
///
/// Each candidate gets operands of its own seed: a candidate that writes nothing then cannot
/// pass by handing back memory where an earlier candidate left the right product (the pool
/// reuses freed buffers), and a launch that fails to run (WebGPU reports it at the next sync) is
/// caught before its output is read.
pub struct ClassTuning {
    shape: MatmulShape,
    trials: Vec<CandidateTrial>,
    fastest: Option<(usize, f64)>,
}

impl ClassTuning {
    pub fn new(shape: MatmulShape) -> Self {
        ClassTuning { shape, trials: Vec::new(), fastest: None }
    }

    /// Tries the next of [`MatmulKernel::CANDIDATES`]; `false` once all have been tried.
    pub async fn try_next_kernel<R: CubeRuntime>(&mut self, device: &R::Device) -> bool {
        let Some(&kernel) = MatmulKernel::CANDIDATES.get(self.trials.len()) else {
            return false;
        };
        self.try_candidate::<R>(device, &kernel.to_string(), &|lhs, rhs| kernel.launch(lhs, rhs)).await;
        true
    }

    async fn try_candidate<R: CubeRuntime>(&mut self, device: &R::Device, name: &str, multiply: Multiply<'_, R>) {
        let index = self.trials.len();
        let operands = Operands::<R>::new(device, self.shape, index as u64 + 1);
        let outcome = trial(&R::client(device), &operands, multiply, self.fastest.map(|(_, millis)| millis)).await;
        if let Outcome::Right { millis, .. } = outcome {
            if self.fastest.is_none_or(|(_, best)| millis < best) {
                self.fastest = Some((index, millis));
            }
        }
        self.trials.push(CandidateTrial { name: name.to_string(), outcome });
    }

    /// The trials so far and the fastest right one.
    pub fn trial(self) -> ShapeTrial {
        ShapeTrial { shape: self.shape, trials: self.trials, chosen: self.fastest.map(|(index, _)| index) }
    }

    /// Uses the fastest right kernel tried for the class from now on (the default if none was
    /// right: the trial says so).
    pub fn choose(self) -> ShapeTrial {
        let trial = self.trial();
        let kernel = trial.chosen.and_then(|index| trial.trials[index].name.parse().ok());
        set_matmul_choice(trial.shape, kernel.unwrap_or(MatmulKernel::DEFAULT));
        trial
    }
}

/// One candidate: its first product (compiling it) checked, then timed unless far behind.
async fn trial<R: CubeRuntime>(client: &ComputeClient<R>, operands: &Operands<R>, multiply: Multiply<'_, R>, fastest: Option<f64>) -> Outcome {
    let far_behind = |millis: f64| fastest.is_some_and(|best| millis > FAR_BEHIND * best);
    let Checked { max_error, first_millis } = match check(client, operands, multiply).await {
        Ok(checked) => checked,
        Err(outcome) => return outcome,
    };
    // Slower than the fastest even counting its compilation: not worth timing (on a software
    // adapter such a product takes seconds).
    if far_behind(first_millis) {
        return Outcome::Right { millis: first_millis, max_error };
    }
    let single = match time_products(client, operands, multiply, 1).await {
        Ok(millis) => millis,
        Err(failure) => return Outcome::Failed(failure),
    };
    if far_behind(single) {
        return Outcome::Right { millis: single, max_error };
    }
    match time_products(client, operands, multiply, TIMED_RUNS).await {
        Ok(several) => Outcome::Right { millis: single.min(several), max_error },
        Err(failure) => Outcome::Failed(failure),
    }
}

/// A right product: its largest error, and how long it took from launch to an idle queue
/// (compiling the kernel included).
struct Checked {
    max_error: f64,
    first_millis: f64,
}

/// One product against the float64 one, or why there is none to time.
async fn check<R: CubeRuntime>(client: &ComputeClient<R>, operands: &Operands<R>, multiply: Multiply<'_, R>) -> Result<Checked, Outcome> {
    client.sync().await.map_err(|error| Outcome::Failed(format!("the GPU had failed before: {error:?}")))?;
    let started = Instant::now();
    let product = multiply(&operands.lhs, &operands.rhs).ok_or(Outcome::Declined)?;
    client.sync().await.map_err(|error| Outcome::Failed(format!("the GPU failed running it: {error:?}")))?;
    let first_millis = started.elapsed().as_secs_f64() * 1e3;
    let product = CubeBackend::<R, f32, i32, u32>::float_into_data(product).await.map_err(|error| Outcome::Failed(error.to_string()))?;
    let max_error = operands.max_error(product);
    if max_error <= tolerance(operands.dtype) {
        Ok(Checked { max_error, first_millis })
    } else {
        Err(Outcome::Wrong { max_error })
    }
}

/// Checks `kernel` on `shape`, untimed (a choice kept from an earlier visit), and uses it for
/// the class if it is right: its largest error, or why it is not used.
pub async fn check_matmul_choice<R: CubeRuntime>(device: &R::Device, shape: MatmulShape, kernel: MatmulKernel) -> Result<f64, Outcome> {
    let operands = Operands::<R>::new(device, shape, 0);
    let checked = check(&R::client(device), &operands, &|lhs, rhs| kernel.launch(lhs, rhs)).await?;
    set_matmul_choice(shape, kernel);
    Ok(checked.max_error)
}

/// Milliseconds per product over `runs` back-to-back products, from an idle queue to an idle queue.
async fn time_products<R: CubeRuntime>(client: &ComputeClient<R>, operands: &Operands<R>, multiply: Multiply<'_, R>, runs: usize) -> Result<f64, String> {
    let failed = |error| format!("the GPU failed while timing: {error:?}");
    client.sync().await.map_err(failed)?;
    let started = Instant::now();
    for _ in 0..runs {
        multiply(&operands.lhs, &operands.rhs).ok_or("declined a launch it took before")?;
    }
    client.sync().await.map_err(failed)?;
    Ok(started.elapsed().as_secs_f64() * 1e3 / runs as f64)
}

/// Seeded operands of a class's shape on the device, their host values (after rounding to the
/// dtype) and the class's layout.
struct Operands<R: CubeRuntime> {
    lhs: CubeTensor<R>,
    rhs: CubeTensor<R>,
    lhs_values: Vec<f32>,
    /// Row-major `[inner, columns]` whatever the device layout.
    rhs_values: Vec<f32>,
    rows: usize,
    inner: usize,
    columns: usize,
    dtype: DType,
}

impl<R: CubeRuntime> Operands<R> {
    fn new(device: &R::Device, shape: MatmulShape, seed: u64) -> Self {
        let MatmulShape { rows, inner, columns, rhs_transposed, .. } = shape;
        let dtype = shape.dtype.dtype();
        let upload = |values: Vec<f32>, dims: [usize; 2]| {
            let data = TensorData::new(values, dims).convert_dtype(dtype);
            let rounded = data.clone().convert_dtype(DType::F32).to_vec::<f32>().expect("float32 values");
            (CubeBackend::<R, f32, i32, u32>::float_from_data(data, device), rounded)
        };
        let (lhs, lhs_values) = upload(seeded_values(2 * seed, rows * inner), [rows, inner]);
        let (rhs, rhs_values) = if rhs_transposed {
            let (stored, values) = upload(seeded_values(2 * seed + 1, columns * inner), [columns, inner]);
            let row_major = (0..inner * columns).map(|i| values[(i % columns) * inner + i / columns]).collect();
            (CubeBackend::<R, f32, i32, u32>::float_transpose(stored), row_major)
        } else {
            upload(seeded_values(2 * seed + 1, inner * columns), [inner, columns])
        };
        Operands { lhs, rhs, lhs_values, rhs_values, rows, inner, columns, dtype }
    }

    /// The largest error of `product` on the checked columns, each relative to `Σ|a·b|` of its
    /// output; infinite for a product of the wrong size or with a value that is not finite.
    fn max_error(&self, product: TensorData) -> f64 {
        let Ok(got) = product.convert_dtype(DType::F32).to_vec::<f32>() else {
            return f64::INFINITY;
        };
        if got.len() != self.rows * self.columns {
            return f64::INFINITY;
        }
        let checked = CHECKED_COLUMNS.min(self.columns);
        let column = |i: usize| if checked == 1 { 0 } else { i * (self.columns - 1) / (checked - 1) };
        let mut worst = 0.0_f64;
        for row in 0..self.rows {
            for j in (0..checked).map(column) {
                let (mut exact, mut magnitude) = (0.0_f64, 0.0_f64);
                for t in 0..self.inner {
                    let term = f64::from(self.lhs_values[row * self.inner + t]) * f64::from(self.rhs_values[t * self.columns + j]);
                    exact += term;
                    magnitude += term.abs();
                }
                let value = f64::from(got[row * self.columns + j]);
                if !value.is_finite() {
                    return f64::INFINITY;
                }
                worst = worst.max((value - exact).abs() / magnitude.max(f64::MIN_POSITIVE));
            }
        }
        worst
    }
}

/// `len` values in [-1, 1) from a seeded splitmix64.
fn seeded_values(seed: u64, len: usize) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..len)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::seeded_values;

    #[test]
    fn seeded_values_cover_the_unit_interval_and_repeat() {
        let values = seeded_values(7, 10_000);
        assert_eq!(values, seeded_values(7, 10_000));
        assert_ne!(values, seeded_values(8, 10_000));
        assert!(values.iter().all(|v| (-1.0..1.0).contains(v)));
        let mean = values.iter().map(|&v| f64::from(v)).sum::<f64>() / values.len() as f64;
        assert!(mean.abs() < 0.03, "mean {mean}");
        assert!(values.iter().any(|&v| v < -0.99) && values.iter().any(|&v| v > 0.99));
    }
}
