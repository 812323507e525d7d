//! Backend selection: the backends compiled in (cargo features `ndarray`, `wgpu`, `cuda`) and
//! a generic dispatch into code written once over `tally_model::ScoringBackend`.

use anyhow::Result;
use clap::{Args, ValueEnum};

use crate::tile_candidates::{self, TileCandidate};

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

/// Number format of weights and activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DType {
    Float32,
    /// CUDA only. Not float16: Qwen3's residual stream overflows its range.
    Bfloat16,
}

/// Which multi-item attention runs (`tally_model::AttentionRoute`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Attention {
    /// The backend's faster: `flash` on CUDA (an H200 in bfloat16, S1: 2.6x the row kernel end
    /// to end, `benches/results/gpu-h200-2026-11-26/`), `kernel` on wgpu (not yet timed on a
    /// hardware GPU through wgpu; on lavapipe flash and rows are within 5%) and the CPU.
    Auto,
    /// tally's multi-item kernel: on wgpu and CUDA one query row per unit (masked tiles never
    /// computed); on the CPU blocks of rows over the cores, one softmax over prefix and item.
    Kernel,
    /// The tiled multi-item kernel: tiles of `--tile-rows` query rows × `--tile-keys` keys on
    /// tensor cores (CUDA, bfloat16), in registers on wgpu and in float32. The CPU's kernel on the CPU.
    Tiled,
    /// The tiled kernel's tiles with FlashAttention-2's loop: scores, softmax and weights stay
    /// in registers (tensor-core fragments on CUDA in bfloat16). The CPU's kernel on the CPU.
    Flash,
    /// Prefix part as one batched matmul per KV head (tensor cores on CUDA), own-item part
    /// padded, merged by log-sum-exp: plain Burn ops.
    Cascade,
}

/// How the layers' elementwise steps run (`tally_model::ElementwiseRoute`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Elementwise {
    /// The backend's faster: `kernels` on the CPU (measured there) and CUDA (an H200 in
    /// bfloat16, S1: 4% faster than Burn's fused ops, a quarter of the compiles), `burn` on wgpu
    /// (not yet timed on a hardware GPU through wgpu).
    Auto,
    /// Burn's ops (fused by Burn's fusion layer on wgpu and CUDA; one op at a time on the CPU).
    Burn,
    /// tally's fused kernels: residual add + RMSNorm, the q/k norm with RoPE, and `silu(gate) ·
    /// up`, one launch each on wgpu and CUDA, one pass over the rows each on the CPU.
    Kernels,
}

impl From<Elementwise> for tally_model::ElementwiseRoute {
    fn from(elementwise: Elementwise) -> Self {
        match elementwise {
            Elementwise::Burn | Elementwise::Auto => tally_model::ElementwiseRoute::Burn,
            Elementwise::Kernels => tally_model::ElementwiseRoute::Kernels,
        }
    }
}

/// Whether Burn's fusion layer sits between the model and CubeCL.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Fusion {
    /// Off on CUDA where the layers' elementwise steps are tally's kernels (`--elementwise
    /// kernels`, CUDA's default): on the offline CUDA runtime one warm S1 request then takes
    /// 3–8 ms of host time against 20–50 ms through fusion, for the same launches
    /// (`tests/cuda_launches.rs`); on with Burn's elementwise ops, which it merges, and on wgpu.
    Auto,
    /// Burn's fusion layer: ops queued on its thread and merged where they can be; tally's
    /// kernels and cuBLASLt wait for it to resolve their inputs.
    On,
    /// CUDA only: Burn's ops straight to CubeCL, one launch each.
    Off,
}

/// Which kernel or library multiplies (`tally_model::MatmulRoute`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Matmul {
    /// `cublas` on CUDA where libcublasLt loads (an H200 in bfloat16: no autotuning, so half the
    /// cold start, and S1 as fast or faster), else `cubecl`.
    Auto,
    /// CubeCL's autotuned kernels (cubek); on the CPU and wgpu the only choice.
    Cubecl,
    /// cuBLASLt (CUDA only; libcublasLt loaded at run time): float32 accumulation, no tf32.
    Cublas,
    /// tally's register-block kernel (wgpu and CUDA): no shared memory or barriers, the fastest
    /// on software adapters such as lavapipe.
    Block,
}

/// How `--matmul cublas` orders its GEMMs with CubeCL's kernels (`tally_model::cublas::CublasOrdering`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CublasOrdering {
    /// On the CUDA stream CubeCL launches on (the default): the stream orders them, the host
    /// never waits.
    Stream,
    /// CubeCL's queue drained, each GEMM on a stream of tally's and waited for: two host syncs
    /// a GEMM (no patched CubeCL needed; for comparison).
    Sync,
}

