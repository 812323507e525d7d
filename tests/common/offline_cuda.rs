//! A CubeCL runtime that compiles for CUDA without a GPU: an H100's properties (compute
//! capability 9.0, as CubeCL's CUDA runtime would read them from the driver), CubeCL's own CUDA
//! compiler, and a server whose every launch compiles its kernel to CUDA C++ and keeps the
//! source instead of running it. Memory holds nothing (reads give zeros), so whatever runs on it
//! — a kernel alone or a whole model through Burn — produces every kernel the real CUDA runtime
//! would compile for the same shapes, for NVRTC and `ptxas` to check offline. A launch the
//! driver would refuse (an empty grid or one past its limits) is recorded as a failure too.
//!
//! Why not CubeCL's CUDA runtime itself: its server initialises the CUDA driver on creation, and
//! a kernel is defined only through a client (`define()` reads the client's device properties).

#![allow(dead_code)] // each test binary uses its own subset

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use burn_cubecl::cubecl::cuda::{CudaCompiler, CudaRuntime};
use burn_cubecl::cubecl::ir::{
    BarrierLevel, DeviceProperties, ElemType, FloatKind, HardwareProperties, MemoryDeviceProperties, OpaqueType, SemanticType, StorageType, TargetProperties, Type, VectorSize,
    features::{AtomicUsage, Plane, Tma, TypeUsage},
};
use burn_cubecl::cubecl::server::{Binding, ComputeServer, CopyDescriptor, CubeCount, ExecutionMode, KernelArguments, ProfileError, ProfilingToken, ServerCommunication, ServerError, ServerUtilities};
use burn_cubecl::cubecl::zspace::{striding::has_pitched_row_major_strides, Shape, Strides};
use burn_cubecl::cubecl::{client::ComputeClient, CubeTask, Runtime};
use cubecl_runtime::id::KernelId;
use cubecl_runtime::kernel::CompiledKernel;
use burn_cubecl::cubecl::bytes::Bytes;
use burn_cubecl::cubecl::device::{Device, DeviceId, DeviceService, ServerUtilitiesHandle};
use burn_cubecl::cubecl::future::DynFut;
use burn_cubecl::cubecl::profile::{ProfileDuration, TimingMethod};
use burn_cubecl::cubecl::stream_id::StreamId;
use cubecl_cpp::cuda::{arch::CudaArchitecture, mma::CudaWmmaCompiler};
use cubecl_cpp::shared::{register_mma_features, register_scaled_mma_features, register_wmma_features, CompilationOptions, CppSupportedFeatures};
use cubecl_cpp::{register_supported_types, DialectWmmaCompiler};
use cubecl_runtime::allocator::PitchedMemoryLayoutPolicy;
use cubecl_runtime::logging::ServerLogger;
use cubecl_runtime::memory_management::{ManagedMemoryHandle, MemoryAllocationMode, MemoryUsage};
use cubecl_runtime::storage::{BytesResource, BytesStorage, ManagedResource};
use cubecl_runtime::timestamp_profiler::TimestampProfiler;
use cubecl_runtime::validation::{validate_cube_dim, validate_units};

/// The compute capability compiled for: the H100 the GPU suite runs on (`sm_90a`).
pub const ARCH: u32 = 90;

/// An H100 SXM's shared memory per block (227 KiB, opted in; the runtime refuses launches past it).
pub const MAX_SHARED_MEMORY_BYTES: usize = 232_448;

/// How the Rust type of each of tally's kernels (`shaders/`) begins; Burn's and CubeK's begin
/// with their crates'.
const TALLYS_KERNELS: &str = "tally_shaders::";

/// One kernel as CubeCL's CUDA runtime would hand it to NVRTC.
#[derive(Clone, Debug)]
pub struct CudaSource {
    /// The kernel's Rust type (its `#[cube]` function's module path).
    pub kernel_type: &'static str,
    /// The generated kernel function's name (the `#[cube]` function's, with its generics).
    pub entry_point: String,
    pub source: String,
    /// What was running when it was first generated ([`running`]).
    pub generated_by: String,
    /// The shared memory CubeCL says the kernel declares.
    pub shared_memory_bytes: usize,
}

