//! Every kernel the CUDA build launches, compiled offline for the H100 the GPU suite runs on
//! (`sm_90a`): CubeCL's CUDA source (`common/offline_cuda.rs`, no GPU) → NVRTC → PTX → `ptxas`,
//! the path CubeCL's runtime and the driver take at a launch. It catches what a GPU session
//! would otherwise find first: C++ CubeCL generates that does not compile, inline PTX
//! (`ldmatrix`, `mma.sync`) that only `ptxas` reads, shared memory past the device's limit; and
//! it reports each of tally's kernels' registers, spills and shared memory, which decide
//! occupancy before any timing.
//!
//! The kernels come from running tally's code on the offline runtime: every attention route and
//! tile variant at the SmolLM2 and Qwen3-0.6B head shapes, and every fixture model's scoring
//! pass on each route, unfused and through Burn's fusion (what `tally serve --backend cuda`
//! runs), in float32 and bfloat16.
//!
//! Burn's and CubeK's kernels are generated too (CubeCL's expansion runs for them) but not
//! compiled: they are their projects' to build. Any kernel CubeCL cannot generate fails the test,
//! Burn's too, and so does any launch the driver would refuse (an empty grid, one past CUDA's
//! limits, too many units a cube): on a device such a launch fails on CubeCL's stream thread,
//! which logs it and goes on, and the kernel's output is never written. The fixture passes include
//! items with no query (`item_first`), where an empty grid was once launched on the H100.
//!
//! Needs NVRTC and `ptxas` from a CUDA 13 toolkit: its folder in `TALLY_CUDA_TOOLKIT`, with its
//! `lib` on `LD_LIBRARY_PATH` (cudarc loads NVRTC by name). `tests/cuda_toolkit.sh` installs one
//! from NVIDIA's PyPI wheels and prints its folder, as `.ci/run` does:
//!
//! ```sh
//! cuda=$(tests/cuda_toolkit.sh)
//! TALLY_CUDA_TOOLKIT=$cuda LD_LIBRARY_PATH=$cuda/lib cargo test-all --test cuda_codegen
//! ```
//!
//! (Not `CUDA_PATH`: cudarc's build script reads it, and the CUDA build would be rebuilt.)
//!
//! Without a toolkit the test is reported ignored; `TALLY_REQUIRE_NVRTC=1` (CI) makes that a
//! failure. `TALLY_CUDA_CODEGEN_REPORT=FILE` writes the per-kernel table as JSON (committed as
//! `benches/results/cuda-codegen-sm90a.json`); `TALLY_CUDA_CODEGEN_DUMP=DIR` keeps every kernel's
//! source, PTX and cubin there, for `benches/gpu/sass_mix.py`'s instruction counts;
//! `TALLY_CUDA_CODEGEN_ONLY=TEXT` compiles only the kernels whose generator's line holds `TEXT`;
//! `TALLY_CUDA_CODEGEN_FLUSH_DENORMALS=1` compiles as `--flush-denormals` does (`--ftz=true`).

#[path = "common/offline_cuda.rs"]
mod offline_cuda;
mod kernel_cases;
#[path = "common/scoring_pass.rs"]
mod scoring_pass;

use std::path::{Path, PathBuf};
use std::process::Command;

use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive};
use burn_cubecl::cubecl::server::CubeCount;
use burn_cubecl::{CubeBackend, FloatElement};
use burn_fusion::Fusion;
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use half::bf16;
use kernel_cases::Case;
use offline_cuda::{CudaSource, OfflineCuda};
use tally_model::{AttentionRoute, ScoringBackend};
use tally_shaders::{KvStaging, PrefixSplits, TileShape};

/// Float type `F` on offline device `ID` (one a float type: see [`offline_cuda::OfflineDevice`]).
type Offline<F, const ID: u16> = CubeBackend<OfflineCuda<ID>, F, i32, u8>;

/// The CUDA toolkit the kernels are compiled with.
struct Toolkit {
    include: PathBuf,
    ptxas: PathBuf,
}