/// The dtype of the cascade's scores on cuBLASLt (`--cascade-scores`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CascadeScores {
    /// cuBLASLt's float32 accumulators as they are, as the attention kernels keep their scores.
    Float32,
    /// Rounded to the model's dtype: half the bytes written and read back by the softmax
    /// (bf16: 2⁻⁹ relative, up to 0.06 on a score of 20).
    Model,
}

/// How weight matrices are held (`tally_model::WeightForm`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Weights {
    /// As the file stores them (GGUF's quantised blocks, bf16/f16 checkpoints when computing in
    /// float32), expanded to float a panel at a time as they are multiplied: the file's size in
    /// memory instead of two to eight times it.
    Compact,
    /// Dequantised to float at load: more memory, no expansion per pass.
    Float,
}

impl From<Weights> for tally_model::WeightForm {
    fn from(weights: Weights) -> Self {
        match weights {
            Weights::Compact => tally_model::WeightForm::Compact,
            Weights::Float => tally_model::WeightForm::Float,
        }
    }
}

/// `--backend`, `--dtype`, `--attention`, `--matmul` and `--weights`, shared by every command that runs the model.
#[derive(Args, Clone, Copy, Debug)]
pub struct DeviceArgs {
    #[arg(long, value_enum, default_value_t = BackendKind::default())]
    pub backend: BackendKind,
    #[arg(long, value_enum, default_value_t = DType::Float32)]
    pub dtype: DType,
    #[arg(long, value_enum, default_value_t = Attention::Auto)]
    pub attention: Attention,
    #[arg(long, value_enum, default_value_t = Matmul::Auto)]
    pub matmul: Matmul,
    /// How `--matmul cublas` orders its GEMMs with CubeCL's kernels (default: stream).
    #[arg(long, value_enum)]
    pub cublas_ordering: Option<CublasOrdering>,
    /// With `--matmul cublas`: time the first N of cuBLASLt's heuristic algorithms on each GEMM
    /// shape class's first GEMM (the pass's rows rounded up to a power of two) and keep the
    /// fastest (default 1: the heuristic's first, untimed).
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=16))]
    pub cublas_algos: Option<u8>,
    /// The dtype the cascade (`--attention cascade`, `bench attention`'s) writes its scores in
    /// where `--matmul cublas` multiplies 16-bit operands; elsewhere they are in the
    /// model's dtype, and other routes keep their scores on chip in float32.
    #[arg(long, value_enum, default_value_t = CascadeScores::Float32)]
    pub cascade_scores: CascadeScores,
    #[arg(long, value_enum, default_value_t = Elementwise::Auto)]
    pub elementwise: Elementwise,
    #[arg(long, value_enum, default_value_t = Fusion::Auto)]
    pub fusion: Fusion,
    #[arg(long, value_enum, default_value_t = Weights::Compact)]
    pub weights: Weights,
    /// Query rows a cube of `--attention tiled|flash` takes (16 per plane of 32 units; default
    /// 128 on CUDA, 64 elsewhere: see `tile`).
    #[arg(long, value_parser = tile_size(["16", "32", "64", "128"]))]
    pub tile_rows: Option<usize>,
    /// Keys a step of `--attention tiled|flash` stages and multiplies (default 64 on CUDA, 16
    /// elsewhere).
    #[arg(long, value_parser = tile_size(["16", "32", "64"]))]
    pub tile_keys: Option<usize>,
    /// Key steps `--attention flash` keeps in flight: 2 reads the next step's keys and values
    /// while it computes on this one (one barrier a step); 1 stages and computes in turn; 3
    /// also multiplies the next step's scores during this one's softmax, a third buffer taking
    /// the step after (fewer where the device's shared memory cannot hold them). Default 2.
    #[arg(long, value_parser = tile_size(["1", "2", "3"]))]
    pub tile_stages: Option<usize>,
    /// How `--attention tiled|flash` on tensor cores reads key and value fragments from shared
    /// memory (default ldmatrix).
    #[arg(long, value_enum)]
    pub fragment_loads: Option<FragmentLoads>,
    /// How `--attention flash` with two or three stages on tensor cores (CUDA) brings the next
    /// key steps' keys and values into shared memory (default cp-async on CUDA; three stages
    /// always take cp-async there); elsewhere it reads them into registers.
    #[arg(long, value_enum)]
    pub kv_staging: Option<KvStaging>,
    /// Query rows each warp of `--attention flash` takes: 16 (the query in registers) or 32
    /// (FlashAttention-2's layout: two row blocks share each key and value fragment, the query
    /// read from shared memory; default 32 on CUDA, 16 elsewhere); a 16-row tile keeps 16.
    #[arg(long, value_parser = tile_size(["16", "32"]))]
    pub warp_rows: Option<usize>,
    /// How `--attention tiled|flash` cuts a pass's items into tiles: `whole-items` (a tile takes
    /// items while they fit) or `filled` (every tile full, items cut at tile edges: fewer cubes,
    /// a tile starting inside an item also walks its earlier keys; default whole-items).
    #[arg(long, value_enum)]
    pub tile_packing: Option<TilePacking>,
    /// How many cubes `--attention flash` cuts each tile's prefix walk over (FlashDecoding's
    /// split-KV): `whole` (one cube a tile and KV head; the default), `auto` (per launch, as
    /// many as fill the GPU's cube slots where a pass has too few tiles for them, by a count of
    /// waves; CUDA only, whole where the device gives no SM count) or a number of parts. The
    /// parts' outputs are merged by their log-sum-exps in one more launch.
    #[arg(long, value_parser = prefix_splits)]
    pub prefix_splits: Option<tally_model::PrefixSplits>,
    /// Whether `--attention flash` times its candidate tiles on the device at start-up (one
    /// layer at S1's shape on the model's heads) and runs the fastest: `auto` does on CUDA where
    /// no tile flag above is given; `on` also on wgpu; `off` runs the tile the flags describe.
    /// A pick is kept for later starts on the same device, dtype, model shape and candidates
    /// (`$XDG_CACHE_HOME/tally/flash-tiles.json`), which take it untimed; `retime` times again.
    #[arg(long, value_enum, default_value_t = TileTuning::Auto)]
    pub tile_tuning: TileTuning,
    /// The candidates a tuning times, by name, joined by commas (default: all the backend's,
    /// which `tally bench tile-candidates` lists with the flags that run each alone): on CUDA
    /// default, filled, split-barriers, ahead, warps12, ahead12; elsewhere default, filled,
    /// square. The first named that the backend tries is the reference the others are checked
    /// against and the one kept unless another is faster by a margin.
    #[arg(long, value_parser = tile_candidates::candidate_names)]
    pub tile_candidates: Option<tile_candidates::CandidateNames>,
    /// Compile the CUDA kernels with single-precision denormals flushed to zero (NVRTC
    /// `--ftz=true`): the attention softmax's exponentials lose their denormal fix-up. On by
    /// default on CUDA (`--flush-denormals false` keeps them); other backends have no such option.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub flush_denormals: Option<bool>,
}

