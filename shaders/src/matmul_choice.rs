//! Which kernel multiplies each 2-D shape on the [`MatmulRoute::Block`](crate::MatmulRoute)
//! route: tally's register block ([`RegisterBlock::DEFAULT`]) unless a checked timing
//! ([`crate::matmul_tuning`]) chose another for the shape's class. The browser page tunes and
//! keeps these choices per adapter; natively nothing chooses, so the route is the 8 × 8 block.
//!
//! A shape's class is its dtype, inner and output widths, whether the right-hand side is a
//! transposed view (the LM head) and its rows rounded up to one of [`ROW_CLASSES`]: a score's
//! row counts vary with the request, its widths only with the model.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::str::FromStr;
use std::sync::{LazyLock, Mutex, MutexGuard};

use burn_backend::{calculate_matmul_output, DType, TensorMetadata};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems};
use cubek::matmul::launch::{launch_ref, Strategy};
use cubek::matmul::routines::{double_unit::DoubleUnitSelectionArgs, simple_unit::SimpleUnitSelectionArgs, BlueprintStrategy, TileSizeSelection};
use cubek::std::InputBinding;

use crate::block_matmul::{block_matmul, RegisterBlock};

/// Row counts a class is tuned at: a shape's rows round up to the first that holds them (the
/// last takes everything larger).
pub const ROW_CLASSES: [usize; 4] = [16, 64, 256, 1024];

/// A kernel that can multiply a 2-D shape: tally's register block of some size, or one of
/// cubek's strategies that need neither tensor cores nor features WebGPU lacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MatmulKernel {
    Block(RegisterBlock),
    Cubek(CubekMatmul),
}

/// cubek's matmuls a checked timing tries besides the register blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CubekMatmul {
    /// One output per unit.
    Naive,
    /// Tiled through shared memory, one unit per tile, the largest or the smallest tile.
    SimpleUnitLargeTiles,
    SimpleUnitSmallTiles,
    /// The same, double-buffered (wrong on some shapes in cubek 0.2: see `autotuned_matmul`).
    DoubleUnitSmallTiles,
    /// Vector-matrix kernels for few rows.
    SimpleVecMat,
    DoubleVecMat,
}

impl MatmulKernel {
    /// What a checked timing tries, register blocks first (the usual winners on software adapters).
    pub const CANDIDATES: [MatmulKernel; 10] = [
        MatmulKernel::Block(RegisterBlock::CANDIDATES[0]),
        MatmulKernel::Block(RegisterBlock::CANDIDATES[1]),
        MatmulKernel::Block(RegisterBlock::CANDIDATES[2]),
        MatmulKernel::Block(RegisterBlock::CANDIDATES[3]),
        MatmulKernel::Cubek(CubekMatmul::Naive),
        MatmulKernel::Cubek(CubekMatmul::SimpleUnitLargeTiles),
        MatmulKernel::Cubek(CubekMatmul::SimpleUnitSmallTiles),
        MatmulKernel::Cubek(CubekMatmul::DoubleUnitSmallTiles),
        MatmulKernel::Cubek(CubekMatmul::SimpleVecMat),
        MatmulKernel::Cubek(CubekMatmul::DoubleVecMat),
    ];

    /// The route's kernel where none has been chosen.
    pub const DEFAULT: MatmulKernel = MatmulKernel::Block(RegisterBlock::DEFAULT);

    /// `lhs · rhs` (2-D, same float dtype, float32 accumulation where the kernel has the
    /// choice), or `None` where the kernel declines the shapes or the device.
    pub fn launch<R: CubeRuntime>(self, lhs: &CubeTensor<R>, rhs: &CubeTensor<R>) -> Option<CubeTensor<R>> {
        match self {
            MatmulKernel::Block(block) => block_matmul(lhs, rhs, block),
            MatmulKernel::Cubek(cubek) => launch_cubek(&cubek.strategy(), lhs, rhs),
        }
    }
}