impl CudaSource {
    pub fn is_tallys(&self) -> bool {
        is_tallys(self.kernel_type)
    }
}

/// Whether the kernel of Rust type `kernel_type` is one of tally's.
pub fn is_tallys(kernel_type: &str) -> bool {
    kernel_type.starts_with(TALLYS_KERNELS)
}

/// Every distinct kernel compiled so far in this process, by source.
static COMPILED: Mutex<BTreeMap<String, CudaSource>> = Mutex::new(BTreeMap::new());
/// Launches and compilations so far, by kernel type ([`counts`]).
static COUNTS: Mutex<Counts> = Mutex::new(Counts { launches: BTreeMap::new(), compiles: BTreeMap::new() });

/// What the offline servers were asked to do, by kernel type (a `#[cube]` function's or Burn's
/// kernel's Rust type): every launch, and every first launch of a kernel id, where CubeCL's CUDA
/// runtime would compile (NVRTC, ~0.1–1 s a kernel on the GPU machine, unless its PTX cache has it).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counts {
    pub launches: BTreeMap<&'static str, u64>,
    pub compiles: BTreeMap<&'static str, u64>,
}

impl Counts {
    /// What happened since `earlier` (a snapshot of the same process's counts).
    pub fn since(&self, earlier: &Counts) -> Counts {
        let minus = |now: &BTreeMap<&'static str, u64>, then: &BTreeMap<&'static str, u64>| {
            now.iter().filter_map(|(&kernel, &n)| Some((kernel, n.checked_sub(then.get(kernel).copied().unwrap_or(0)).filter(|&d| d > 0)?))).collect()
        };
        Counts { launches: minus(&self.launches, &earlier.launches), compiles: minus(&self.compiles, &earlier.compiles) }
    }

    pub fn total_launches(&self) -> u64 {
        self.launches.values().sum()
    }
}

/// The launches and compilations so far in this process.
pub fn counts() -> Counts {
    COUNTS.lock().unwrap().clone()
}
/// Launches that failed ([`failed`]), with what was running ([`running`]).
static FAILED: Mutex<Vec<String>> = Mutex::new(Vec::new());
static RUNNING: Mutex<String> = Mutex::new(String::new());

/// The kernels compiled so far (each source once), in source order.
pub fn compiled() -> Vec<CudaSource> {
    COMPILED.lock().unwrap().values().cloned().collect()
}

/// The launches that failed so far (kernel, what was running, why): kernels CubeCL could not
/// generate and grids or cubes the driver would refuse. On a real device such a launch fails on
/// the device's thread, where CubeCL logs it and goes on: the output is never written.
pub fn failed() -> Vec<String> {
    FAILED.lock().unwrap().clone()
}

/// Names what runs next, for the failures' messages.
pub fn running(what: impl Into<String>) {
    *RUNNING.lock().unwrap() = what.into();
}

/// Offline device `index` of runtime `ID`. Burn keeps a device's default float type by its id,
/// set by the first backend that uses it, so each float type a process compiles for needs a
/// device of its own; each device has its own server, so a fresh `index` is a device on which
/// nothing has compiled yet. The index is a value, not a type, so that scorers on fresh devices
/// share one backend type: each type is the whole model and Burn monomorphised again (7 of
/// them made `cuda_launches` 7 minutes of CI's build).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OfflineDevice<const ID: u16> {
    pub index: u16,
}

impl<const ID: u16> Device for OfflineDevice<ID> {
    fn from_id(id: DeviceId) -> Self {
        OfflineDevice { index: id.index_id }
    }
    fn to_id(&self) -> DeviceId {
        // Type ids of their own, so the registries never mix them with a real CUDA device.
        DeviceId { type_id: 700 + ID, index_id: self.index }
    }
}

impl<const ID: u16> burn_backend::DeviceOps for OfflineDevice<ID> {}