impl Toolkit {
    /// `TALLY_CUDA_TOOLKIT`'s headers and `ptxas`, with NVRTC loadable; why not, otherwise.
    fn find() -> Result<Toolkit, String> {
        let root = PathBuf::from(std::env::var_os("TALLY_CUDA_TOOLKIT").ok_or("TALLY_CUDA_TOOLKIT is not set")?);
        let toolkit = Toolkit { include: root.join("include"), ptxas: root.join("bin/ptxas") };
        for needed in [toolkit.include.join("cuda_bf16.h"), toolkit.ptxas.clone()] {
            if !needed.exists() {
                return Err(format!("{} is missing", needed.display()));
            }
        }
        // cudarc loads NVRTC by name, as the CUDA runtime does.
        let library_path = std::env::var_os("LD_LIBRARY_PATH").unwrap_or_default();
        if !std::env::split_paths(&library_path).any(|dir| dir.join("libnvrtc.so.13").exists()) {
            return Err("libnvrtc.so.13 is not on LD_LIBRARY_PATH".into());
        }
        Ok(toolkit)
    }

    /// NVRTC with the options CubeCL's CUDA runtime passes (cubecl-cuda `compile_kernel`).
    fn ptx(&self, kernel: &CudaSource) -> Result<String, String> {
        let mut include_paths = vec![self.include.display().to_string()];
        let cccl = self.include.join("cccl");
        if cccl.exists() {
            include_paths.push(cccl.display().to_string());
        }
        let mut options = vec!["-lineinfo".to_owned()];
        // What `--flush-denormals` adds (patched cubecl-cuda).
        if flush_denormals() {
            options.push("--ftz=true".to_owned());
        }
        let options = CompileOptions { arch: Some("sm_90a"), include_paths, options, ..Default::default() };
        compile_ptx_with_opts(&kernel.source, options).map(|ptx| ptx.to_src()).map_err(|error| format!("{error:?}"))
    }

    /// `ptxas -v` for `sm_90a`: what the driver's JIT makes of the PTX; the cubin goes to
    /// `cubin` (for `nvdisasm`) or nowhere.
    fn assemble(&self, ptx: &str, scratch: &Path, cubin: Option<&Path>) -> Result<Resources, String> {
        std::fs::write(scratch, ptx).map_err(|e| e.to_string())?;
        let cubin = cubin.unwrap_or(Path::new("/dev/null"));
        let output = Command::new(&self.ptxas).args(["-arch=sm_90a", "-v", "-o"]).arg(cubin).arg(scratch).output().map_err(|e| e.to_string())?;
        let log = String::from_utf8_lossy(&output.stderr).into_owned();
        if !output.status.success() {
            return Err(log);
        }
        Ok(Resources::from_ptxas_log(&log))
    }
}

/// What `ptxas -v` says a kernel uses.
#[derive(Debug, Default)]
struct Resources {
    registers: u32,
    spill_stores: u32,
    spill_loads: u32,
    stack_frame: u32,
    shared_memory: u32,
}

impl Resources {
    fn from_ptxas_log(log: &str) -> Resources {
        // "Used 168 registers, used 1 barriers, 33280 bytes smem, 400 bytes cmem[0]" and
        // "24 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads".
        let number_before = |line: &str, unit: &str| -> Option<u32> {
            let end = line.find(unit)?;
            line[..end].trim_end().rsplit([' ', ',']).next()?.parse().ok()
        };
        let mut resources = Resources::default();
        for line in log.lines() {
            resources.registers = number_before(line, " registers").unwrap_or(resources.registers);
            resources.shared_memory = number_before(line, " bytes smem").unwrap_or(resources.shared_memory);
            resources.stack_frame = number_before(line, " bytes stack frame").unwrap_or(resources.stack_frame);
            resources.spill_stores = number_before(line, " bytes spill stores").unwrap_or(resources.spill_stores);
            resources.spill_loads = number_before(line, " bytes spill loads").unwrap_or(resources.spill_loads);
        }
        resources
    }
}

/// Whether kernels compile as `--flush-denormals` has them (`TALLY_CUDA_CODEGEN_FLUSH_DENORMALS`).
fn flush_denormals() -> bool {
    std::env::var_os("TALLY_CUDA_CODEGEN_FLUSH_DENORMALS").is_some()
}