impl CubekMatmul {
    #[cfg(test)]
    const ALL: [CubekMatmul; 6] = [
        CubekMatmul::Naive,
        CubekMatmul::SimpleUnitLargeTiles,
        CubekMatmul::SimpleUnitSmallTiles,
        CubekMatmul::DoubleUnitSmallTiles,
        CubekMatmul::SimpleVecMat,
        CubekMatmul::DoubleVecMat,
    ];

    fn name(self) -> &'static str {
        match self {
            CubekMatmul::Naive => "naive",
            CubekMatmul::SimpleUnitLargeTiles => "simple-unit-large",
            CubekMatmul::SimpleUnitSmallTiles => "simple-unit-small",
            CubekMatmul::DoubleUnitSmallTiles => "double-unit-small",
            CubekMatmul::SimpleVecMat => "simple-vecmat",
            CubekMatmul::DoubleVecMat => "double-vecmat",
        }
    }

    fn strategy(self) -> Strategy {
        let unit = |tile_size| SimpleUnitSelectionArgs { tile_size };
        match self {
            CubekMatmul::Naive => Strategy::Naive,
            CubekMatmul::SimpleUnitLargeTiles => Strategy::SimpleUnit(BlueprintStrategy::Inferred(unit(TileSizeSelection::MaxTileSize))),
            CubekMatmul::SimpleUnitSmallTiles => Strategy::SimpleUnit(BlueprintStrategy::Inferred(unit(TileSizeSelection::MinTileSize))),
            CubekMatmul::DoubleUnitSmallTiles => Strategy::DoubleUnit(BlueprintStrategy::Inferred(DoubleUnitSelectionArgs { tile_size: TileSizeSelection::MinTileSize })),
            CubekMatmul::SimpleVecMat => Strategy::SimpleVecMat(BlueprintStrategy::Inferred(().into())),
            CubekMatmul::DoubleVecMat => Strategy::DoubleVecMat(BlueprintStrategy::Inferred(().into())),
        }
    }
}

/// `block-8x8`, `cubek-naive`, … (the names the page shows and stores).
impl fmt::Display for MatmulKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MatmulKernel::Block(block) => write!(f, "block-{}x{}", block.rows, block.columns),
            MatmulKernel::Cubek(cubek) => write!(f, "cubek-{}", cubek.name()),
        }
    }
}

impl FromStr for MatmulKernel {
    type Err = UnknownMatmul;

    fn from_str(name: &str) -> Result<Self, UnknownMatmul> {
        MatmulKernel::CANDIDATES.into_iter().find(|kernel| kernel.to_string() == name).ok_or_else(|| UnknownMatmul(name.to_string()))
    }
}

#[derive(Debug, thiserror::Error)]
#[error("no matmul kernel or shape class is called {0:?}")]
pub struct UnknownMatmul(pub String);

/// One of cubek's strategies into a fresh contiguous output, or `None` where it declines.
pub(crate) fn launch_cubek<R: CubeRuntime>(strategy: &Strategy, lhs: &CubeTensor<R>, rhs: &CubeTensor<R>) -> Option<CubeTensor<R>> {
    let dtype = lhs.dtype;
    if rhs.dtype != dtype || !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
        return None;
    }
    let shape = calculate_matmul_output(&lhs.shape(), &rhs.shape()).ok()?;
    let out = empty_device_contiguous_dtype(lhs.client.clone(), lhs.device.clone(), shape, dtype);
    let mut dtypes = MatmulElems::from_globals(&MatmulGlobalElems { lhs: dtype.into(), rhs: dtype.into(), out: dtype.into() });
    let (lhs_input, rhs_input) = (InputBinding::new(lhs.clone().binding(), dtype.into()), InputBinding::new(rhs.clone().binding(), dtype.into()));
    launch_ref(strategy, &lhs.client, lhs_input, rhs_input, out.clone().binding(), &mut dtypes).ok()?;
    Some(out)
}

