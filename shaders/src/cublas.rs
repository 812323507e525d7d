//! cuBLASLt for the CUDA build's matmuls (feature `cublas`, route [`MatmulRoute::Cublas`]).
//!
//! cubek 0.2's tiled matmuls emit Ampere-style `mma.sync` and reach a fraction of a Hopper's
//! tensor-core rate; cuBLASLt picks wgmma kernels there. The operands stay CubeCL tensors: their
//! device pointers are read from CubeCL's storage and the product is written into a tensor CubeCL
//! allocated, in the same (primary) context.
//!
//! Ordering ([`CublasOrdering`], `--cublas-ordering`): by default each GEMM is enqueued on the
//! very CUDA stream CubeCL launches on, through the vendored cubecl-cuda's
//! `CudaServer::enqueue_foreign` (`vendor/README.md`), so the stream orders it with CubeCL's
//! kernels and the host never waits. The other way needs no patch: wait for CubeCL's queued work
//! (`client.sync()`), run on a stream of tally's, wait for the GEMM — two host syncs a GEMM,
//! each leaving the GPU idle until the host has issued the next work. [`profile_table`] times
//! both (CUDA events on the shared stream; host time around the synced ones).
//!
//! Plans (descriptor, layouts, algorithm) are cached per shape and stride; the workspace
//! (32 MiB) is allocated once. The algorithm is the heuristic's first, or with
//! [`set_algo_candidates`] (`--cublas-algos N`) the fastest of its first `N`, timed on the
//! first GEMM of each shape class (`m` rounded up to a power of two) and reused for the class:
//! on an H200 the heuristic's pick for the fused q/k/v projection (10,000 × 4,096 × 1,024) ran
//! at 296 TFLOP/s where gate/up ran at 650. float32 runs with `CUBLAS_COMPUTE_32F` (no tf32);
//! bfloat16 and float16 read 16-bit operands and accumulate in float32.

use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use burn_backend::{calculate_matmul_output, DType, TensorMetadata};
use burn_cubecl::cubecl::cuda::CudaRuntime;
use burn_cubecl::cubecl::device::Device;
use burn_cubecl::cubecl::device_handle::DeviceHandle;
use burn_cubecl::cubecl::future::block_on;
use burn_cubecl::cubecl::stream_id::StreamId;
use burn_cubecl::cubecl::Runtime;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cudarc::cublaslt::{result as lt, sys};

use crate::blas_layout::{blas_layout, BlasLayout};
use cudarc::driver::{result as driver, sys as driver_sys, CudaContext, CudaStream, DriverError};

const WORKSPACE_BYTES: usize = 32 << 20;

