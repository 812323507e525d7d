//! Weight matrices kept in their file's storage format: GGUF's quantised blocks (Q4_0 … Q8_0, the
//! K-quants) and 16-bit floats, rows of `[out, in]` as the file stores them. A backend that
//! multiplies them directly (the CPU: a panel of rows dequantised at a time, then a float
//! matmul) holds these instead of a float32 copy two to eight times larger; the others get float
//! tensors dequantised at load.
//!
//! A [`BlockMatrix`] is made of [`BlockRows`] segments (a fused projection: q, k and v one after
//! another, each in its own format), each a byte range of the model file — shared, and
//! memory-mapped natively, so the weights are the file's own pages — or bytes of its own,
//! optionally read in another row order (Llama's q/k rows, which GGUF permutes).

use std::ops::Range;
use std::sync::Arc;

use crate::file_data::{FileData, SharedBytes};
use crate::gguf::TensorType;

/// Where a segment's bytes live.
#[derive(Clone)]
pub enum BlockBytes {
    /// A byte range of a model file in memory (mapped or owned), shared by every weight read from it.
    File { file: SharedBytes, range: Range<usize> },
    Owned(Arc<[u8]>),
}

impl BlockBytes {
    /// Bytes `range` of a model file: a view of it where it is in memory, a copy where the file
    /// is only reachable a range at a time (the browser's, kept in JS); `None` past its end.
    pub fn from_file(data: &FileData, range: Range<usize>) -> Option<Self> {
        match data.shared() {
            Some(file) => (range.end <= file.bytes().len() && range.start <= range.end).then_some(BlockBytes::File { file, range }),
            None => Some(BlockBytes::Owned(data.get(range)?.into_owned().into())),
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            BlockBytes::File { file, range } => &file.bytes()[range.clone()],
            BlockBytes::Owned(bytes) => bytes,
        }
    }
}

/// Consecutive rows of a [`BlockMatrix`] from one tensor, in one storage format.
#[derive(Clone)]
pub struct BlockRows {
    kind: TensorType,
    bytes: BlockBytes,
    rows: usize,
    /// Row `r` of the segment is stored row `order[r]` (`None`: in order).
    order: Option<Arc<[u32]>>,
}

impl BlockRows {
    /// `rows` rows of `kind` stored in order in `bytes`; `None` for float32 (nothing to keep
    /// compact) or a type tally does not read.
    pub fn new(kind: TensorType, bytes: BlockBytes, rows: usize) -> Option<Self> {
        (kind != TensorType::F32 && kind.block().is_some()).then_some(BlockRows { kind, bytes, rows, order: None })
    }

    /// The same rows read in another order: row `r` is stored row `order[r]`.
    pub fn reordered(mut self, order: Vec<u32>) -> Self {
        assert_eq!(order.len(), self.rows, "one stored row per row");
        self.order = Some(order.into());
        self
    }

    fn row_bytes(&self, cols: usize) -> Option<usize> {
        self.kind.byte_len(cols)
    }

    pub fn kind(&self) -> TensorType {
        self.kind
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The bytes of row `row` (rows `cols` values wide), read in the segment's order.
    pub fn row(&self, row: usize, cols: usize) -> &[u8] {
        let stored = self.order.as_ref().map_or(row, |order| order[row] as usize);
        let width = self.row_bytes(cols).expect("rows of whole blocks");
        &self.bytes.bytes()[stored * width..(stored + 1) * width]
    }
}

/// A `[rows, cols]` matrix stored a row at a time in its segments' formats.
#[derive(Clone)]
pub struct BlockMatrix {
    rows: usize,
    cols: usize,
    segments: Vec<BlockRows>,
}

impl std::fmt::Debug for BlockMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kinds: Vec<String> = self.segments.iter().map(|s| format!("{}x{}", s.rows, s.kind)).collect();
        write!(f, "BlockMatrix({}x{}: {})", self.rows, self.cols, kinds.join(" + "))
    }
}