/// The class of a 2-D matmul's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MatmulShape {
    /// One of [`ROW_CLASSES`].
    pub rows: usize,
    pub inner: usize,
    pub columns: usize,
    /// The right-hand side is a transposed view (column-major), as the LM head's is.
    pub rhs_transposed: bool,
    pub dtype: ClassDtype,
}

/// The float types a class can be of (`DType` is neither `Ord` nor `Hash`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ClassDtype {
    F32,
    F16,
    BF16,
}

impl ClassDtype {
    fn of(dtype: DType) -> Option<Self> {
        match dtype {
            DType::F32 => Some(ClassDtype::F32),
            DType::F16 => Some(ClassDtype::F16),
            DType::BF16 => Some(ClassDtype::BF16),
            _ => None,
        }
    }

    pub fn dtype(self) -> DType {
        match self {
            ClassDtype::F32 => DType::F32,
            ClassDtype::F16 => DType::F16,
            ClassDtype::BF16 => DType::BF16,
        }
    }

    fn name(self) -> &'static str {
        match self {
            ClassDtype::F32 => "f32",
            ClassDtype::F16 => "f16",
            ClassDtype::BF16 => "bf16",
        }
    }
}

impl MatmulShape {
    /// The class of `lhs · rhs`, or `None` unless both are 2-D of one float dtype.
    pub fn of<R: CubeRuntime>(lhs: &CubeTensor<R>, rhs: &CubeTensor<R>) -> Option<Self> {
        let (lhs_shape, rhs_shape) = (lhs.shape(), rhs.shape());
        if lhs_shape.num_dims() != 2 || rhs_shape.num_dims() != 2 || lhs.dtype != rhs.dtype {
            return None;
        }
        let strides = rhs.meta.strides();
        Some(MatmulShape {
            rows: row_class(lhs_shape[0]),
            inner: lhs_shape[1],
            columns: rhs_shape[1],
            // A column of one is the same either way round.
            rhs_transposed: strides[1] != 1 && rhs_shape[1] > 1,
            dtype: ClassDtype::of(lhs.dtype)?,
        })
    }
}

/// The first of [`ROW_CLASSES`] that holds `rows` (the last for more).
pub fn row_class(rows: usize) -> usize {
    ROW_CLASSES.into_iter().find(|&class| rows <= class).unwrap_or(ROW_CLASSES[ROW_CLASSES.len() - 1])
}

/// `f32:16x576x960`, with `/T` where the right-hand side is transposed.
impl fmt::Display for MatmulShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}x{}x{}{}", self.dtype.name(), self.rows, self.inner, self.columns, if self.rhs_transposed { "/T" } else { "" })
    }
}

impl FromStr for MatmulShape {
    type Err = UnknownMatmul;

    fn from_str(text: &str) -> Result<Self, UnknownMatmul> {
        let unknown = || UnknownMatmul(text.to_string());
        let (dtype, sizes) = text.split_once(':').ok_or_else(unknown)?;
        let dtype = [ClassDtype::F32, ClassDtype::F16, ClassDtype::BF16].into_iter().find(|d| d.name() == dtype).ok_or_else(unknown)?;
        let (sizes, rhs_transposed) = match sizes.strip_suffix("/T") {
            Some(sizes) => (sizes, true),
            None => (sizes, false),
        };
        let sizes: Vec<usize> = sizes.split('x').map(str::parse).collect::<Result<_, _>>().map_err(|_| unknown())?;
        match sizes[..] {
            [rows, inner, columns] if ROW_CLASSES.contains(&rows) && inner > 0 && columns > 0 => Ok(MatmulShape { rows, inner, columns, rhs_transposed, dtype }),
            _ => Err(unknown()),
        }
    }
}

/// The process's choices, the classes met without one, and a kernel forced for all (tests).
#[derive(Default)]
struct Choices {
    chosen: HashMap<MatmulShape, MatmulKernel>,
    unchosen: BTreeSet<MatmulShape>,
    forced: Option<MatmulKernel>,
}

static CHOICES: LazyLock<Mutex<Choices>> = LazyLock::new(Default::default);