/// Why cuBLASLt did not multiply: a shape it is not given (the caller's matmul runs instead),
/// or a library or driver failure.
#[derive(Debug, thiserror::Error)]
pub enum CublasError {
    #[error("cuBLASLt route declines this matmul: {0}")]
    Declined(&'static str),
    #[error("libcublasLt could not be loaded (is the CUDA toolkit's lib directory on LD_LIBRARY_PATH?)")]
    LibraryMissing,
    #[error("cuBLASLt failed: {0}")]
    Library(#[from] lt::CublasError),
    #[error("CUDA driver call failed: {0}")]
    Driver(#[from] DriverError),
    #[error("CubeCL failed to settle the operands: {0}")]
    CubeCl(String),
}

/// How a cuBLASLt GEMM is ordered with the CubeCL kernels around it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CublasOrdering {
    /// Enqueued on CubeCL's own stream (the vendored cubecl-cuda's `enqueue_foreign`): the
    /// stream orders it, no host sync. The process's ordering until [`set_ordering`] says otherwise.
    Stream,
    /// CubeCL's queue drained, the GEMM run on a stream of tally's and waited for: two host
    /// syncs a GEMM, no patch needed.
    HostSync,
}

static HOST_SYNC: AtomicBool = AtomicBool::new(false);

/// Picks how every later GEMM of the process is ordered.
pub fn set_ordering(ordering: CublasOrdering) {
    HOST_SYNC.store(ordering == CublasOrdering::HostSync, Ordering::Relaxed);
}

pub fn ordering() -> CublasOrdering {
    if HOST_SYNC.load(Ordering::Relaxed) {
        CublasOrdering::HostSync
    } else {
        CublasOrdering::Stream
    }
}

/// Most heuristic algorithms [`set_algo_candidates`] times for a shape class.
pub const MAX_ALGO_CANDIDATES: usize = 16;

static ALGO_CANDIDATES: AtomicUsize = AtomicUsize::new(1);

/// How many of cuBLASLt's heuristic algorithms each later shape class times before keeping the
/// fastest (1, the process's default: the heuristic's first, untimed; at most
/// [`MAX_ALGO_CANDIDATES`]).
pub fn set_algo_candidates(count: usize) {
    ALGO_CANDIDATES.store(count.clamp(1, MAX_ALGO_CANDIDATES), Ordering::Relaxed);
}

pub fn algo_candidates() -> usize {
    ALGO_CANDIDATES.load(Ordering::Relaxed)
}

/// Whether libcublasLt can be loaded on this machine.
pub fn available() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { sys::is_culib_present() }
}

/// `lhs · rhs` by cuBLASLt, batched over equal leading dimensions (no broadcasting), into a new
/// contiguous tensor of `out` (the operands' dtype, or float32: the float32 accumulators written
/// as they are, for products such as attention scores that a 16-bit rounding would blur).
/// Operands whose last two dimensions are neither row- nor column-major are copied contiguous first.
pub fn matmul(lhs: CubeTensor<CudaRuntime>, rhs: CubeTensor<CudaRuntime>, out: DType) -> Result<CubeTensor<CudaRuntime>, CublasError> {
    let dtype = lhs.dtype;
    if rhs.dtype != dtype {
        return Err(CublasError::Declined("operands of different float types"));
    }
    let cuda_type = |dtype: DType| match dtype {
        DType::F32 => Ok(sys::cudaDataType::CUDA_R_32F),
        DType::BF16 => Ok(sys::cudaDataType::CUDA_R_16BF),
        DType::F16 => Ok(sys::cudaDataType::CUDA_R_16F),
        _ => Err(CublasError::Declined("not a float32/bfloat16/float16 matmul")),
    };
    let data_type = cuda_type(dtype)?;
    if out != dtype && out != DType::F32 {
        return Err(CublasError::Declined("a product neither in the operands' dtype nor in float32"));
    }
    let out_type = cuda_type(out)?;
    let (lhs_shape, rhs_shape) = (lhs.shape(), rhs.shape());
    let rank = lhs_shape.num_dims();
    if rank < 2 || rhs_shape.num_dims() != rank || lhs_shape[..rank - 2] != rhs_shape[..rank - 2] {
        return Err(CublasError::Declined("batch dimensions differ (broadcast)"));
    }
    let (m, k, n) = (lhs_shape[rank - 2], lhs_shape[rank - 1], rhs_shape[rank - 1]);
    if m == 0 || n == 0 || k == 0 {
        return Err(CublasError::Declined("an empty dimension"));
    }
    let batch: usize = lhs_shape[..rank - 2].iter().product();
    let (lhs, rhs) = (Operand::of(lhs), Operand::of(rhs));
    let out_shape = calculate_matmul_output(&lhs.tensor.shape(), &rhs.tensor.shape()).expect("shapes checked above");
    let out = empty_device_contiguous_dtype(lhs.tensor.client.clone(), lhs.tensor.device.clone(), out_shape, out);

    // Column-major cuBLAS computes the row-major product as outᵀ (n × m) = rhsᵀ · lhsᵀ.
    let out_strides = out.meta.strides();
    let key = PlanKey {
        data_type,
        out_type,
        m,
        n,
        k,
        batch,
        a: rhs.cublas(k, n),
        b: lhs.cublas(m, k),
        ldc: out_strides[rank - 2] as i64,
        batch_stride_c: if batch > 1 { out_strides[rank - 3] as i64 } else { 0 },
    };

    let engine = engine(out.device.index)?;
    let cubecl_failed = |e: &dyn std::fmt::Debug| CublasError::CubeCl(format!("{e:?}"));
    match ordering() {
        CublasOrdering::Stream => {
            // The stream CubeCL launches this thread's work on; the task may run on its server's thread.
            let stream_id = StreamId::current();
            let bindings = [&rhs.tensor, &lhs.tensor, &out].map(|tensor| tensor.handle.clone().binding()).to_vec();
            DeviceHandle::<<CudaRuntime as Runtime>::Server>::new(out.device.to_id())
                .submit_blocking(move |server| {
                    server.enqueue_foreign(stream_id, bindings, |stream, pointers| {
                        let mut engine = engine.lock().unwrap_or_else(|e| e.into_inner());
                        engine.run(&key, [pointers[0], pointers[1], pointers[2]], On::Stream(stream))
                    })
                })
                .map_err(|e| cubecl_failed(&e))?
                .map_err(|e| cubecl_failed(&e))??;
        }
        CublasOrdering::HostSync => {
            let client = out.client.clone();
            block_on(client.sync()).map_err(|e| cubecl_failed(&e))?;
            let pointer = |tensor: &CubeTensor<CudaRuntime>| client.get_resource(tensor.handle.clone()).map(|r| r.resource().ptr).map_err(|e| cubecl_failed(&e));
            let pointers = [pointer(&rhs.tensor)?, pointer(&lhs.tensor)?, pointer(&out)?];
            engine.lock().unwrap_or_else(|e| e.into_inner()).run(&key, pointers, On::OwnStreamWaited)?;
        }
    }
    Ok(out)
}

/// Where a GEMM runs.
enum On {
    /// CubeCL's stream, not waited for.
    Stream(driver_sys::CUstream),
    /// The engine's own stream, waited for before returning.
    OwnStreamWaited,
}

/// An operand and how cuBLAS reads it, after a contiguous copy if it could not as it was.
struct Operand {
    tensor: CubeTensor<CudaRuntime>,
    layout: BlasLayout,
}

impl Operand {
    fn of(tensor: CubeTensor<CudaRuntime>) -> Self {
        let read = |tensor: &CubeTensor<CudaRuntime>| blas_layout(tensor.meta.shape(), tensor.meta.strides());
        match read(&tensor) {
            Some(layout) => Operand { tensor, layout },
            None => {
                let tensor = into_contiguous(tensor);
                let layout = read(&tensor).expect("a contiguous tensor is row-major");
                Operand { tensor, layout }
            }
        }
    }