impl BlockMatrix {
    /// `segments` stacked, rows of `cols` values each; `None` where a segment's rows are not
    /// whole blocks of its format, or its bytes are not its rows.
    pub fn new(cols: usize, segments: Vec<BlockRows>) -> Option<Self> {
        for segment in &segments {
            let row_bytes = segment.row_bytes(cols)?;
            if segment.bytes.bytes().len() != segment.rows * row_bytes {
                return None;
            }
        }
        let rows = segments.iter().map(|s| s.rows).sum();
        (rows > 0 && cols > 0).then_some(BlockMatrix { rows, cols, segments })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes of its rows as stored.
    pub fn stored_bytes(&self) -> usize {
        self.segments.iter().map(|s| s.rows * s.row_bytes(self.cols).expect("checked in new")).sum()
    }

    /// Its segments, top to bottom.
    pub fn segments(&self) -> &[BlockRows] {
        &self.segments
    }

    /// Row `row` as float32 into `out` (`cols` long): exactly what dequantising the whole tensor
    /// at load gives.
    pub fn dequantize_row(&self, mut row: usize, out: &mut [f32]) {
        for segment in &self.segments {
            if row < segment.rows {
                segment.kind.dequantize_into(segment.row(row, self.cols), out);
                return;
            }
            row -= segment.rows;
        }
        panic!("row {row} past the matrix's {} rows", self.rows)
    }

    /// Rows `rows` as float32, row-major.
    pub fn dequantize_rows(&self, rows: impl ExactSizeIterator<Item = usize>) -> Vec<f32> {
        let mut out = vec![0f32; rows.len() * self.cols];
        for (row, values) in rows.zip(out.chunks_exact_mut(self.cols)) {
            self.dequantize_row(row, values);
        }
        out
    }

    /// Row ranges of at most `rows` rows covering `range`: the panels a kernel dequantises one at a time.
    pub fn panels(range: Range<usize>, rows: usize) -> impl Iterator<Item = Range<usize>> {
        range.clone().step_by(rows).map(move |start| start..(start + rows).min(range.end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Q8_0 rows with d = 1 whose value at (r, c) is `(7r + 3·(c / 32) + c % 32) mod 100`.
    fn q8_rows(rows: usize, cols: usize) -> Vec<u8> {
        let mut bytes = Vec::new();
        for r in 0..rows {
            for block in 0..cols / 32 {
                bytes.extend(half::f16::from_f32(1.0).to_le_bytes());
                bytes.extend((0..32).map(|j| ((r * 7 + block * 3 + j) % 100) as i8 as u8));
            }
        }
        bytes
    }

    fn expected_row(r: usize, cols: usize) -> Vec<f32> {
        (0..cols).map(|c| ((r * 7 + c / 32 * 3 + c % 32) % 100) as f32).collect()
    }

    #[test]
    fn segments_stack_in_their_own_formats_and_orders() {
        let cols = 64;
        let q8 = BlockRows::new(TensorType::Q8_0, BlockBytes::Owned(q8_rows(3, cols).into()), 3).unwrap();
        let halves: Vec<u8> = (0..2 * cols).flat_map(|i| half::f16::from_f32(i as f32).to_le_bytes()).collect();
        let f16 = BlockRows::new(TensorType::F16, BlockBytes::Owned(halves.into()), 2).unwrap().reordered(vec![1, 0]);
        let matrix = BlockMatrix::new(cols, vec![q8, f16]).unwrap();
        assert_eq!((matrix.rows(), matrix.stored_bytes()), (5, 3 * 2 * 34 + 2 * cols * 2));
        let got = matrix.dequantize_rows(0..5);
        let rows: Vec<&[f32]> = got.chunks_exact(cols).collect();
        assert_eq!((rows[0], rows[2]), (&expected_row(0, cols)[..], &expected_row(2, cols)[..]));
        let f16_row = |r: usize| -> Vec<f32> { (r * cols..(r + 1) * cols).map(|i| i as f32).collect() };
        assert_eq!((rows[3], rows[4]), (&f16_row(1)[..], &f16_row(0)[..]), "the second segment reads stored rows 1, 0");
    }

    #[test]
    fn only_whole_rows_of_blocks_make_a_matrix() {
        let q8 = || BlockRows::new(TensorType::Q8_0, BlockBytes::Owned(q8_rows(2, 64).into()), 2).unwrap();
        assert!(BlockMatrix::new(64, vec![q8()]).is_some());
        assert!(BlockMatrix::new(48, vec![q8()]).is_none(), "48 values are not whole blocks of 32");
        assert!(BlockMatrix::new(32, vec![q8()]).is_none(), "the bytes hold two rows of 64, not of 32");
        assert!(BlockRows::new(TensorType::F32, BlockBytes::Owned(Arc::from(vec![0u8; 8])), 1).is_none(), "float32 is read as float");
    }

    #[test]
    fn panels_cover_a_range_without_overlap() {
        let panels: Vec<_> = BlockMatrix::panels(3..13, 4).collect();
        assert_eq!(panels, [3..7, 7..11, 11..13]);
        assert_eq!(BlockMatrix::panels(0..4, 4).collect::<Vec<_>>(), [0..4]);
    }
}