/// The runtime of [`OfflineDevice`] `ID`.
#[derive(Clone, Debug)]
pub struct OfflineCuda<const ID: u16>;

impl<const ID: u16> Runtime for OfflineCuda<ID> {
    type Compiler = CudaCompiler;
    type Server = OfflineServer<ID>;
    type Device = OfflineDevice<ID>;

    fn client(device: &OfflineDevice<ID>) -> ComputeClient<Self> {
        ComputeClient::load(device)
    }
    fn name(_: &ComputeClient<Self>) -> &'static str {
        "cuda (offline)"
    }
    fn require_array_lengths() -> bool {
        CudaRuntime::require_array_lengths()
    }
    fn max_cube_count() -> (u32, u32, u32) {
        CudaRuntime::max_cube_count()
    }
    fn can_read_tensor(shape: &Shape, strides: &Strides) -> bool {
        has_pitched_row_major_strides(shape, strides)
    }
    fn target_properties() -> TargetProperties {
        // A constant of CUDA's runtime (the MMA register layouts); it asks nothing of a driver.
        CudaRuntime::target_properties()
    }
    fn enumerate_devices(_: u16, _: &()) -> Vec<DeviceId> {
        vec![OfflineDevice::<ID>::default().to_id()]
    }
}

#[derive(Debug)]
pub struct OfflineServer<const ID: u16> {
    utilities: Arc<ServerUtilities<Self>>,
    options: CompilationOptions,
    timestamps: TimestampProfiler,
    /// Every memory handle the client initialised, held as a device's memory pool holds them:
    /// CubeCL lets a kernel write a tensor in place only while the pool and one tensor hold its
    /// handle (`can_mut`), so without the pool's reference Burn would alias tensors a device
    /// never would.
    pool: Vec<ManagedMemoryHandle>,
    /// The kernels compiled so far: as CubeCL's CUDA context keeps its modules, by id, so a
    /// kernel is compiled at its first launch only.
    compiled_ids: HashSet<KernelId>,
}

impl<const ID: u16> ServerCommunication for OfflineServer<ID> {
    const SERVER_COMM_ENABLED: bool = false;
}

impl<const ID: u16> DeviceService for OfflineServer<ID> {
    fn init(_: DeviceId) -> Self {
        let properties = h100_properties();
        let layout = PitchedMemoryLayoutPolicy::new(properties.memory.alignment as usize);
        let utilities = Arc::new(ServerUtilities::new(properties, Arc::new(ServerLogger::default()), (), layout));
        // What CubeCL's CUDA server sets for compute capability 9.0 (cubecl-cuda's `init`).
        let features = CppSupportedFeatures { grid_constants: true, clusters: true, fast_math: true, fast_tanh: true, elect_sync: true };
        OfflineServer { utilities, options: CompilationOptions { warp_size: 32, supports_features: features }, timestamps: TimestampProfiler::default(), pool: Vec::new(), compiled_ids: HashSet::new() }
    }
    fn utilities(&self) -> ServerUtilitiesHandle {
        ComputeServer::utilities(self) as ServerUtilitiesHandle
    }
}

impl<const ID: u16> ComputeServer for OfflineServer<ID> {
    type Kernel = Box<dyn CubeTask<CudaCompiler>>;
    type Info = ();
    type MemoryLayoutPolicy = PitchedMemoryLayoutPolicy;
    type Storage = BytesStorage;

    fn initialize_memory(&mut self, memory: ManagedMemoryHandle, _: u64, _: StreamId) {
        self.pool.push(memory);
    }

    fn logger(&self) -> Arc<ServerLogger> {
        self.utilities.logger.clone()
    }

    fn utilities(&self) -> Arc<ServerUtilities<Self>> {
        self.utilities.clone()
    }

    fn read(&mut self, descriptors: Vec<CopyDescriptor>, _: StreamId) -> DynFut<Result<Vec<Bytes>, ServerError>> {
        let zeros = descriptors.iter().map(|d| Bytes::from_bytes_vec(vec![0; d.handle.size_in_used() as usize])).collect();
        Box::pin(async move { Ok(zeros) })
    }