    /// The operand as cuBLAS sees it, for a row-major `rows × cols` matrix: its transpose in
    /// column-major order, read directly (row-major) or through `CUBLAS_OP_T` (column-major).
    fn cublas(&self, rows: usize, cols: usize) -> CublasOperand {
        let BlasLayout { row_major, leading, batch_stride } = self.layout;
        let (layout_rows, layout_cols) = if row_major { (cols, rows) } else { (rows, cols) };
        CublasOperand { transpose: !row_major, rows: layout_rows as u64, cols: layout_cols as u64, leading: leading as i64, batch_stride: batch_stride as i64 }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct CublasOperand {
    transpose: bool,
    rows: u64,
    cols: u64,
    leading: i64,
    batch_stride: i64,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct PlanKey {
    /// The operands'.
    data_type: sys::cudaDataType,
    /// The product's.
    out_type: sys::cudaDataType,
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    a: CublasOperand,
    b: CublasOperand,
    ldc: i64,
    batch_stride_c: i64,
}

impl PlanKey {
    /// The GEMMs that share this one's timed algorithm: the same but for `m` (the pass's rows,
    /// new with nearly every batch size), which is rounded up to a power of two.
    fn class(&self) -> ShapeClass {
        ShapeClass { data_type: self.data_type, out_type: self.out_type, n: self.n, k: self.k, batch: self.batch, a: self.a, b_transpose: self.b.transpose, b_leading: self.b.leading, m_class: self.m.next_power_of_two() }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct ShapeClass {
    data_type: sys::cudaDataType,
    out_type: sys::cudaDataType,
    n: usize,
    k: usize,
    batch: usize,
    a: CublasOperand,
    b_transpose: bool,
    b_leading: i64,
    m_class: usize,
}

/// One shape class's algorithm search, on its first GEMM: each candidate's mean time, in the
/// heuristic's order (`None`: it declined to run), and the one kept.
struct AlgoSearch {
    dims: Dims,
    times_ms: Vec<Option<f32>>,
    chosen: usize,
}

/// Runs of each candidate an algorithm search times, after one untimed run.
const SEARCH_RUNS: usize = 3;

/// One cuBLASLt handle, stream, workspace and plan cache per device. The workspace is shared by
/// every GEMM: those on CubeCL's stream follow each other there, the synced ones are waited for.
struct Engine {
    context: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    handle: sys::cublasLtHandle_t,
    workspace: u64,
    plans: HashMap<PlanKey, Plan>,
    /// The algorithm each searched shape class keeps.
    chosen: HashMap<ShapeClass, sys::cublasLtMatmulAlgo_t>,
    searches: Vec<AlgoSearch>,
    profile: HashMap<Dims, ShapeTimes>,
    timed: EventTimes,
}

/// m, n, k, batch.
type Dims = (usize, usize, usize, usize);

/// Times of GEMMs the host does not wait for: a pair of events around each, read once both
/// have completed (checked without blocking before each GEMM, waited for by the profile), then
/// reused: as many pairs as GEMMs in flight.
#[derive(Default)]
struct EventTimes {
    in_flight: VecDeque<(Dims, driver_sys::CUevent, driver_sys::CUevent)>,
    free: Vec<driver_sys::CUevent>,
}

// SAFETY: the handle, plans and events are only used under the engine's mutex.
unsafe impl Send for Engine {}

struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    c: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
}

#[derive(Default)]
struct ShapeTimes {
    calls: u64,
    gemm: Duration,
}

/// The engines made so far, by device index; each lives for the process.
static ENGINES: OnceLock<Mutex<HashMap<usize, &'static Mutex<Engine>>>> = OnceLock::new();

fn engine(device: usize) -> Result<&'static Mutex<Engine>, CublasError> {
    let mut engines = ENGINES.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(engine) = engines.get(&device) {
        return Ok(engine);
    }
    if !available() {
        return Err(CublasError::LibraryMissing);
    }
    let context = CudaContext::new(device)?;
    let stream = context.new_stream()?;
    let handle = lt::create_handle()?;
    // SAFETY: a plain device allocation in the current (primary) context, kept for the process.
    let workspace = unsafe { driver::malloc_sync(WORKSPACE_BYTES) }?;
    let engine: &'static Mutex<Engine> = Box::leak(Box::new(Mutex::new(Engine { context, stream, handle, workspace, plans: HashMap::new(), chosen: HashMap::new(), searches: Vec::new(), profile: HashMap::new(), timed: EventTimes::default() })));
    engines.insert(device, engine);
    Ok(engine)
}

impl Engine {
    /// `c = b · a` in cuBLAS's column-major terms (the row-major `lhs · rhs`), pointers `[a, b, c]`.
    fn run(&mut self, key: &PlanKey, [a, b, c]: [u64; 3], on: On) -> Result<(), CublasError> {
        self.context.bind_to_thread()?;
        let stream = match on {
            On::Stream(stream) => stream,
            On::OwnStreamWaited => self.stream.cu_stream(),
        };
        if !self.plans.contains_key(key) {
            let plan = self.plan(key, [a, b, c], stream)?;
            self.plans.insert(*key, plan);
        }
        let dims = (key.m, key.n, key.k, key.batch);
        let start = Instant::now();
        let events = match on {
            On::Stream(stream) => {
                self.read_finished_times(false)?;
                let (begin, end) = (self.event()?, self.event()?);
                // SAFETY: live events of this context, recorded on a stream of it.
                unsafe { driver::event::record(begin, stream) }?;
                Some((begin, end))
            }
            On::OwnStreamWaited => None,
        };
        self.gemm(&self.plans[key], [a, b, c], stream)?;
        self.profile.entry(dims).or_default().calls += 1;
        match events {
            Some((begin, end)) => {
                // SAFETY: as above.
                unsafe { driver::event::record(end, stream) }?;
                self.timed.in_flight.push_back((dims, begin, end));
            }
            None => {
                self.stream.synchronize()?;
                self.profile.entry(dims).or_default().gemm += start.elapsed();
            }
        }
        Ok(())
    }

    /// An event from the pool, or a new one.
    fn event(&mut self) -> Result<driver_sys::CUevent, CublasError> {
        match self.timed.free.pop() {
            Some(event) => Ok(event),
            None => Ok(driver::event::create(driver_sys::CUevent_flags::CU_EVENT_DEFAULT)?),
        }
    }

    /// Adds the times of the GEMMs whose end event has completed (all of them, waiting, with
    /// `wait`) to the profile, and returns their events to the pool.
    fn read_finished_times(&mut self, wait: bool) -> Result<(), CublasError> {
        while let Some(&(dims, begin, end)) = self.timed.in_flight.front() {
            // SAFETY: events of this engine's context, recorded and not yet returned to the pool.
            unsafe {
                if wait {
                    driver::event::synchronize(end)?;
                } else {
                    match driver::event::query(end) {
                        Ok(()) => {}
                        // Not yet; the GEMMs behind it are later on the same stream.
                        Err(DriverError(driver_sys::CUresult::CUDA_ERROR_NOT_READY)) => break,
                        Err(failure) => return Err(failure.into()),
                    }
                }
                let ms = driver::event::elapsed(begin, end)?;
                self.profile.entry(dims).or_default().gemm += Duration::from_secs_f64(f64::from(ms) / 1e3);
            }
            self.timed.in_flight.pop_front();
            self.timed.free.extend([begin, end]);
        }
        Ok(())
    }

    fn gemm(&self, plan: &Plan, [a, b, c]: [u64; 3], stream: driver_sys::CUstream) -> Result<(), CublasError> {
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the plan's layouts describe the three CubeCL buffers (alive until this GEMM has
        // run: the caller holds them until it returns, and memory CubeCL frees is reused only
        // by work queued after it on the same stream, or after the host sync); the workspace is
        // ours; the stream belongs to the current context.
        unsafe {
            lt::matmul(
                self.handle,
                plan.desc,
                (&alpha as *const f32).cast(),
                (&beta as *const f32).cast(),
                a as *const c_void,
                plan.a,
                b as *const c_void,
                plan.b,
                c as *const c_void,
                plan.c,
                c as *mut c_void,
                plan.c,
                &plan.algo,
                self.workspace as *mut c_void,
                WORKSPACE_BYTES,
                stream as sys::cudaStream_t,
            )?;
        }
        Ok(())
    }

    /// The plan for `key`'s GEMMs: descriptors, and the algorithm of its class, searched for on
    /// this GEMM's buffers (on `stream`, waited for) where the class is new and
    /// [`algo_candidates`] asks for a search.
    fn plan(&mut self, key: &PlanKey, pointers: [u64; 3], stream: driver_sys::CUstream) -> Result<Plan, CublasError> {
        let mut plan = self.describe(key)?;
        match self.algorithm(key, &plan, pointers, stream) {
            Ok(algo) => {
                plan.algo = algo;
                Ok(plan)
            }
            Err(failure) => {
                // Nothing keeps a plan that cannot run: free its descriptors.
                // SAFETY: descriptors made for this plan alone, not used again.
                let _ = unsafe { (lt::destroy_matrix_layout(plan.a), lt::destroy_matrix_layout(plan.b), lt::destroy_matrix_layout(plan.c), lt::destroy_matmul_desc(plan.desc)) };
                Err(failure)
            }
        }
    }

    /// `key`'s algorithm: its class's searched one where cuBLASLt accepts it for this exact
    /// shape, else the heuristic's first, or the fastest of its first [`algo_candidates`] on a
    /// class not searched yet.
    fn algorithm(&mut self, key: &PlanKey, plan: &Plan, pointers: [u64; 3], stream: driver_sys::CUstream) -> Result<sys::cublasLtMatmulAlgo_t, CublasError> {
        let class = key.class();
        let searched = self.chosen.get(&class).copied();
        if let Some(algo) = searched {
            if self.accepts(plan, &algo) {
                return Ok(algo);
            }
        }
        let wanted = if searched.is_some() { 1 } else { algo_candidates() };
        let candidates = self.heuristics(plan, wanted)?;
        if candidates.len() < 2 {
            return Ok(candidates[0].algo);
        }
        let mut times_ms = Vec::with_capacity(candidates.len());
        for candidate in &candidates {
            times_ms.push(self.time(&Plan { algo: candidate.algo, ..*plan }, pointers, stream)?);
        }
        // The heuristic's first wins ties and stands in if none ran.
        let chosen = (0..times_ms.len()).filter(|&i| times_ms[i].is_some()).min_by(|&i, &j| times_ms[i].partial_cmp(&times_ms[j]).unwrap_or(std::cmp::Ordering::Equal)).unwrap_or(0);
        self.chosen.insert(class, candidates[chosen].algo);
        self.searches.push(AlgoSearch { dims: (key.m, key.n, key.k, key.batch), times_ms, chosen });
        Ok(candidates[chosen].algo)
    }

    /// Whether cuBLASLt runs `algo` on `plan`'s exact shape within the workspace.
    fn accepts(&self, plan: &Plan, algo: &sys::cublasLtMatmulAlgo_t) -> bool {
        // SAFETY: live descriptors of this handle; `result` is a plain struct cuBLASLt fills.
        unsafe {
            let mut result: sys::cublasLtMatmulHeuristicResult_t = std::mem::zeroed();
            let status = sys::cublasLtMatmulAlgoCheck(self.handle, plan.desc, plan.a, plan.b, plan.c, plan.c, algo, &mut result);
            status == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS && result.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS && result.workspaceSize <= WORKSPACE_BYTES
        }
    }

    /// The heuristic's first `count` usable algorithms for `plan`, best first (at least one).
    fn heuristics(&self, plan: &Plan, count: usize) -> Result<Vec<sys::cublasLtMatmulHeuristicResult_t>, CublasError> {
        // SAFETY: live descriptors of this handle; `results` has room for `count` plain structs.
        unsafe {
            let preference = lt::create_matmul_pref()?;
            let bytes = WORKSPACE_BYTES as u64;
            let limited = lt::set_matmul_pref_attribute(preference, sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, (&bytes as *const u64).cast(), std::mem::size_of::<u64>());
            let mut results: Vec<sys::cublasLtMatmulHeuristicResult_t> = vec![std::mem::zeroed(); count];
            let mut found = 0;
            let status = limited.and_then(|()| sys::cublasLtMatmulAlgoGetHeuristic(self.handle, plan.desc, plan.a, plan.b, plan.c, plan.c, preference, count as i32, results.as_mut_ptr(), &mut found).result());
            lt::destroy_matmul_pref(preference)?;
            status?;
            results.truncate(found.max(0) as usize);
            results.retain(|result| result.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS);
            if results.is_empty() {
                return Err(lt::CublasError(sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED).into());
            }
            Ok(results)
        }
    }

    /// The mean time of `plan`'s GEMM on `pointers` over [`SEARCH_RUNS`] runs on `stream`, after
    /// an untimed one, waited for (`None`: cuBLASLt declined to run its algorithm). Every run
    /// writes the same product into the output, which the GEMM proper then writes again.
    fn time(&mut self, plan: &Plan, pointers: [u64; 3], stream: driver_sys::CUstream) -> Result<Option<f32>, CublasError> {
        if self.gemm(plan, pointers, stream).is_err() {
            return Ok(None);
        }
        let (begin, end) = (self.event()?, self.event()?);
        // SAFETY: live events of this context, recorded on a stream of it and waited for here.
        let ms = unsafe {
            driver::event::record(begin, stream)?;
            for _ in 0..SEARCH_RUNS {
                self.gemm(plan, pointers, stream)?;
            }
            driver::event::record(end, stream)?;
            driver::event::synchronize(end)?;
            driver::event::elapsed(begin, end)?
        };
        self.timed.free.extend([begin, end]);
        Ok(Some(ms / SEARCH_RUNS as f32))
    }

    /// `key`'s descriptor and layouts, its algorithm still to pick.
    fn describe(&self, key: &PlanKey) -> Result<Plan, CublasError> {
        let data_type = key.data_type;
        // Float32 accumulation for every type; for float32 operands this is true float32 (the
        // tf32 mode would be CUBLAS_COMPUTE_32F_FAST_TF32).
        let desc = lt::create_matmul_desc(sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, sys::cudaDataType::CUDA_R_32F)?;
        let layout = |operand: &CublasOperand| -> Result<sys::cublasLtMatrixLayout_t, CublasError> {
            let layout = lt::create_matrix_layout(data_type, operand.rows, operand.cols, operand.leading)?;
            set_batch(layout, key.batch, operand.batch_stride)?;
            Ok(layout)
        };
        let (a, b) = (layout(&key.a)?, layout(&key.b)?);
        let c = lt::create_matrix_layout(key.out_type, key.n as u64, key.m as u64, key.ldc)?;
        set_batch(c, key.batch, key.batch_stride_c)?;
        // SAFETY: attributes of a live descriptor, with buffers of the documented type (i32).
        unsafe {
            for (attribute, operand) in [(sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA, &key.a), (sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB, &key.b)] {
                let op: i32 = operand.transpose as i32; // CUBLAS_OP_N = 0, CUBLAS_OP_T = 1
                lt::set_matmul_desc_attribute(desc, attribute, (&op as *const i32).cast(), std::mem::size_of::<i32>())?;
            }
        }
        // SAFETY: a plain struct; `algorithm` fills it in before any GEMM reads it.
        Ok(Plan { desc, a, b, c, algo: unsafe { std::mem::zeroed() } })
    }
}

fn set_batch(layout: sys::cublasLtMatrixLayout_t, batch: usize, stride: i64) -> Result<(), CublasError> {
    if batch <= 1 {
        return Ok(());
    }
    let count = batch as i32;
    // SAFETY: attributes of a live layout, with buffers of the documented types (i32, i64).
    unsafe {
        lt::set_matrix_layout_attribute(layout, sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, (&count as *const i32).cast(), std::mem::size_of::<i32>())?;
        lt::set_matrix_layout_attribute(layout, sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, (&stride as *const i64).cast(), std::mem::size_of::<i64>())?;
    }
    Ok(())
}

/// Every device's engine made so far (none before the first GEMM), out of the registry's lock.
fn engines() -> Vec<&'static Mutex<Engine>> {
    ENGINES.get().map_or_else(Vec::new, |engines| engines.lock().unwrap_or_else(|e| e.into_inner()).values().copied().collect())
}

/// Forgets the GEMMs timed so far (waiting for those still running), so that
/// [`profile_table`] covers only what runs after: a profiled request, not the warm-up.
pub fn reset_profile() -> Result<(), CublasError> {
    for engine in engines() {
        let mut engine = engine.lock().unwrap_or_else(|e| e.into_inner());
        engine.context.bind_to_thread()?;
        engine.read_finished_times(true)?;
        engine.profile.clear();
    }
    Ok(())
}

/// The GEMMs cuBLASLt ran in this process, by shape: calls, time and TFLOP/s, slowest first
/// (on CubeCL's stream, the GPU time between events around each; host-synced, launch to
/// completion with the syncs); then the algorithm searches made (`--cublas-algos`), if any.
/// Waits for GEMMs still running. `None` before the first.
pub fn profile_table() -> Option<String> {
    let mut rows = Vec::new();
    let mut searches = Vec::new();
    for engine in engines() {
        let mut engine = engine.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(failure) = engine.context.bind_to_thread().map_err(CublasError::from).and_then(|()| engine.read_finished_times(true)) {
            return Some(format!("cuBLASLt GEMMs: their times could not be read: {failure}\n"));
        }
        for (&(m, n, k, batch), times) in &engine.profile {
            let flops = 2.0 * (m * n * k * batch.max(1)) as f64 * times.calls as f64;
            rows.push((times.gemm, m, n, k, batch, times.calls, flops / times.gemm.as_secs_f64() / 1e12));
        }
        searches.extend(engine.searches.iter().map(search_row));
    }
    if rows.is_empty() && searches.is_empty() {
        return None;
    }
    let mut table = gemm_table(rows);
    if !searches.is_empty() {
        table += &format!(
            "\ncuBLASLt algorithm searches (the heuristic's first candidates timed on each shape class's first GEMM, {SEARCH_RUNS} runs each)\n\
             | m | n | k | batch | candidates ran | heuristic's first ms | kept ms | kept (heuristic's rank) | gain |\n|---|---|---|---|---|---|---|---|---|\n"
        );
        table += &searches.concat();
    }
    Some(table)
}

/// An [`AlgoSearch`] as a row of the searches' table.
fn search_row(search: &AlgoSearch) -> String {
    let (m, n, k, batch) = search.dims;
    let ran = search.times_ms.iter().flatten().count();
    let ms = |rank: usize| search.times_ms[rank].map_or("-".to_owned(), |ms| format!("{ms:.3}"));
    let gain = match (search.times_ms[0], search.times_ms[search.chosen]) {
        (Some(first), Some(kept)) if kept > 0.0 => format!("{:.2}×", first / kept),
        _ => "-".to_owned(),
    };
    format!("| {m} | {n} | {k} | {batch} | {ran} of {} | {} | {} | {} | {gain} |\n", search.times_ms.len(), ms(0), ms(search.chosen), search.chosen + 1)
}

/// The GEMM rows of [`profile_table`] as markdown, slowest shape first.
fn gemm_table(mut rows: Vec<(Duration, usize, usize, usize, usize, u64, f64)>) -> String {
    rows.sort_by_key(|row| std::cmp::Reverse(row.0));
    let total: Duration = rows.iter().map(|r| r.0).sum();
    let timing = match ordering() {
        CublasOrdering::Stream => "on CubeCL's stream, GPU time between events",
        CublasOrdering::HostSync => "host-synced, launch to completion",
    };
    let mut table = format!("cuBLASLt GEMMs ({timing}): {:.1} ms in all\n| m | n | k | batch | calls | ms | TFLOP/s |\n|---|---|---|---|---|---|---|\n", total.as_secs_f64() * 1e3);
    for (time, m, n, k, batch, calls, tflops) in rows {
        table += &format!("| {m} | {n} | {k} | {batch} | {calls} | {:.2} | {tflops:.0} |\n", time.as_secs_f64() * 1e3);
    }
    table
}
