//! `tally bench`: the benchmarks of `tally-bench`, the model-running ones on the backend that
//! `--backend` and `--dtype` pick.

use anyhow::Result;
use serde_json::Value;
use tally_bench::report::write_json;
use tally_bench::scenario::ProfiledRequestEdges;
use tally_bench::RunsOn;
use tally_model::ScoringBackend;

use crate::backend::{device_name, dispatch, DeviceArgs, WithBackend};
use crate::cli::{AttentionCommand, BenchCommand, ScenarioCommand};

pub fn run(command: BenchCommand) -> Result<()> {
    match command {
        BenchCommand::Load(args) => tally_bench::load::run(args),
        BenchCommand::Soak(args) => tally_bench::soak::run(args),
        BenchCommand::Chart(args) => tally_bench::chart::run(args),
        BenchCommand::Scenario(command) => {
            let out = command.bench.out.clone();
            let result = dispatch(command.device, command)?;
            write_json(out.as_deref(), &result)
        }
        BenchCommand::Attention(command) => {
            let out = command.bench.out.clone();
            let result = dispatch(command.device, command)?;
            println!("{}", serde_json::to_string_pretty(&result)?);
            write_json(out.as_deref(), &result)
        }
        BenchCommand::TileCandidates(device) => {
            for candidate in device.tuning_candidates()? {
                println!("{} {}", candidate.name, crate::tile_candidates::flags(candidate.tile, device.tile()).join(" "));
            }
            Ok(())
        }
    }
}

impl WithBackend for ScenarioCommand {
    type Output = Value;

    fn run<B: ScoringBackend>(self, device: B::Device) -> Result<Value> {
        let scorer = crate::loading::load_scorer::<B>(&self.bench.model, &device, self.bench.prefix_cache_bytes(), self.bench.max_batch_tokens, &self.device)?;
        let sync = || B::sync(&device).map_err(|e| anyhow::anyhow!("the device failed: {e:?}"));
        let cuda = cuda_profiler(&device);
        let edges = ProfiledRequestEdges { sync: &sync, cuda: cuda.as_ref().map(|switch| switch as &dyn Fn(bool) -> Result<()>) };
        // The tile that runs: a tuning may have picked another than the flags describe.
        let mut runs_on = runs_on(self.device);
        if let tally_model::AttentionRoute::Flash(tile) | tally_model::AttentionRoute::Tiled(tile) = scorer.routes().attention {
            runs_on.tile = tile.to_string();
        }
        let result = tally_bench::scenario::run(&self.bench, scorer, &runs_on, edges);
        #[cfg(feature = "cuda")]
        if let Some(gemms) = tally_model::cublas::profile_table() {
            println!("{gemms}");
        }
        result
    }
}

impl WithBackend for AttentionCommand {
    type Output = Value;

    fn run<B: ScoringBackend>(self, device: B::Device) -> Result<Value> {
        let tile = self.device.tile();
        tally_bench::attention::run::<B>(&self.bench, device, &runs_on(self.device), tile, self.device.routes().elementwise)
    }
}

/// CUDA's profiler range on `device`, if it is a CUDA device, with the cuBLASLt GEMM table reset
/// as it starts (`--profiled-request`, `--cuda-profiler-range`).
fn cuda_profiler<D: 'static>(device: &D) -> Option<impl Fn(bool) -> Result<()> + '_> {
    #[cfg(feature = "cuda")]
    {
        let device = tally_model::cuda::as_cuda_device(device)?;
        Some(move |active| {
            if active {
                tally_model::cublas::reset_profile()?;
            }
            tally_model::cuda::set_profiling(device, active).map_err(anyhow::Error::from)
        })
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = device;
        None::<fn(bool) -> Result<()>>
    }
}

fn runs_on(device: DeviceArgs) -> RunsOn {
    let name = |value: &dyn std::fmt::Debug| format!("{value:?}").to_lowercase();
    RunsOn { backend: name(&device.backend), dtype: name(&device.dtype), attention: name(&device.attention()), elementwise: name(&device.elementwise()), tile: device.tile().to_string(), matmul: device.matmul_label(), flush_denormals: device.flush_denormals(), fused: device.fused(), device: device_name(device.backend) }
}