    fn write(&mut self, _: Vec<(CopyDescriptor, Bytes)>, _: StreamId) {}

    fn sync(&mut self, _: StreamId) -> DynFut<Result<(), ServerError>> {
        Box::pin(async { Ok(()) })
    }

    fn get_resource(&mut self, _: Binding, _: StreamId) -> Result<ManagedResource<BytesResource>, ServerError> {
        Err(ServerError::Generic { reason: "the offline CUDA runtime holds no memory".into(), backtrace: Default::default() })
    }

    unsafe fn launch(&mut self, kernel: Self::Kernel, count: CubeCount, _: KernelArguments, mode: ExecutionMode, _: StreamId) {
        // What CubeCL's CUDA context checks before it compiles, then what the driver checks; a
        // launch either would refuse is not compiled.
        let properties = &self.utilities.properties;
        let mut id = kernel.id();
        id.mode(mode);
        let refused = validate_cube_dim(properties, &id).and_then(|()| validate_units(properties, &id)).err().map(|error| format!("{error:?}")).or_else(|| refused_grid(&count));
        let why = match refused {
            Some(refused) => refused,
            None if self.compiled_ids.contains(&id) => return record_launch(kernel.name(), false),
            None => {
                let compile = || kernel.compile(&mut CudaCompiler::default(), &self.options, mode, kernel.address_type());
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(compile)) {
                    Ok(Ok(compiled)) => {
                        record_launch(kernel.name(), true);
                        self.compiled_ids.insert(id);
                        return keep(kernel.name(), compiled);
                    }
                    Ok(Err(error)) => format!("{error:?}"),
                    Err(panic) => panic.downcast_ref::<String>().cloned().or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default(),
                }
            }
        };
        // The kernel's id spells out what it was asked to generate (for a fused kernel: its ops).
        FAILED.lock().unwrap().push(format!("{} (while running {}): {}\nkernel: {id:?}", kernel.name(), RUNNING.lock().unwrap(), why.trim()));
    }

    fn flush(&mut self, _: StreamId) -> Result<(), ServerError> {
        Ok(())
    }

    fn memory_usage(&mut self, _: StreamId) -> Result<MemoryUsage, ServerError> {
        Ok(MemoryUsage { number_allocs: 0, bytes_in_use: 0, bytes_padding: 0, bytes_reserved: 0 })
    }

    fn memory_cleanup(&mut self, _: StreamId) {}

    fn start_profile(&mut self, _: StreamId) -> Result<ProfilingToken, ServerError> {
        Ok(self.timestamps.start())
    }

    fn end_profile(&mut self, _: StreamId, token: ProfilingToken) -> Result<ProfileDuration, ProfileError> {
        self.timestamps.stop(token)
    }

    fn allocation_mode(&mut self, _: MemoryAllocationMode, _: StreamId) {}
}

/// Why the driver would refuse a launch of `count` cubes (`cuLaunchKernel`:
/// `CUDA_ERROR_INVALID_VALUE`), which CubeCL passes on unchecked: an empty grid (a kernel over
/// zero elements) or one past the grid's limits. A count read from a buffer is not known here.
pub fn refused_grid(count: &CubeCount) -> Option<String> {
    let CubeCount::Static(x, y, z) = *count else { return None };
    let (max_x, max_y, max_z) = CudaRuntime::max_cube_count();
    let refused = x == 0 || y == 0 || z == 0 || x > max_x || y > max_y || z > max_z;
    refused.then(|| format!("a grid of ({x}, {y}, {z}) cubes, which CUDA refuses (at least 1 and at most ({max_x}, {max_y}, {max_z}))"))
}

fn record_launch(kernel_type: &'static str, compiled: bool) {
    let mut counts = COUNTS.lock().unwrap();
    *counts.launches.entry(kernel_type).or_default() += 1;
    if compiled {
        *counts.compiles.entry(kernel_type).or_default() += 1;
    }
}