/// Every attention route and tile variant on `F`, at the head shapes of SmolLM2 (9/3 heads of
/// 64) and Qwen3-0.6B (16/8 heads of 128), prefixes and items straddling the tile sizes.
fn attention_routes<F: FloatElement, const ID: u16>() {
    let cases = [
        Case { groups: vec![(700, vec![20, 65, 1]), (3, vec![17])], q_heads: 9, kv_heads: 3, head_dim: 64, ..Default::default() },
        Case { groups: vec![(2020, vec![20, 20, 3]), (37, vec![64, 16, 17])], q_heads: 16, kv_heads: 8, head_dim: 128, ..Default::default() },
    ];
    let variants: Vec<TileShape> = kernel_cases::every_tile_shape().filter(|shape| shape.stages < 3).flat_map(|shape| kernel_cases::FRAGMENT_LOADS.map(|loads| shape.with_loads(loads))).collect();
    // The flash kernel's cp.async staging exists with two stages (either barrier scheme) and
    // three (one barrier); one stage reads and stages in turn. Its warps of 32 rows, every way,
    // with `ldmatrix`. Three stages (the next step's scores a step ahead) as CUDA runs them:
    // `ldmatrix`, cp.async, warps of 16 rows and of 32.
    let copy_async = variants.iter().filter(|shape| shape.stages == 2).flat_map(|shape| [KvStaging::CopyAsync, KvStaging::CopyAsyncSplit].map(|staging| shape.with_staging(staging)));
    let two_blocks = kernel_cases::every_tile_shape()
        .filter(|shape| shape.stages == 2)
        .flat_map(|shape| kernel_cases::KV_STAGINGS.map(|staging| shape.with_staging(staging).with_warp_rows(32)))
        .flatten();
    let three_stages = kernel_cases::every_tile_shape()
        .filter(|shape| shape.stages == 3)
        .map(|shape| shape.with_staging(KvStaging::CopyAsync))
        .flat_map(|shape| [Some(shape), shape.with_warp_rows(32)])
        .flatten();
    // The prefix walk in parts (`--prefix-splits auto`: on the offline runtime's 132 SMs these
    // cases' few tiles split), with the merge: CUDA's default tile, and `ahead`'s three stages.
    let cuda_default = TileShape::new(128, 64).and_then(|shape| shape.with_staging(KvStaging::CopyAsync).with_warp_rows(32)).expect("a built shape");
    let ahead = cuda_default.with_stages(3).and_then(|shape| shape.with_warp_rows(16)).expect("a built shape");
    let split = [cuda_default, ahead].map(|shape| shape.with_splits(PrefixSplits::Auto));
    let flash_variants = copy_async.chain(two_blocks).chain(three_stages).chain(split).map(AttentionRoute::Flash);
    let routes = [AttentionRoute::Kernel, AttentionRoute::Cascade].into_iter().chain(variants.iter().flat_map(|&shape| [AttentionRoute::Tiled(shape), AttentionRoute::Flash(shape)])).chain(flash_variants);
    for route in routes {
        for (seed, case) in cases.iter().enumerate() {
            offline_cuda::running(format!("{:?} attention {route:?}, {}", F::dtype(), case.name()));
            case.routed_on::<Offline<F, ID>>(seed as u64, route);
        }
    }
}

/// Every fixture model's scoring pass on each route, on backend `B`.
fn fixture_passes<B: ScoringBackend>() {
    for dir in scoring_pass::fixture_models() {
        for routes in scoring_pass::whole_model_routes() {
            offline_cuda::running(format!("{} on {}, {routes}", dir.display(), std::any::type_name::<B>()));
            scoring_pass::label_logprobs::<B>(&dir, routes);
        }
    }
}

/// The cascade's softmax on the float32 scores cuBLASLt writes from 16-bit operands (a GEMM the
/// offline runtime cannot run, so the cascade above reads scores in `F`), weights in `F`.
fn softmax_of_float32_scores<F: FloatElement, const ID: u16>() {
    offline_cuda::running(format!("{:?} softmax of float32 scores", F::dtype()));
    let (rows, width) = (6, 40);
    let scores = Tensor::<Offline<F, ID>, 2>::from_data(TensorData::new(vec![0f32; rows * width], [rows, width]), (&Default::default(), DType::F32));
    let (weights, _) = tally_shaders::softmax_lse(scores.into_primitive().tensor(), F::dtype());
    // Read back, so the launch has run (and compiled) while this is the generator named.
    kernel_cases::host(Tensor::<Offline<F, ID>, 2>::from_primitive(TensorPrimitive::Float(weights)));
}

fn in_float<F: FloatElement, const ID: u16>() {
    println!("{:?}: attention routes", F::dtype());
    attention_routes::<F, ID>();
    softmax_of_float32_scores::<F, ID>();
    println!("{:?}: fixture models, unfused and through fusion", F::dtype());
    fixture_passes::<Offline<F, ID>>();
    fixture_passes::<Fusion<Offline<F, ID>>>();
}

/// One compiled kernel's line in the report.
struct Compiled {
    kernel: CudaSource,
    outcome: Result<Resources, String>,
    /// NVRTC's time for this kernel: what CubeCL's CUDA runtime spends at a kernel's first
    /// launch (before the driver loads the PTX), the bulk of a cold start.
    nvrtc_seconds: f64,
}

