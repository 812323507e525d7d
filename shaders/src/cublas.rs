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
//! Plans (descriptor, layouts, heuristic algorithm) are cached per shape and stride; the
//! workspace (32 MiB) is allocated once. float32 runs with `CUBLAS_COMPUTE_32F` (no tf32);
//! bfloat16 and float16 read 16-bit operands and accumulate in float32.

use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
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

/// Whether libcublasLt can be loaded on this machine.
pub fn available() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { sys::is_culib_present() }
}

/// `lhs · rhs` by cuBLASLt, batched over equal leading dimensions (no broadcasting), into a new
/// contiguous tensor. Operands whose last two dimensions are neither row- nor column-major are
/// copied contiguous first.
pub fn matmul(lhs: CubeTensor<CudaRuntime>, rhs: CubeTensor<CudaRuntime>) -> Result<CubeTensor<CudaRuntime>, CublasError> {
    let dtype = lhs.dtype;
    if rhs.dtype != dtype {
        return Err(CublasError::Declined("operands of different float types"));
    }
    let data_type = match dtype {
        DType::F32 => sys::cudaDataType::CUDA_R_32F,
        DType::BF16 => sys::cudaDataType::CUDA_R_16BF,
        DType::F16 => sys::cudaDataType::CUDA_R_16F,
        _ => return Err(CublasError::Declined("not a float32/bfloat16/float16 matmul")),
    };
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
    let out = empty_device_contiguous_dtype(lhs.tensor.client.clone(), lhs.tensor.device.clone(), out_shape, dtype);

    // Column-major cuBLAS computes the row-major product as outᵀ (n × m) = rhsᵀ · lhsᵀ.
    let out_strides = out.meta.strides();
    let key = PlanKey {
        data_type,
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
    data_type: sys::cudaDataType,
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    a: CublasOperand,
    b: CublasOperand,
    ldc: i64,
    batch_stride_c: i64,
}

/// One cuBLASLt handle, stream, workspace and plan cache per device. The workspace is shared by
/// every GEMM: those on CubeCL's stream follow each other there, the synced ones are waited for.
struct Engine {
    context: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    handle: sys::cublasLtHandle_t,
    workspace: u64,
    plans: HashMap<PlanKey, Plan>,
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
    let engine: &'static Mutex<Engine> = Box::leak(Box::new(Mutex::new(Engine { context, stream, handle, workspace, plans: HashMap::new(), profile: HashMap::new(), timed: EventTimes::default() })));
    engines.insert(device, engine);
    Ok(engine)
}

impl Engine {
    /// `c = b · a` in cuBLAS's column-major terms (the row-major `lhs · rhs`), pointers `[a, b, c]`.
    fn run(&mut self, key: &PlanKey, [a, b, c]: [u64; 3], on: On) -> Result<(), CublasError> {
        self.context.bind_to_thread()?;
        if !self.plans.contains_key(key) {
            let plan = self.plan(key)?;
            self.plans.insert(*key, plan);
        }
        let dims = (key.m, key.n, key.k, key.batch);
        let start = Instant::now();
        let (stream, events) = match on {
            On::Stream(stream) => {
                self.read_finished_times(false)?;
                let (begin, end) = (self.event()?, self.event()?);
                // SAFETY: live events of this context, recorded on a stream of it.
                unsafe { driver::event::record(begin, stream) }?;
                (stream, Some((begin, end)))
            }
            On::OwnStreamWaited => (self.stream.cu_stream(), None),
        };
        self.gemm(key, [a, b, c], stream)?;
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

    fn gemm(&self, key: &PlanKey, [a, b, c]: [u64; 3], stream: driver_sys::CUstream) -> Result<(), CublasError> {
        let plan = &self.plans[key];
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

    fn plan(&self, key: &PlanKey) -> Result<Plan, CublasError> {
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
        let c = lt::create_matrix_layout(data_type, key.n as u64, key.m as u64, key.ldc)?;
        set_batch(c, key.batch, key.batch_stride_c)?;
        // SAFETY: attributes of live descriptors, with buffers of the documented types (i32, u64).
        unsafe {
            for (attribute, operand) in [(sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA, &key.a), (sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB, &key.b)] {
                let op: i32 = operand.transpose as i32; // CUBLAS_OP_N = 0, CUBLAS_OP_T = 1
                lt::set_matmul_desc_attribute(desc, attribute, (&op as *const i32).cast(), std::mem::size_of::<i32>())?;
            }
            let preference = lt::create_matmul_pref()?;
            let bytes = WORKSPACE_BYTES as u64;
            lt::set_matmul_pref_attribute(preference, sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, (&bytes as *const u64).cast(), std::mem::size_of::<u64>())?;
            let heuristic = lt::get_matmul_algo_heuristic(self.handle, desc, a, b, c, c, preference);
            lt::destroy_matmul_pref(preference)?;
            match heuristic {
                Ok(heuristic) => Ok(Plan { desc, a, b, c, algo: heuristic.algo }),
                Err(no_algorithm) => {
                    // Nothing keeps a plan that cannot run: free its descriptors.
                    let _ = (lt::destroy_matrix_layout(a), lt::destroy_matrix_layout(b), lt::destroy_matrix_layout(c), lt::destroy_matmul_desc(desc));
                    Err(no_algorithm.into())
                }
            }
        }
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
/// completion with the syncs). Waits for GEMMs still running. `None` before the first.
pub fn profile_table() -> Option<String> {
    let mut rows = Vec::new();
    for engine in engines() {
        let mut engine = engine.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(failure) = engine.context.bind_to_thread().map_err(CublasError::from).and_then(|()| engine.read_finished_times(true)) {
            return Some(format!("cuBLASLt GEMMs: their times could not be read: {failure}\n"));
        }
        for (&(m, n, k, batch), times) in &engine.profile {
            let flops = 2.0 * (m * n * k * batch.max(1)) as f64 * times.calls as f64;
            rows.push((times.gemm, m, n, k, batch, times.calls, flops / times.gemm.as_secs_f64() / 1e12));
        }
    }
    if rows.is_empty() {
        return None;
    }
    rows.sort_by(|a, b| b.0.cmp(&a.0));
    let total: Duration = rows.iter().map(|r| r.0).sum();
    let timing = match ordering() {
        CublasOrdering::Stream => "on CubeCL's stream, GPU time between events",
        CublasOrdering::HostSync => "host-synced, launch to completion",
    };
    let mut table = format!("cuBLASLt GEMMs ({timing}): {:.1} ms in all\n| m | n | k | batch | calls | ms | TFLOP/s |\n|---|---|---|---|---|---|---|\n", total.as_secs_f64() * 1e3);
    for (time, m, n, k, batch, calls, tflops) in rows {
        table += &format!("| {m} | {n} | {k} | {batch} | {calls} | {:.2} | {tflops:.0} |\n", time.as_secs_f64() * 1e3);
    }
    Some(table)
}