fn choices() -> MutexGuard<'static, Choices> {
    // A panic elsewhere cannot leave the table half-written: every update is one insert.
    CHOICES.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `lhs · rhs` with the kernel chosen for its class (the forced one, if any; else the default,
/// and the class is noted as met without a choice). `None` for shapes no kernel here takes
/// (other ranks, mixed dtypes): the caller's other matmul runs.
pub fn chosen_matmul<R: CubeRuntime>(lhs: &CubeTensor<R>, rhs: &CubeTensor<R>) -> Option<CubeTensor<R>> {
    let shape = MatmulShape::of(lhs, rhs)?;
    let kernel = {
        let mut choices = choices();
        match choices.forced.or_else(|| choices.chosen.get(&shape).copied()) {
            Some(kernel) => kernel,
            None => {
                choices.unchosen.insert(shape);
                MatmulKernel::DEFAULT
            }
        }
    };
    // A chosen cubek kernel may decline rows its class's timing did not have.
    kernel.launch(lhs, rhs).or_else(|| MatmulKernel::DEFAULT.launch(lhs, rhs))
}

/// Uses `kernel` for `shape` from now on.
pub fn set_matmul_choice(shape: MatmulShape, kernel: MatmulKernel) {
    let mut choices = choices();
    choices.unchosen.remove(&shape);
    choices.chosen.insert(shape, kernel);
}

/// Every choice made, in shape order.
pub fn matmul_choices() -> Vec<(MatmulShape, MatmulKernel)> {
    let mut chosen: Vec<_> = choices().chosen.iter().map(|(shape, kernel)| (*shape, *kernel)).collect();
    chosen.sort_by_key(|(shape, _)| *shape);
    chosen
}

/// Classes multiplied since the last choice without one of their own: what to tune next.
pub fn unchosen_matmul_shapes() -> Vec<MatmulShape> {
    choices().unchosen.iter().copied().collect()
}

/// Multiplies every class with `kernel` (`None`: with the choices again). For tests that check
/// each chosen kernel inside the whole model.
pub fn force_matmul(kernel: Option<MatmulKernel>) {
    choices().forced = kernel;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_and_shape_names_read_back() {
        for kernel in MatmulKernel::CANDIDATES {
            assert_eq!(kernel.to_string().parse::<MatmulKernel>().unwrap(), kernel);
        }
        assert_eq!(CubekMatmul::ALL.len() + RegisterBlock::CANDIDATES.len(), MatmulKernel::CANDIDATES.len(), "every kernel is a candidate");
        let head = MatmulShape { rows: 64, inner: 576, columns: 16_384, rhs_transposed: true, dtype: ClassDtype::F32 };
        assert_eq!(head.to_string(), "f32:64x576x16384/T");
        assert_eq!(head.to_string().parse::<MatmulShape>().unwrap(), head);
        let weight = MatmulShape { rows: 1024, inner: 9, columns: 3, rhs_transposed: false, dtype: ClassDtype::BF16 };
        assert_eq!(weight.to_string().parse::<MatmulShape>().unwrap(), weight);
    }

    #[test]
    fn names_that_are_not_kernels_or_classes_are_refused() {
        for name in ["block-3x3", "cubek-cmma", "", "Block-8x8"] {
            assert!(name.parse::<MatmulKernel>().is_err(), "{name:?}");
        }
        // Rows must be a class; widths positive; the dtype known.
        for shape in ["f32:17x576x960", "f32:16x0x960", "f64:16x576x960", "f32:16x576", "16x576x960", "f32:16x576x960/X"] {
            assert!(shape.parse::<MatmulShape>().is_err(), "{shape:?}");
        }
    }

    #[test]
    fn rows_round_up_to_their_class() {
        let classes: Vec<usize> = [1, 16, 17, 64, 65, 256, 257, 1024, 1025, 100_000].into_iter().map(row_class).collect();
        assert_eq!(classes, [16, 16, 64, 64, 256, 256, 1024, 1024, 1024, 1024]);
    }
}