/// How the flash kernel stages its next key step (`tally_model::KvStaging`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum KvStaging {
    /// Each unit reads its share into registers and stores it after the step's work.
    Registers,
    /// `cp.async` copies, global to shared memory, waited on by a barrier.
    CpAsync,
    /// `cp.async` with two barriers a buffer (copies landed; readers done): no unit waits at a
    /// step's start for the cube's slowest.
    CpAsyncSplit,
}

impl From<KvStaging> for tally_model::KvStaging {
    fn from(staging: KvStaging) -> Self {
        match staging {
            KvStaging::Registers => tally_model::KvStaging::Registers,
            KvStaging::CpAsync => tally_model::KvStaging::CopyAsync,
            KvStaging::CpAsyncSplit => tally_model::KvStaging::CopyAsyncSplit,
        }
    }
}

/// Whether the flash kernel's tile is timed and picked at start-up (`tally_engine::tile_tuning`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TileTuning {
    /// On CUDA where no tile flag is given.
    Auto,
    /// Wherever the flash kernel runs on a GPU (wgpu too), the flags' tile the first candidate.
    On,
    /// The tile the flags describe, untimed.
    Off,
    /// As `on`, timed even where an earlier start's pick is kept (the new pick is kept).
    Retime,
}

/// How the tile kernels cut a pass's items into tiles (`tally_model::TilePacking`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TilePacking {
    /// Whole items while they fit a tile.
    WholeItems,
    /// Every tile full.
    Filled,
}

impl From<TilePacking> for tally_model::TilePacking {
    fn from(packing: TilePacking) -> Self {
        match packing {
            TilePacking::WholeItems => tally_model::TilePacking::WholeItems,
            TilePacking::Filled => tally_model::TilePacking::Filled,
        }
    }
}

/// How tensor-core tiles read their fragments (`tally_model::FragmentLoads`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FragmentLoads {
    /// `ldmatrix`: two fragments per instruction (`.trans` for the values).
    Ldmatrix,
    /// One shared-memory read per element.
    Elements,
}

impl From<FragmentLoads> for tally_model::FragmentLoads {
    fn from(loads: FragmentLoads) -> Self {
        match loads {
            FragmentLoads::Ldmatrix => tally_model::FragmentLoads::Ldmatrix,
            FragmentLoads::Elements => tally_model::FragmentLoads::Elements,
        }
    }
}

/// `--prefix-splits`: `whole`, `auto` or a number of parts (1 is `whole`).
fn prefix_splits(text: &str) -> Result<tally_model::PrefixSplits, String> {
    use tally_model::PrefixSplits;
    match text {
        "whole" => Ok(PrefixSplits::Whole),
        "auto" => Ok(PrefixSplits::Auto),
        _ => match text.parse::<usize>() {
            Ok(1) => Ok(PrefixSplits::Whole),
            Ok(parts) if (2..=PrefixSplits::MOST_PARTS).contains(&parts) => Ok(PrefixSplits::Parts(parts)),
            _ => Err(format!("expected `whole`, `auto` or a number of parts from 1 to {}", PrefixSplits::MOST_PARTS)),
        },
    }
}

