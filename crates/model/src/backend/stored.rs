//! Block weights on CubeCL backends: a [`BlockMatrix`] packed into tally-shaders' word formats
//! ([`StoredFormat`]) on the device, multiplied a panel at a time — a panel of rows expanded to
//! float by one kernel, then the backend's routed matmul (cuBLASLt or cubek) — the design of
//! llama.cpp's CUDA path for large batches: tensor-core matmuls where there are tensor cores,
//! and the weights' float form never held beyond one panel. On the register-block route (software
//! adapters, the page) one kernel expands the weights in registers instead: writing and reading
//! back float panels made SmolLM2's page score 1.65× slower.
//!
//! GGUF's types map onto the kernel's formats, every value exactly the file's: Q4_0/Q4_1 →
//! 4-bit groups of 32 with f16 scales (as the file, but Q4_0's implied minimum: 20 bytes a
//! group for its 18); Q5_0/Q5_1/Q8_0 → 8-bit groups of 32 (36 bytes for 22, 24 and 34); the
//! K-quants, whose group scales are an f16 times a 6- or 8-bit factor (more bits than an f16
//! holds), with float32 scales: Q4_K → 4-bit groups of 32 (24 bytes for 18), Q5_K → 8-bit
//! groups of 32 (40 for 22), Q6_K → 8-bit groups of 16 (48 bytes a 32 values for 26.25).
//! F16/BF16 stay as they are. Kernels that read the 5- and 6-bit layouts as the file has them
//! would save the rest.

use std::ops::Range;

use burn::tensor::{DType, Shape, Tensor, TensorMetadata, TensorPrimitive};
use burn_cubecl::cubecl::prelude::ComputeClient;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use tally_shaders::{routes_to_block, RowPick, Scales, StoredFormat, StoredRows, WordWriter};

use super::BlockWeight;
use crate::blocks::{BlockMatrix, BlockRows};
use crate::gguf::TensorType;

/// How large a stored matrix's device buffers and expanded panels may grow.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Bytes of words in one device buffer.
    pub piece_bytes: usize,
    /// Bytes of one expanded panel of rows.
    pub panel_bytes: usize,
}

impl Limits {
    /// WebGPU guarantees bindings of 128 MiB, no more; a 32 MiB panel is a few matmuls for the
    /// largest LM head and a small transient on any device.
    pub const DEFAULT: Limits = Limits { piece_bytes: 64 << 20, panel_bytes: 32 << 20 };
}

/// A weight matrix in the kernel's formats on the device: pieces of consecutive rows, each one
/// format (a fused projection's segments keep their own) and at most [`Limits::piece_bytes`].
#[derive(Clone)]
pub struct StoredMatrix<R: CubeRuntime> {
    pieces: Vec<StoredRows<R>>,
    rows: usize,
    cols: usize,
    panel_bytes: usize,
}

impl<R: CubeRuntime> BlockWeight for StoredMatrix<R> {
    fn rows(&self) -> usize {
        self.rows
    }

    fn stored_bytes(&self) -> usize {
        self.pieces.iter().map(StoredRows::bytes).sum()
    }
}

impl<R: CubeRuntime> StoredMatrix<R> {
    /// `matrix` packed and copied to the device; `None` where a segment does not fit a format
    /// (a half-precision row of odd width, a minimum no f16 holds), or is 16-bit while the
    /// backend computes in 16 bits (a float tensor is then as small, and multiplies directly).
    pub fn pack(matrix: &BlockMatrix, compute: DType, limits: Limits, client: &ComputeClient<R>, device: &R::Device) -> Option<Self> {
        let cols = matrix.cols();
        let mut pieces = Vec::new();
        for segment in matrix.segments() {
            let format = kernel_format(segment.kind())?;
            if matches!(format, StoredFormat::F16 | StoredFormat::BF16) && compute != DType::F32 {
                return None;
            }
            let row_words = format.row_words(cols)?;
            let piece_rows = (limits.piece_bytes / (4 * row_words)).max(1);
            for rows in BlockMatrix::panels(0..segment.rows(), piece_rows) {
                let words = pack_rows(segment, rows.clone(), cols, format)?;
                pieces.push(StoredRows::upload(client, device, format, rows.len(), cols, &words));
            }
        }
        Some(StoredMatrix { pieces, rows: matrix.rows(), cols, panel_bytes: limits.panel_bytes })
    }

    /// Its device buffers' rows, top to bottom.
    pub fn piece_rows(&self) -> Vec<usize> {
        self.pieces.iter().map(StoredRows::rows).collect()
    }

    /// Row ranges of each piece in the matrix, with the piece.
    fn placed_pieces(&self) -> impl Iterator<Item = (Range<usize>, &StoredRows<R>)> {
        self.pieces.iter().scan(0, |first, piece| {
            let rows = *first..*first + piece.rows();
            *first = rows.end;
            Some((rows, piece))
        })
    }

    /// The pieces holding rows of `rows`: each with those rows (in the piece) and where they
    /// start in `rows`.
    fn pieces_over(&self, rows: Range<usize>) -> impl Iterator<Item = (&StoredRows<R>, Range<usize>, usize)> {
        self.placed_pieces().filter_map(move |(placed, piece)| {
            let (start, end) = (rows.start.max(placed.start), rows.end.min(placed.end));
            (start < end).then(|| (piece, start - placed.start..end - placed.start, start - rows.start))
        })
    }