/// Compiles `kernels` on all cores (NVRTC takes ~1 s a kernel). With `dump`, each kernel's CUDA
/// source, PTX and cubin are kept there as `<index>.cu|ptx|cubin`, with `index.tsv` saying
/// which is which (what `benches/gpu/sass_mix.py` reads).
fn compile_all(toolkit: &Toolkit, kernels: Vec<CudaSource>, dump: Option<&Path>) -> Vec<Compiled> {
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let queue = std::sync::Mutex::new(kernels.into_iter().enumerate());
    let scratch = std::env::temp_dir().join(format!("tally-cuda-codegen-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let mut compiled: Vec<(usize, Compiled)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..workers)
            .map(|worker| {
                let (queue, scratch) = (&queue, scratch.join(format!("{worker}.ptx")));
                scope.spawn(move || {
                    let mut done = Vec::new();
                    loop {
                        // The next kernel, the queue's lock released before it compiles (in a
                        // `while let`, the guard would live through the loop's body: until
                        // session 52 the workers compiled one at a time).
                        let next = queue.lock().unwrap().next();
                        let Some((index, kernel)) = next else { break };
                        let start = std::time::Instant::now();
                        let ptx = toolkit.ptx(&kernel);
                        let nvrtc_seconds = start.elapsed().as_secs_f64();
                        let cubin = dump.map(|dir| {
                            std::fs::write(dir.join(format!("{index}.cu")), &kernel.source).expect("the dump folder is writable");
                            if let Ok(ptx) = &ptx {
                                std::fs::write(dir.join(format!("{index}.ptx")), ptx).expect("the dump folder is writable");
                            }
                            dir.join(format!("{index}.cubin"))
                        });
                        let outcome = ptx.and_then(|ptx| toolkit.assemble(&ptx, &scratch, cubin.as_deref()));
                        done.push((index, Compiled { kernel, outcome, nvrtc_seconds }));
                    }
                    done
                })
            })
            .collect();
        workers.into_iter().flat_map(|worker| worker.join().unwrap()).collect()
    });
    let _ = std::fs::remove_dir_all(&scratch);
    compiled.sort_by_key(|(index, _)| *index);
    compiled.into_iter().map(|(_, compiled)| compiled).collect()
}

/// The table printed and the JSON written: each of tally's kernels with what generated it.
fn report(compiled: &[Compiled]) -> serde_json::Value {
    println!("\n{:<34} {:>5} {:>7} {:>7} {:>6} {:>7}  generated by", "kernel (sm_90a)", "regs", "spill↑B", "spill↓B", "stackB", "smemB");
    let rows: Vec<serde_json::Value> = compiled
        .iter()
        .filter_map(|Compiled { kernel, outcome, nvrtc_seconds }| Some((kernel, outcome.as_ref().ok()?, nvrtc_seconds)))
        .map(|(kernel, r, nvrtc_seconds)| {
            let shared = kernel.shared_memory_bytes.max(r.shared_memory as usize);
            println!("{:<34} {:>5} {:>7} {:>7} {:>6} {:>7}  {}", kernel.entry_point, r.registers, r.spill_stores, r.spill_loads, r.stack_frame, shared, kernel.generated_by);
            serde_json::json!({
                "kernel": kernel.entry_point, "generated_by": kernel.generated_by, "registers": r.registers,
                "spill_store_bytes": r.spill_stores, "spill_load_bytes": r.spill_loads, "stack_frame_bytes": r.stack_frame, "shared_memory_bytes": shared,
                "nvrtc_ms": (nvrtc_seconds * 1e3).round(),
            })
        })
        .collect();
    let mut nvrtc: Vec<f64> = compiled.iter().map(|c| c.nvrtc_seconds).collect();
    nvrtc.sort_by(f64::total_cmp);
    let (median, mean) = (nvrtc.get(nvrtc.len() / 2).copied().unwrap_or(0.0), nvrtc.iter().sum::<f64>() / nvrtc.len().max(1) as f64);
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    println!("NVRTC a kernel: median {median:.2} s, mean {mean:.2} s ({workers} compiling at once on this machine; CubeCL compiles one at a time, at each kernel's first launch)");
    serde_json::json!({ "arch": "sm_90a", "compiler": "CubeCL 0.10 CUDA dialect, NVRTC, ptxas", "flush_denormals": flush_denormals(), "nvrtc_median_s": median, "nvrtc_mean_s": mean, "compiling_at_once": workers, "kernels": rows })
}