/// One of the sizes `tally_model::TileShape` builds, as a number.
fn tile_size<const N: usize>(sizes: [&'static str; N]) -> impl clap::builder::TypedValueParser<Value = usize> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(sizes).map(|size| size.parse().expect("a listed size is a number"))
}

impl DeviceArgs {
    /// The model's routes these flags ask for (the backend says what it runs for them).
    pub fn routes(&self) -> tally_model::Routes {
        let attention = match self.attention() {
            Attention::Kernel | Attention::Auto => tally_model::AttentionRoute::Kernel,
            Attention::Tiled => tally_model::AttentionRoute::Tiled(self.tile()),
            Attention::Flash => tally_model::AttentionRoute::Flash(self.tile()),
            Attention::Cascade => tally_model::AttentionRoute::Cascade,
        };
        tally_model::Routes { attention, elementwise: self.elementwise().into(), ..Default::default() }
    }

    /// `--attention`, `auto` resolved for the backend.
    pub fn attention(&self) -> Attention {
        match (self.attention, self.backend) {
            (Attention::Auto, BackendKind::Cuda) => Attention::Flash,
            (Attention::Auto, BackendKind::Wgpu | BackendKind::Cpu) => Attention::Kernel,
            (asked, _) => asked,
        }
    }

    /// `--elementwise`, `auto` resolved for the backend.
    pub fn elementwise(&self) -> Elementwise {
        match (self.elementwise, self.backend) {
            // On CUDA (H200, bfloat16, S1): 4% faster than Burn's fused ops, and its warm-up
            // compiles a quarter of the kernels (`cuda_launches`).
            (Elementwise::Auto, BackendKind::Cpu | BackendKind::Cuda) => Elementwise::Kernels,
            (Elementwise::Auto, BackendKind::Wgpu) => Elementwise::Burn,
            (asked, _) => asked,
        }
    }

    /// `--fusion`, `auto` resolved for the backend and the elementwise route: whether the
    /// model runs through Burn's fusion layer (never on the CPU, which has none).
    pub fn fused(&self) -> bool {
        match (self.fusion, self.backend) {
            (_, BackendKind::Cpu) | (Fusion::Off, _) => false,
            (Fusion::On, _) => true,
            (Fusion::Auto, BackendKind::Cuda) => self.elementwise() == Elementwise::Burn,
            (Fusion::Auto, BackendKind::Wgpu) => true,
        }
    }

    /// `--matmul`, `auto` resolved for the backend (and, on CUDA, for whether cuBLASLt loads).
    pub fn matmul(&self) -> Matmul {
        match (self.matmul, self.backend) {
            (Matmul::Auto, BackendKind::Cuda) if cublas_loads() => Matmul::Cublas,
            (Matmul::Auto, _) => Matmul::Cubecl,
            (asked, _) => asked,
        }
    }

    /// `--matmul` as results name it: `cublas-sync` for cuBLASLt with host syncs, `cublas-algosN`
    /// with an algorithm search.
    pub fn matmul_label(&self) -> String {
        match (self.matmul(), self.cublas_ordering, self.cublas_algos) {
            (Matmul::Cublas, Some(CublasOrdering::Sync), _) => "cublas-sync".to_owned(),
            (Matmul::Cublas, _, Some(algos)) if algos > 1 => format!("cublas-algos{algos}"),
            (matmul, ..) => format!("{matmul:?}").to_lowercase(),
        }
    }

    /// `--flush-denormals`, unset resolved for the backend: on for CUDA.
    pub fn flush_denormals(&self) -> bool {
        self.flush_denormals.unwrap_or(self.backend == BackendKind::Cuda)
    }

    /// The tile kernels' tile (`--tile-rows`, `--tile-keys`, `--tile-stages`, `--fragment-loads`,
    /// `--kv-staging`, `--warp-rows`, `--tile-packing`, `--prefix-splits`).
    pub fn tile(&self) -> tally_model::TileShape {
        let cuda = self.backend == BackendKind::Cuda;
        // On CUDA the largest tile: 128 rows x 64 keys took one S1 layer's flash attention from
        // 3.43 ms (64x16) to 2.33 ms on an H200 in bfloat16, the fastest of the six measured.
        // Elsewhere 64x16, which fits lavapipe's 32 KiB of shared memory at head_dim 128.
        let (rows, keys) = if cuda { (128, 64) } else { (64, 16) };
        // On CUDA cp.async staging and 32 rows a warp (with denormals flushed): one S1 layer in
        // 1.531 ms on an H200 in bfloat16 against 1.634 for register read-ahead and 16 rows a
        // warp, S1 7,958 items/s against 7,485 (benches/results/gpu-h200-2026-11-27). Without
        // the flush, 32 rows a warp alone was slower (1.784 ms): keep the three together.
        let (staging, warp_rows) = if cuda { (KvStaging::CpAsync, 32) } else { (KvStaging::Registers, 16) };
        // Every size is among those the flags list, so the shape exists.
        let shape = tally_model::TileShape::new(self.tile_rows.unwrap_or(rows), self.tile_keys.unwrap_or(keys)).unwrap_or_default();
        let shape = shape.with_stages(self.tile_stages.unwrap_or(2)).unwrap_or(shape).with_loads(self.fragment_loads.unwrap_or(FragmentLoads::Ldmatrix).into());
        let shape = shape.with_staging(self.kv_staging.unwrap_or(staging).into()).with_packing(self.tile_packing.unwrap_or(TilePacking::WholeItems).into());
        let shape = shape.with_splits(self.prefix_splits.unwrap_or_default());
        shape.with_warp_rows(self.warp_rows.unwrap_or(warp_rows)).unwrap_or(shape)
    }

    /// Whether the flash kernel's tile is timed at start-up: `--tile-tuning`, `auto` resolved
    /// (on CUDA with `--attention flash` and no tile flag), never on the CPU (one kernel).
    pub fn tunes_tile(&self) -> bool {
        let tile_asked = self.tile_rows.is_some()
            || self.tile_keys.is_some()
            || self.tile_stages.is_some()
            || self.fragment_loads.is_some()
            || self.kv_staging.is_some()
            || self.warp_rows.is_some()
            || self.tile_packing.is_some();
        let flash_on_a_gpu = self.attention() == Attention::Flash && self.backend != BackendKind::Cpu;
        match self.tile_tuning {
            TileTuning::Off => false,
            TileTuning::On | TileTuning::Retime => flash_on_a_gpu,
            TileTuning::Auto => flash_on_a_gpu && self.backend == BackendKind::Cuda && !tile_asked,
        }
    }

    /// The tiles a tuning times ([`tile_candidates::candidates`]), [`Self::tile`] first,
    /// narrowed to those `--tile-candidates` names.
    pub fn tuning_candidates(&self) -> Result<Vec<TileCandidate>> {
        let backend = format!("{:?}", self.backend).to_lowercase();
        tile_candidates::select(tile_candidates::candidates(self.tile(), self.backend == BackendKind::Cuda), self.tile_candidates, &backend)
    }
}

/// Code generic over the backend, run with the backend the user picked.
pub trait WithBackend {
    type Output;
    fn run<B: tally_model::ScoringBackend>(self, device: B::Device) -> Result<Self::Output>;
}

pub fn dispatch<T: WithBackend>(device: DeviceArgs, job: T) -> Result<T::Output> {
    let DeviceArgs { backend, dtype, .. } = device;
    pick_matmul(&device)?;
    tally_model::set_wide_products_in_float32(device.cascade_scores == CascadeScores::Float32);
    if device.flush_denormals() {
        anyhow::ensure!(backend == BackendKind::Cuda, "--flush-denormals is an NVRTC option: it needs --backend cuda");
        #[cfg(feature = "cuda")]
        tally_model::cuda::set_flush_denormals(true);
    }
    // wgpu keeps fusion: its default elementwise route is Burn's ops, which fusion merges, and
    // an unfused wgpu would compile the whole engine once more in every build.
    anyhow::ensure!(device.fused() || backend != BackendKind::Wgpu, "--fusion off needs --backend cuda (wgpu runs through Burn's fusion)");
    anyhow::ensure!(device.fusion == Fusion::Auto || backend != BackendKind::Cpu, "--fusion applies to the GPU backends: the CPU backend has no fusion layer");
    match (backend, dtype) {
        #[cfg(feature = "ndarray")]
        (BackendKind::Cpu, DType::Float32) => job.run::<burn::backend::NdArray<f32>>(Default::default()),
        #[cfg(feature = "wgpu")]
        (BackendKind::Wgpu, DType::Float32) => on_gpu(backend, || job.run::<burn::backend::Wgpu<f32>>(Default::default())),
        #[cfg(feature = "cuda")]
        (BackendKind::Cuda, DType::Float32) if device.fused() => on_gpu(backend, || job.run::<burn::backend::Cuda<f32>>(Default::default())),
        #[cfg(feature = "cuda")]
        (BackendKind::Cuda, DType::Float32) => on_gpu(backend, || job.run::<tally_model::cuda::Unfused<f32>>(Default::default())),
        #[cfg(feature = "cuda")]
        (BackendKind::Cuda, DType::Bfloat16) if device.fused() => on_gpu(backend, || job.run::<burn::backend::Cuda<half::bf16>>(Default::default())),
        #[cfg(feature = "cuda")]
        (BackendKind::Cuda, DType::Bfloat16) => on_gpu(backend, || job.run::<tally_model::cuda::Unfused<half::bf16>>(Default::default())),
        (backend, DType::Bfloat16) if backend.is_compiled() => anyhow::bail!("--dtype bfloat16 needs --backend cuda; {backend:?} computes in float32"),
        (backend, _) => anyhow::bail!(
            "this tally was built without the {backend:?} backend; rebuild with `--features {}`",
            match backend {
                BackendKind::Cpu => "ndarray",
                BackendKind::Wgpu => "wgpu",
                BackendKind::Cuda => "cuda",
            }
        ),
    }
}

/// Sets the process's matmul route, or says why `--matmul block` or `--matmul cublas` cannot
/// run on this backend.
fn pick_matmul(device: &DeviceArgs) -> Result<()> {
    let (backend, matmul) = (device.backend, device.matmul());
    anyhow::ensure!(matmul == Matmul::Cublas || device.cublas_ordering.is_none(), "--cublas-ordering applies to --matmul cublas only");
    anyhow::ensure!(matmul == Matmul::Cublas || device.cublas_algos.is_none(), "--cublas-algos applies to --matmul cublas only");
    match matmul {
        Matmul::Cubecl | Matmul::Auto => return Ok(()),
        Matmul::Block => {
            anyhow::ensure!(backend != BackendKind::Cpu, "--matmul block is a GPU kernel: it needs --backend wgpu or cuda");
            tally_model::set_matmul_route(tally_model::MatmulRoute::Block);
            return Ok(());
        }
        Matmul::Cublas => {}
    }
    anyhow::ensure!(backend == BackendKind::Cuda, "--matmul cublas needs --backend cuda");
    #[cfg(feature = "cuda")]
    {
        anyhow::ensure!(
            tally_model::cublas::available(),
            "--matmul cublas: libcublasLt could not be loaded; put the CUDA toolkit's lib directory on LD_LIBRARY_PATH"
        );
        tally_model::set_matmul_route(tally_model::MatmulRoute::Cublas);
        tally_model::cublas::set_ordering(match device.cublas_ordering.unwrap_or(CublasOrdering::Stream) {
            CublasOrdering::Stream => tally_model::cublas::CublasOrdering::Stream,
            CublasOrdering::Sync => tally_model::cublas::CublasOrdering::HostSync,
        });
        tally_model::cublas::set_algo_candidates(device.cublas_algos.map_or(1, usize::from));
    }
    Ok(())
}

/// Whether cuBLASLt can be loaded (`--matmul auto` takes it on CUDA only then).
fn cublas_loads() -> bool {
    #[cfg(feature = "cuda")]
    return tally_model::cublas::available();
    #[cfg(not(feature = "cuda"))]
    false
}

impl BackendKind {
    fn is_compiled(self) -> bool {
        match self {
            BackendKind::Cpu => cfg!(feature = "ndarray"),
            BackendKind::Wgpu => cfg!(feature = "wgpu"),
            BackendKind::Cuda => cfg!(feature = "cuda"),
        }
    }
}

/// GPU runtimes panic when no device or driver is present (cubecl-wgpu without an adapter,
/// cudarc without libcuda), sometimes on a runtime thread. Turn that into an error that says so.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn on_gpu<R>(kind: BackendKind, job: impl FnOnce() -> Result<R>) -> Result<R> {
    use std::sync::{Arc, Mutex};

    let first_panic = Arc::new(Mutex::new(None::<String>));
    let recorder = Arc::clone(&first_panic);
    std::panic::set_hook(Box::new(move |info| {
        let message = info.payload().downcast_ref::<String>().cloned().or_else(|| info.payload().downcast_ref::<&str>().map(|s| s.to_string()));
        recorder.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(message.unwrap_or_else(|| info.to_string()));
    }));
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
    let _ = std::panic::take_hook();
    outcome.unwrap_or_else(|_| {
        let reason = first_panic.lock().unwrap_or_else(|e| e.into_inner()).take().unwrap_or_default();
        anyhow::bail!("the {kind:?} backend failed to start or run (is a GPU and its driver available? try --backend cpu): {reason}")
    })
}