fn keep(kernel_type: &'static str, compiled: CompiledKernel<CudaCompiler>) {
    let shared_memory_bytes = compiled.repr.as_ref().map_or(0, |repr| repr.shared_memory_size());
    let generated_by = RUNNING.lock().unwrap().clone();
    let source = CudaSource { kernel_type, entry_point: compiled.entrypoint_name, source: compiled.source, generated_by, shared_memory_bytes };
    COMPILED.lock().unwrap().entry(source.source.clone()).or_insert(source);
}

/// What CubeCL's CUDA runtime reads from an H100 SXM's driver (cubecl-cuda 0.10 `init`,
/// compute capability 9.0): the same feature registrations, with the attributes it queries
/// written in.
fn h100_properties() -> DeviceProperties {
    let arch = CudaArchitecture { version: ARCH };
    let wmma = CudaWmmaCompiler::supported_wmma_combinations(&arch);
    let hardware = HardwareProperties {
        load_width: 128,
        plane_size_min: 32,
        plane_size_max: 32,
        max_bindings: 1024,
        max_shared_memory_size: MAX_SHARED_MEMORY_BYTES,
        max_cube_count: CudaRuntime::max_cube_count(),
        max_units_per_cube: 1024,
        max_cube_dim: (1024, 1024, 64),
        num_streaming_multiprocessors: Some(132),
        num_tensor_cores: Some(4),
        min_tensor_cores_dim: (!wmma.is_empty()).then_some(8),
        num_cpu_cores: None,
        max_vector_size: VectorSize::MAX,
    };
    let memory = MemoryDeviceProperties { max_page_size: (80 << 30) / 4, alignment: 512 };
    let mut props = DeviceProperties::new(Default::default(), memory, hardware, TimingMethod::System);
    register_supported_types(&mut props);
    props.register_type_usage(ElemType::Float(FloatKind::TF32), TypeUsage::Conversion);
    let atomic = |kind: FloatKind| Type::new(StorageType::Atomic(ElemType::Float(kind)));
    props.register_atomic_type_usage(atomic(FloatKind::F64), AtomicUsage::Add | AtomicUsage::LoadStore);
    props.register_atomic_type_usage(atomic(FloatKind::F16), AtomicUsage::Add | AtomicUsage::LoadStore);
    props.register_atomic_type_usage(atomic(FloatKind::F16).with_vector_size(2), AtomicUsage::Add | AtomicUsage::LoadStore);
    props.register_atomic_type_usage(atomic(FloatKind::F32).with_vector_size(2), AtomicUsage::LoadStore | AtomicUsage::Add);
    props.register_atomic_type_usage(atomic(FloatKind::F32).with_vector_size(4), AtomicUsage::LoadStore | AtomicUsage::Add);
    props.register_semantic_type(SemanticType::Pipeline);
    props.register_semantic_type(SemanticType::TensorMap);
    props.register_type_usage(OpaqueType::Barrier(BarrierLevel::Unit), TypeUsage::Buffer);
    props.register_type_usage(OpaqueType::Barrier(BarrierLevel::Cube), TypeUsage::Buffer);
    for kind in [FloatKind::E4M3, FloatKind::E5M2] {
        props.register_type_usage(ElemType::Float(kind), TypeUsage::Conversion | TypeUsage::Buffer);
    }
    let features = &mut props.features;
    features.plane.insert(Plane::Sync);
    features.plane.insert(Plane::Ops);
    features.plane.insert(Plane::NonUniformControlFlow);
    for kind in [FloatKind::F16, FloatKind::BF16] {
        features.matmul.ldmatrix.insert(ElemType::Float(kind).into());
        features.matmul.stmatrix.insert(ElemType::Float(kind).into());
    }
    features.copy_async = true;
    features.tma.insert(Tma::Base);
    features.cube_cluster = true;
    features.memory_reinterpret = true;
    features.alignment = true;
    register_wmma_features(wmma, &mut props);
    register_mma_features(CudaWmmaCompiler::supported_mma_combinations(&arch), &mut props);
    register_scaled_mma_features(CudaWmmaCompiler::supported_scaled_mma_combinations(&arch), &mut props);
    props
}
