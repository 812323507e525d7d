//! Every matmul tally could run on a 2-D shape, checked and timed on the wgpu adapter on
//! SmolLM2-135M's shape classes (M rows, default 16; `M=64 cargo run --release -p tally-shaders
//! --example matmul_candidates`): the page's own tuning (`matmul_tuning::tune_matmul`), each
//! candidate checked against a float64 product before it is timed. Chromium's software adapter
//! natively: `VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json LD_LIBRARY_PATH=/usr/lib/chromium`.
use burn::backend::wgpu::{WgpuDevice, WgpuRuntime};
use tally_shaders::matmul_choice::{row_class, ClassDtype, MatmulShape};
use tally_shaders::matmul_tuning::{tune_matmul, Outcome};

fn main() {
    let device = WgpuDevice::default();
    let m: usize = std::env::var("M").ok().and_then(|v| v.parse().ok()).unwrap_or(16);
    for (what, inner, columns, rhs_transposed) in [("qkv", 576, 960, false), ("o", 576, 576, false), ("gate_up", 576, 3072, false), ("down", 1536, 576, false), ("head", 576, 16_384, true)] {
        let shape = MatmulShape { rows: row_class(m), inner, columns, rhs_transposed, dtype: ClassDtype::F32 };
        let trial = futures_lite::future::block_on(tune_matmul::<WgpuRuntime>(&device, shape));
        for candidate in &trial.trials {
            let outcome = match &candidate.outcome {
                Outcome::Right { millis, max_error } => format!("{millis:.1} ms, max error {max_error:.1e}"),
                other => format!("{other:?}"),
            };
            println!("{what} {shape} {}: {outcome}", candidate.name);
        }
        println!("{what} {shape}: chosen {:?}", trial.chosen.map(|i| &trial.trials[i].name));
    }
}