/// What the numbers ran on: the GPU's name from nvidia-smi where there is one, else the CPU's.
pub fn device_name(backend: BackendKind) -> String {
    let gpu = std::process::Command::new("nvidia-smi").args(["--query-gpu=name", "--format=csv,noheader"]).output().ok();
    let gpu = gpu.filter(|o| o.status.success()).map(|o| String::from_utf8_lossy(&o.stdout).lines().next().unwrap_or("").trim().to_owned());
    match (backend, gpu) {
        (BackendKind::Cpu, _) | (_, None) => tally_bench::report::cpu_name(),
        (_, Some(gpu)) => gpu,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auto(backend: BackendKind) -> DeviceArgs {
        DeviceArgs {
            backend,
            dtype: DType::Bfloat16,
            attention: Attention::Auto,
            matmul: Matmul::Auto,
            cublas_ordering: None,
            cublas_algos: None,
            cascade_scores: CascadeScores::Float32,
            elementwise: Elementwise::Auto,
            fusion: Fusion::Auto,
            weights: Weights::Compact,
            tile_rows: None,
            tile_keys: None,
            tile_stages: None,
            fragment_loads: None,
            kv_staging: None,
            warp_rows: None,
            tile_packing: None,
            prefix_splits: None,
            tile_tuning: TileTuning::Auto,
            tile_candidates: None,
            flush_denormals: None,
        }
    }

    /// `auto` is what the GPU runs measured fastest on CUDA, and what it always was elsewhere.
    #[test]
    fn auto_routes_resolve_per_backend() {
        let cuda = auto(BackendKind::Cuda);
        assert_eq!((cuda.attention(), cuda.elementwise()), (Attention::Flash, Elementwise::Kernels));
        assert_eq!(cuda.tile().to_string(), "128x64, 2 stages, ldmatrix, cp-async, 32 rows a warp");
        assert!(cuda.flush_denormals());
        assert_eq!(cuda.routes().attention, tally_model::AttentionRoute::Flash(cuda.tile()));
        // cuBLASLt only where it loads: never in a build without CUDA.
        assert_eq!(cuda.matmul(), if cublas_loads() { Matmul::Cublas } else { Matmul::Cubecl });
        for (backend, elementwise) in [(BackendKind::Wgpu, Elementwise::Burn), (BackendKind::Cpu, Elementwise::Kernels)] {
            let args = auto(backend);
            assert_eq!((args.attention(), args.matmul(), args.elementwise()), (Attention::Kernel, Matmul::Cubecl, elementwise), "{backend:?}");
            assert_eq!(args.tile().to_string(), "64x16, 2 stages, ldmatrix", "{backend:?}");
            assert!(!args.flush_denormals(), "{backend:?}");
            assert_eq!(args.routes().attention, tally_model::AttentionRoute::Kernel, "{backend:?}");
        }
    }

    /// A route or tile size asked for is what runs, on CUDA too.
    #[test]
    fn explicit_choices_win_over_auto() {
        let asked = DeviceArgs { attention: Attention::Kernel, matmul: Matmul::Cubecl, elementwise: Elementwise::Burn, tile_rows: Some(64), kv_staging: Some(KvStaging::Registers), warp_rows: Some(16), flush_denormals: Some(false), ..auto(BackendKind::Cuda) };
        assert_eq!((asked.attention(), asked.matmul(), asked.elementwise()), (Attention::Kernel, Matmul::Cubecl, Elementwise::Burn));
        assert_eq!(asked.tile().to_string(), "64x64, 2 stages, ldmatrix", "the keys not asked for keep CUDA's default");
        assert!(!asked.flush_denormals());
        let elsewhere = DeviceArgs { kv_staging: Some(KvStaging::CpAsync), warp_rows: Some(32), tile_packing: Some(TilePacking::Filled), ..auto(BackendKind::Wgpu) };
        assert_eq!(elsewhere.tile().to_string(), "64x16, 2 stages, ldmatrix, cp-async, 32 rows a warp, filled tiles");
        let split = DeviceArgs { prefix_splits: Some(tally_model::PrefixSplits::Auto), ..auto(BackendKind::Cuda) };
        assert_eq!(split.tile().to_string(), "128x64, 2 stages, ldmatrix, cp-async, 32 rows a warp, prefix split auto");
        assert!(split.tunes_tile(), "the split is planned per launch, not a tile to time");
        assert_eq!(asked.matmul_label(), "cubecl");
        let cublas = |cublas_ordering, cublas_algos| DeviceArgs { matmul: Matmul::Cublas, cublas_ordering, cublas_algos, ..auto(BackendKind::Cuda) }.matmul_label();
        assert_eq!(cublas(None, Some(8)), "cublas-algos8");
        assert_eq!(cublas(None, Some(1)), "cublas", "one candidate is no search");
        assert_eq!(cublas(Some(CublasOrdering::Sync), None), "cublas-sync");
    }

    /// `--prefix-splits`: `whole`, `auto`, or 1 to 16 parts (1 is whole); anything else is refused.
    #[test]
    fn prefix_splits_parse_as_spelled() {
        use tally_model::PrefixSplits;
        for (text, splits) in [("whole", PrefixSplits::Whole), ("auto", PrefixSplits::Auto), ("1", PrefixSplits::Whole), ("2", PrefixSplits::Parts(2)), ("16", PrefixSplits::Parts(16))] {
            assert_eq!(prefix_splits(text), Ok(splits), "{text}");
        }
        for text in ["0", "17", "two", ""] {
            assert!(prefix_splits(text).is_err(), "{text}");
        }
    }

    /// CUDA times its flash tiles unless a tile flag says which; `on` times them on wgpu too;
    /// nothing is timed off the flash route or on the CPU. The candidates start with the tile
    /// the flags describe.
    #[test]
    fn the_flash_tile_is_tuned_on_cuda_unless_a_tile_is_asked_for() {
        let cuda = auto(BackendKind::Cuda);
        assert!(cuda.tunes_tile());
        assert!(!DeviceArgs { tile_tuning: TileTuning::Off, ..cuda }.tunes_tile());
        assert!(!DeviceArgs { attention: Attention::Cascade, ..cuda }.tunes_tile());
        assert!(!DeviceArgs { attention: Attention::Cascade, tile_tuning: TileTuning::On, ..cuda }.tunes_tile());
        for asked in [
            DeviceArgs { tile_rows: Some(64), ..cuda },
            DeviceArgs { tile_keys: Some(32), ..cuda },
            DeviceArgs { tile_stages: Some(2), ..cuda },
            DeviceArgs { fragment_loads: Some(FragmentLoads::Ldmatrix), ..cuda },
            DeviceArgs { kv_staging: Some(KvStaging::CpAsync), ..cuda },
            DeviceArgs { warp_rows: Some(32), ..cuda },
            DeviceArgs { tile_packing: Some(TilePacking::WholeItems), ..cuda },
        ] {
            assert!(!asked.tunes_tile(), "{asked:?}");
            assert!(DeviceArgs { tile_tuning: TileTuning::On, ..asked }.tunes_tile(), "{asked:?}");
            assert!(DeviceArgs { tile_tuning: TileTuning::Retime, ..asked }.tunes_tile(), "{asked:?}");
        }
        let wgpu = DeviceArgs { attention: Attention::Flash, ..auto(BackendKind::Wgpu) };
        assert!(!wgpu.tunes_tile());
        assert!(DeviceArgs { tile_tuning: TileTuning::On, ..wgpu }.tunes_tile());
        assert!(!DeviceArgs { attention: Attention::Cascade, tile_tuning: TileTuning::Retime, ..wgpu }.tunes_tile(), "retime times the flash kernel's tiles only");
        assert!(!DeviceArgs { attention: Attention::Flash, tile_tuning: TileTuning::On, ..auto(BackendKind::Cpu) }.tunes_tile());

        let names: Vec<String> = cuda.tuning_candidates().unwrap().iter().map(|candidate| candidate.tile.to_string()).collect();
        assert_eq!(
            names,
            [
                "128x64, 2 stages, ldmatrix, cp-async, 32 rows a warp",
                "128x64, 2 stages, ldmatrix, cp-async, 32 rows a warp, filled tiles",
                "128x64, 2 stages, ldmatrix, cp-async-split, 32 rows a warp",
                "128x64, 3 stages, ldmatrix, cp-async, filled tiles",
                "64x32, 2 stages, ldmatrix, cp-async, filled tiles",
                "64x32, 3 stages, ldmatrix, cp-async, filled tiles",
            ]
        );
        let names: Vec<String> = wgpu.tuning_candidates().unwrap().iter().map(|candidate| candidate.tile.to_string()).collect();
        assert_eq!(names, ["64x16, 2 stages, ldmatrix", "64x16, 2 stages, ldmatrix, filled tiles", "32x32, 2 stages, ldmatrix"]);
    }

    /// Fusion stays out of CUDA's way where tally's kernels do the elementwise steps, and merges
    /// Burn's elsewhere; asked for, it is what runs; off is CUDA's alone, and the CPU has none.
    #[test]
    fn fusion_is_off_on_cuda_with_the_elementwise_kernels_only() {
        assert!(!auto(BackendKind::Cuda).fused());
        assert!(DeviceArgs { elementwise: Elementwise::Burn, ..auto(BackendKind::Cuda) }.fused());
        assert!(DeviceArgs { fusion: Fusion::On, ..auto(BackendKind::Cuda) }.fused());
        assert!(!DeviceArgs { fusion: Fusion::Off, elementwise: Elementwise::Burn, ..auto(BackendKind::Cuda) }.fused());
        assert!(auto(BackendKind::Wgpu).fused());
        assert!(!auto(BackendKind::Cpu).fused());

        struct Unreached;
        impl WithBackend for Unreached {
            type Output = ();
            fn run<B: tally_model::ScoringBackend>(self, _: B::Device) -> Result<()> {
                unreachable!("refused before a backend is picked")
            }
        }
        let refused = |args: DeviceArgs| dispatch(DeviceArgs { dtype: DType::Float32, matmul: Matmul::Cubecl, ..args }, Unreached).unwrap_err().to_string();
        assert_eq!(refused(DeviceArgs { fusion: Fusion::Off, ..auto(BackendKind::Wgpu) }), "--fusion off needs --backend cuda (wgpu runs through Burn's fusion)");
        assert_eq!(refused(DeviceArgs { fusion: Fusion::On, ..auto(BackendKind::Cpu) }), "--fusion applies to the GPU backends: the CPU backend has no fusion layer");
    }
}