    /// `x · self[rows]ᵀ`: on the register-block route (`--matmul block`, the page's kernels) by
    /// the kernel that expands weights in registers; else a panel of expanded rows at a time,
    /// each multiplied by `matmul` (the routed matmul: tensor cores where there are some).
    pub fn matmul<F, I, BT>(&self, x: Tensor<CubeBackend<R, F, I, BT>, 2>, rows: Range<usize>, matmul: impl Fn(Tensor<CubeBackend<R, F, I, BT>, 2>, Tensor<CubeBackend<R, F, I, BT>, 2>) -> Tensor<CubeBackend<R, F, I, BT>, 2>) -> Tensor<CubeBackend<R, F, I, BT>, 2>
    where
        F: FloatElement,
        I: IntElement,
        BT: BoolElement,
    {
        assert!(rows.end <= self.rows && !rows.is_empty(), "rows {rows:?} of {}", self.rows);
        let dtype = x.dtype();
        if routes_to_block(dtype) {
            let x = x.into_primitive().tensor();
            let out = empty_device_contiguous_dtype(x.client.clone(), x.device.clone(), Shape::new([x.shape()[0], rows.len()]), dtype);
            for (piece, local, column) in self.pieces_over(rows) {
                piece.matmul_into(&x, local, &out, column);
            }
            return Tensor::from_primitive(TensorPrimitive::Float(out));
        }
        let panel_rows = (self.panel_bytes / (dtype.size() * self.cols)).max(1);
        let mut products = Vec::new();
        for (piece, local, _) in self.pieces_over(rows) {
            for panel in BlockMatrix::panels(local, panel_rows) {
                let weights = Tensor::<CubeBackend<R, F, I, BT>, 2>::from_primitive(TensorPrimitive::Float(piece.expand(RowPick::Range(panel), dtype)));
                products.push(matmul(x.clone(), weights.transpose()));
            }
        }
        if products.len() == 1 {
            return products.pop().expect("one product");
        }
        Tensor::cat(products, 1)
    }

    /// Rows `ids` as float `dtype`, `[ids.len(), cols]`.
    pub fn rows<F, I, BT>(&self, ids: &[u32], dtype: DType) -> Tensor<CubeBackend<R, F, I, BT>, 2>
    where
        F: FloatElement,
        I: IntElement,
        BT: BoolElement,
    {
        let expand = |piece: &StoredRows<R>, ids: &[u32]| Tensor::<CubeBackend<R, F, I, BT>, 2>::from_primitive(TensorPrimitive::Float(piece.expand(RowPick::Listed(ids), dtype)));
        if let [piece] = &self.pieces[..] {
            return expand(piece, ids);
        }
        // Each piece expands the ids it holds; one gather puts the rows back in the ids' order.
        let mut expanded = Vec::new();
        let mut position = vec![0i64; ids.len()];
        let mut done = 0;
        for (placed, piece) in self.placed_pieces() {
            let (held, local): (Vec<usize>, Vec<u32>) = ids.iter().enumerate().filter(|(_, &id)| placed.contains(&(id as usize))).map(|(i, &id)| (i, id - placed.start as u32)).unzip();
            if held.is_empty() {
                continue;
            }
            for (n, i) in held.iter().enumerate() {
                position[*i] = (done + n) as i64;
            }
            done += held.len();
            expanded.push(expand(piece, &local));
        }
        let device = expanded[0].device();
        let order = Tensor::from_data(burn::tensor::TensorData::new(position, [ids.len()]), &device);
        Tensor::cat(expanded, 0).select(0, order)
    }
}

/// The kernel's format for a GGUF type (see the module's docs); `None` for float32.
fn kernel_format(kind: TensorType) -> Option<StoredFormat> {
    let scales = if matches!(kind, TensorType::Q4K | TensorType::Q5K | TensorType::Q6K) { Scales::Single } else { Scales::Half };
    match kind {
        TensorType::F16 => Some(StoredFormat::F16),
        TensorType::BF16 => Some(StoredFormat::BF16),
        kind => {
            let (bits, group) = kind.affine_layout()?;
            Some(StoredFormat::Affine { bits: if bits <= 4 { 4 } else { 8 }, group: group as u32, scales })
        }
    }
}

/// Rows `rows` of `segment`, packed in `format`; `None` where a scale or minimum does not fit it.
fn pack_rows(segment: &BlockRows, rows: Range<usize>, cols: usize, format: StoredFormat) -> Option<Vec<u32>> {
    let kind = segment.kind();
    let mut writer = WordWriter::new(format, rows.len() * format.row_words(cols)?);
    if matches!(format, StoredFormat::F16 | StoredFormat::BF16) {
        for row in rows {
            writer.push_halves(segment.row(row, cols).chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])));
        }
        return Some(writer.finish());
    }
    let (_, block_bytes) = kind.block()?;
    let mut exact = true;
    for row in rows {
        for block in segment.row(row, cols).chunks_exact(block_bytes) {
            kind.affine_groups(block, &mut |scale, min, q| exact &= writer.push_group(scale, min, q));
        }
    }
    exact.then(|| writer.finish())
}