fn every_kernel_compiles_for_sm_90a(toolkit: &Toolkit) {
    in_float::<f32, 0>();
    in_float::<bf16, 1>();
    let generated = offline_cuda::compiled();
    let (mut tallys, others): (Vec<CudaSource>, Vec<CudaSource>) = generated.into_iter().partition(|kernel| kernel.is_tallys());
    if let Ok(only) = std::env::var("TALLY_CUDA_CODEGEN_ONLY") {
        tallys.retain(|kernel| kernel.generated_by.contains(&only));
        println!("TALLY_CUDA_CODEGEN_ONLY: compiling only what {only:?} generated");
    }
    println!("{} of tally's kernels and {} of Burn's and CubeK's generated; compiling tally's with NVRTC and ptxas for sm_90a", tallys.len(), others.len());
    let dump = std::env::var_os("TALLY_CUDA_CODEGEN_DUMP").map(PathBuf::from);
    if let Some(dir) = &dump {
        std::fs::create_dir_all(dir).expect("the dump folder can be made");
        let index: String = tallys.iter().enumerate().map(|(i, k)| format!("{i}\t{}\t{}\n", k.entry_point, k.generated_by)).collect();
        std::fs::write(dir.join("index.tsv"), index).expect("the dump folder is writable");
    }
    let compiled = compile_all(toolkit, tallys, dump.as_deref());
    let report = report(&compiled);
    if let Some(path) = std::env::var_os("TALLY_CUDA_CODEGEN_REPORT") {
        std::fs::write(&path, serde_json::to_string_pretty(&report).unwrap()).expect("the report is written");
    }
    let max_shared = offline_cuda::MAX_SHARED_MEMORY_BYTES;
    let failures: Vec<String> = compiled
        .iter()
        .filter_map(|Compiled { kernel, outcome, .. }| match outcome {
            Err(log) => Some(format!("{} ({}): {log}", kernel.entry_point, kernel.generated_by)),
            Ok(_) if kernel.shared_memory_bytes > max_shared => Some(format!("{} ({}): {} bytes of shared memory, the H100 has {max_shared}", kernel.entry_point, kernel.generated_by, kernel.shared_memory_bytes)),
            Ok(_) => None,
        })
        .collect();
    assert!(failures.is_empty(), "{} of tally's {} kernels do not build for sm_90a:\n{}", failures.len(), compiled.len(), failures.join("\n\n"));
    let failed = offline_cuda::failed();
    assert!(failed.is_empty(), "{} launches CubeCL could not generate or CUDA would refuse:\n{}", failed.len(), failed.join("\n\n"));
}

/// The offline server's check of a launch's grid, at the edges of what CUDA takes.
fn grids_cuda_refuses_are_failures() {
    let refused = |x, y, z| offline_cuda::refused_grid(&CubeCount::Static(x, y, z)).is_some();
    assert!(!refused(1, 1, 1) && !refused(i32::MAX as u32, 65_535, 65_535), "grids CUDA takes");
    for (x, y, z) in [(0, 1, 1), (4, 0, 1), (4, 1, 0), (1 << 31, 1, 1), (1, 65_536, 1), (1, 1, 65_536)] {
        assert!(refused(x, y, z), "({x}, {y}, {z}) is refused by CUDA");
    }
}

fn main() {
    // A kernel CubeCL cannot generate panics on the device's stream thread, where the offline
    // server catches it and the test reports it; its backtrace would only bury the report.
    let report_panic = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !std::thread::current().name().is_some_and(|name| name.starts_with("DSD-")) {
            report_panic(info);
        }
    }));
    let args = libtest_mimic::Arguments::from_args();
    let toolkit = Toolkit::find();
    if let Err(why) = &toolkit {
        if std::env::var("TALLY_REQUIRE_NVRTC").is_ok_and(|v| v == "1") {
            eprintln!("error: TALLY_REQUIRE_NVRTC=1 but no CUDA toolkit to compile with: {why}");
            std::process::exit(101);
        }
        eprintln!("note: ignored: no CUDA toolkit to compile with ({why}); see this test's docs");
    }
    let available = toolkit.is_ok();
    let trial = libtest_mimic::Trial::test("every_kernel_compiles_for_sm_90a", move || {
        every_kernel_compiles_for_sm_90a(&toolkit.expect("checked above"));
        Ok(())
    })
    .with_ignored_flag(!available);
    let grids = libtest_mimic::Trial::test("grids_cuda_refuses_are_failures", || {
        grids_cuda_refuses_are_failures();
        Ok(())
    });
    libtest_mimic::run(&args, vec![trial, grids]).exit()
}
