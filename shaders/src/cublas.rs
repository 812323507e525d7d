//! cuBLASLt for the CUDA build's matmuls (feature `cublas`, route [`MatmulRoute::Cublas`]).
//!
//! cubek 0.2's tiled matmuls emit Ampere-style `mma.sync` and reach a fraction of a Hopper's
//! tensor-core rate; cuBLASLt picks wgmma kernels there. The operands stay CubeCL tensors: their
//! device pointers are read from CubeCL's storage, the product is written into a tensor CubeCL
//! allocated, and cuBLASLt runs on a stream of its own in the same (primary) context.
//!
//! Ordering: CubeCL 0.10 does not expose its CUDA stream, so each GEMM waits for CubeCL's
//! queued work (`client.sync()`), runs, and waits for itself before CubeCL goes on — two host
//! syncs a GEMM. Cheap next to a 10k-token GEMM; [`profile_table`] shows what they cost, and
//! upstream's cubecl PR #1440 (a GEMM on CubeCL's own stream) is the way past them.
//!
//! Plans (descriptor, layouts, heuristic algorithm) are cached per shape and stride; the
//! workspace (32 MiB) is allocated once. float32 runs with `CUBLAS_COMPUTE_32F` (no tf32);
//! bfloat16 and float16 read 16-bit operands and accumulate in float32.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use burn_backend::{calculate_matmul_output, DType, TensorMetadata};
use burn_cubecl::cubecl::cuda::CudaRuntime;
use burn_cubecl::cubecl::future::block_on;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cudarc::cublaslt::{result as lt, sys};

use crate::blas_layout::{blas_layout, BlasLayout};
use cudarc::driver::{result as driver, CudaContext, CudaStream, DriverError};

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

    let client = out.client.clone();
    block_on(client.sync()).map_err(|e| CublasError::CubeCl(format!("{e:?}")))?;
    let resource = |tensor: &CubeTensor<CudaRuntime>| client.get_resource(tensor.handle.clone()).map_err(|e| CublasError::CubeCl(format!("{e:?}")));
    let (a, b, c) = (resource(&rhs.tensor)?, resource(&lhs.tensor)?, resource(&out)?);
    let mut engine = engine(out.device.index)?.lock().unwrap_or_else(|e| e.into_inner());
    engine.run(&key, a.resource().ptr, b.resource().ptr, c.resource().ptr)?;
    Ok(out)
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

/// One cuBLASLt handle, stream, workspace and plan cache per device.
struct Engine {
    context: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    handle: sys::cublasLtHandle_t,
    workspace: u64,
    plans: HashMap<PlanKey, Plan>,
    profile: HashMap<(usize, usize, usize, usize), ShapeTimes>,
}

// SAFETY: the handle and plans are only used under the engine's mutex.
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
    let engine: &'static Mutex<Engine> = Box::leak(Box::new(Mutex::new(Engine { context, stream, handle, workspace, plans: HashMap::new(), profile: HashMap::new() })));
    engines.insert(device, engine);
    Ok(engine)
}

impl Engine {
    fn run(&mut self, key: &PlanKey, a: u64, b: u64, c: u64) -> Result<(), CublasError> {
        self.context.bind_to_thread()?;
        if !self.plans.contains_key(key) {
            let plan = self.plan(key)?;
            self.plans.insert(*key, plan);
        }
        let plan = &self.plans[key];
        let (alpha, beta) = (1.0f32, 0.0f32);
        let start = Instant::now();
        // SAFETY: the plan's layouts describe the three CubeCL buffers (held by the caller until
        // this returns); the workspace is ours; the stream belongs to the current context.
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
                self.stream.cu_stream() as sys::cudaStream_t,
            )?;
        }
        self.stream.synchronize()?;
        let times = self.profile.entry((key.m, key.n, key.k, key.batch)).or_default();
        times.calls += 1;
        times.gemm += start.elapsed();
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

/// The GEMMs cuBLASLt ran in this process, by shape: calls, time (launch to completion, host
/// syncs included) and TFLOP/s, slowest first. `None` before the first.
pub fn profile_table() -> Option<String> {
    let mut rows = Vec::new();
    let engines: Vec<&'static Mutex<Engine>> = ENGINES.get()?.lock().unwrap_or_else(|e| e.into_inner()).values().copied().collect();
    for engine in engines {
        let engine = engine.lock().unwrap_or_else(|e| e.into_inner());
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
    let mut table = format!("cuBLASLt GEMMs: {:.1} ms in all\n| m | n | k | batch | calls | ms | TFLOP/s |\n|---|---|---|---|---|---|---|\n", total.as_secs_f64() * 1e3);
    for (time, m, n, k, batch, calls, tflops) in rows {
        table += &format!("| {m} | {n} | {k} | {batch} | {calls} | {:.2} | {tflops:.0} |\n", time.as_secs_f64() * 1e3);
    }
    Some(table)
}
