//! Weight matrices kept compact on the device: rows of quantised groups or 16-bit floats packed
//! into 32-bit words (WGSL has no 8- or 16-bit storage), and the kernel that expands rows of
//! them to float — for the embeddings (rows by token id) and for a matmul that multiplies one
//! panel of expanded rows at a time, so only the panel is ever float.
//!
//! Word layouts, row after row, each row `StoredFormat::row_words` words:
//!
//! | format | per group | values |
//! |---|---|---|
//! | `Affine { bits: 4, group: 32, .. }` | scale words + 4 words | `x = q·scale + min`, value `i` in bits `4(i % 8)` of word `i / 8` |
//! | `Affine { bits: 8, group: 32, .. }` | scale words + 8 words | value `i` in byte `i % 4` of word `i / 4` |
//! | `Affine { bits: 8, group: 16, .. }` | scale words + 4 words | as above |
//! | `F16`, `BF16` | — | value `2j` in the low half of word `j`, `2j + 1` in the high half |
//!
//! `q` is unsigned. The scale words ([`Scales`]): one word, `scale` (f16) in its low half and
//! `min` (f16) in its high half — GGUF's Q4_0 … Q8_0, whose scales are f16 — or two float32
//! words, for the K-quants, whose group scales are an f16 times a 6- or 8-bit factor. Either way
//! each value is exactly the file's. Halves decode from their bits with integer operations, so
//! no format needs the `shader-f16` feature.

use std::ops::Range;

use burn_backend::{DType, Shape, TensorMetadata};
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use half::f16;

use crate::grid::{cube_index, cubes};

/// Units per cube of the expanding kernel, one word of values each.
const UNITS: usize = 256;

/// How a stored matrix's rows are packed into words (see the module's table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StoredFormat {
    /// Groups of `group` unsigned `bits`-bit values (4 or 8) sharing a scale and a minimum.
    Affine { bits: u32, group: u32, scales: Scales },
    F16,
    BF16,
}

/// How an affine group's scale and minimum are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scales {
    /// Both f16, in one word.
    Half,
    /// Both float32, a word each.
    Single,
}

impl Scales {
    fn words(self) -> usize {
        match self {
            Scales::Half => 1,
            Scales::Single => 2,
        }
    }
}

impl StoredFormat {
    /// Words of one row of `cols` values; `None` where `cols` is not whole groups (or words).
    pub fn row_words(self, cols: usize) -> Option<usize> {
        match self {
            StoredFormat::Affine { bits, group, scales } => {
                let (bits, group) = (bits as usize, group as usize);
                cols.is_multiple_of(group).then(|| cols / group * (scales.words() + group * bits / 32))
            }
            StoredFormat::F16 | StoredFormat::BF16 => cols.is_multiple_of(2).then_some(cols / 2),
        }
    }

    /// Words that each hold values (not scales) in a row of `cols`: what one unit expands.
    fn value_words(self, cols: usize) -> usize {
        match self {
            StoredFormat::Affine { bits, .. } => cols * bits as usize / 32,
            StoredFormat::F16 | StoredFormat::BF16 => cols / 2,
        }
    }

    /// The kernel's comptime description: (kind, bits, group, float32 scales).
    fn comptime(self) -> (u32, u32, u32, bool) {
        match self {
            StoredFormat::Affine { bits, group, scales } => (AFFINE, bits, group, scales == Scales::Single),
            StoredFormat::F16 => (F16_BITS, 16, 2, false),
            StoredFormat::BF16 => (BF16_BITS, 16, 2, false),
        }
    }
}

const AFFINE: u32 = 0;
const F16_BITS: u32 = 1;
const BF16_BITS: u32 = 2;

/// Packs rows in a [`StoredFormat`], group by group (affine) or value by value (halves).
pub struct WordWriter {
    format: StoredFormat,
    words: Vec<u32>,
    /// Values of the word being filled, and their count.
    pending: u32,
    filled: u32,
}

impl WordWriter {
    pub fn new(format: StoredFormat, capacity_words: usize) -> Self {
        WordWriter { format, words: Vec::with_capacity(capacity_words), pending: 0, filled: 0 }
    }

    /// One affine group: `x = q·scale + min`, `q` `group` values of `bits` bits each. Returns
    /// whether the format holds `scale` and `min` exactly (f16 scales round others).
    pub fn push_group(&mut self, scale: f32, min: f32, q: &[u8]) -> bool {
        let StoredFormat::Affine { bits, group, scales } = self.format else { panic!("{:?} has no groups", self.format) };
        assert_eq!(q.len(), group as usize, "one group of values");
        let exact = match scales {
            Scales::Half => {
                let (half_scale, half_min) = (f16::from_f32(scale), f16::from_f32(min));
                self.words.push(u32::from(half_scale.to_bits()) | (u32::from(half_min.to_bits()) << 16));
                half_scale.to_f32() == scale && half_min.to_f32() == min
            }
            Scales::Single => {
                self.words.extend([scale.to_bits(), min.to_bits()]);
                true
            }
        };
        for &value in q {
            debug_assert!(u32::from(value) < 1 << bits, "{value} takes more than {bits} bits");
            self.push_bits(u32::from(value), bits);
        }
        exact
    }

    /// 16-bit floats, as their bits (an even number of them per row).
    pub fn push_halves(&mut self, halves: impl IntoIterator<Item = u16>) {
        assert!(matches!(self.format, StoredFormat::F16 | StoredFormat::BF16), "{:?} does not hold halves", self.format);
        for half in halves {
            self.push_bits(u32::from(half), 16);
        }
    }

    fn push_bits(&mut self, value: u32, bits: u32) {
        self.pending |= value << (self.filled * bits);
        self.filled += 1;
        if self.filled * bits == 32 {
            self.words.push(self.pending);
            (self.pending, self.filled) = (0, 0);
        }
    }

    /// The words; panics on a word left half full (a row that is not whole words).
    pub fn finish(self) -> Vec<u32> {
        assert_eq!(self.filled, 0, "rows end on whole words");
        self.words
    }
}

/// Rows of one [`StoredFormat`] on the device.
#[derive(Clone)]
pub struct StoredRows<R: CubeRuntime> {
    words: CubeTensor<R>,
    format: StoredFormat,
    rows: usize,
    cols: usize,
}

/// Which rows of a [`StoredRows`] to expand.
pub enum RowPick<'a> {
    Range(Range<usize>),
    /// Rows by index (token ids), in this order; repeats allowed.
    Listed(&'a [u32]),
}

impl<R: CubeRuntime> StoredRows<R> {
    /// `rows` rows of `cols` values packed in `words` ([`WordWriter`]), copied to `device`.
    pub fn upload(client: &ComputeClient<R>, device: &R::Device, format: StoredFormat, rows: usize, cols: usize, words: &[u32]) -> Self {
        let row_words = format.row_words(cols).expect("rows of whole groups");
        assert_eq!(words.len(), rows * row_words, "{rows} rows of {row_words} words");
        StoredRows { words: upload_u32(client, device, words), format, rows, cols }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Bytes held on the device.
    pub fn bytes(&self) -> usize {
        self.rows * self.format.row_words(self.cols).expect("checked at upload") * 4
    }

    /// The picked rows as float `dtype`, `[rows, cols]`, contiguous: exactly `q·scale + min`
    /// (or the half's value), rounded once to `dtype`.
    pub fn expand(&self, pick: RowPick<'_>, dtype: DType) -> CubeTensor<R> {
        let (client, device) = (self.words.client.clone(), self.words.device.clone());
        let listed = matches!(pick, RowPick::Listed(_));
        let (first, count, ids) = match pick {
            RowPick::Range(range) => {
                assert!(range.end <= self.rows, "rows {range:?} of {}", self.rows);
                // The ids tensor is not read; any buffer stands in for it.
                (range.start, range.len(), self.words.clone())
            }
            RowPick::Listed(ids) => {
                assert!(ids.iter().all(|&id| (id as usize) < self.rows), "row ids below {}", self.rows);
                (0, ids.len(), upload_u32(&client, &device, ids))
            }
        };
        let out = empty_device_contiguous_dtype(client.clone(), device, Shape::new([count, self.cols]), dtype);
        let units = count * self.format.value_words(self.cols);
        if units == 0 {
            return out;
        }
        let (kind, bits, group, single_scales) = self.format.comptime();
        let row_words = self.format.row_words(self.cols).expect("checked at upload");
        // Unchecked: every unit past the last returns before reading, and ids are checked above.
        unsafe {
            expand_rows_kernel::launch_unchecked::<R>(
                &client,
                cubes(units.div_ceil(UNITS), 1),
                CubeDim::new_1d(UNITS as u32),
                self.words.clone().into_tensor_arg(),
                ids.into_tensor_arg(),
                out.clone().into_tensor_arg(),
                units as u32,
                first as u32,
                self.format.value_words(self.cols) as u32,
                row_words as u32,
                kind,
                bits,
                group,
                single_scales,
                listed,
                dtype.into(),
            )
        };
        out
    }

    /// `x · self[rows]ᵀ` into columns `first_column..first_column + rows.len()` of `out`
    /// (`[m, out_cols]`, contiguous, `x`'s dtype), each unit keeping a block of 8 × 8 outputs in
    /// registers and expanding the weights it reads there — the register-block matmul
    /// (`block_matmul`) reading words: no float panel is written or read back, which is what
    /// costs on software adapters.
    pub fn matmul_into(&self, x: &CubeTensor<R>, rows: Range<usize>, out: &CubeTensor<R>, first_column: usize) {
        let x = into_contiguous(x.clone());
        let [m, k] = x.shape().dims::<2>();
        let out_cols = out.shape()[1];
        assert!(k == self.cols && rows.end <= self.rows && first_column + rows.len() <= out_cols && out.shape()[0] == m, "x [{m}, {k}] · rows {rows:?} of [{}, {}] into columns {first_column}.. of {out_cols}", self.rows, self.cols);
        let blocks = m.div_ceil(MATMUL_BLOCK) * rows.len().div_ceil(MATMUL_BLOCK);
        if blocks == 0 {
            return;
        }
        let (kind, bits, group, single_scales) = self.format.comptime();
        // Unchecked: reads are clamped into the operands and writes guarded (see the kernel).
        unsafe {
            stored_matmul_kernel::launch_unchecked::<R>(
                &x.client,
                cubes(blocks.div_ceil(MATMUL_UNITS), 1),
                CubeDim::new_1d(MATMUL_UNITS as u32),
                x.clone().into_tensor_arg(),
                self.words.clone().into_tensor_arg(),
                out.clone().into_tensor_arg(),
                m as u32,
                k as u32,
                rows.start as u32,
                rows.len() as u32,
                first_column as u32,
                out_cols as u32,
                self.format.row_words(self.cols).expect("checked at upload") as u32,
                kind,
                bits,
                group,
                single_scales,
                x.dtype.into(),
            )
        };
    }
}

/// Outputs along each side of a unit's block in [`StoredRows::matmul_into`].
const MATMUL_BLOCK: usize = 8;
/// Units per cube of it.
const MATMUL_UNITS: usize = 64;

/// One unit per 8 × 8 block of outputs: x rows `first_row..+8` × weight rows `first..+8`
/// (rows past the edge read the last one and are never written). Weight values are expanded
/// once per unit, each used for 8 rows of `x`.
#[cube(launch_unchecked)]
fn stored_matmul_kernel<F: Float>(
    x: &Tensor<F>,
    words: &Tensor<u32>,
    out: &mut Tensor<F>,
    m: u32,
    k: u32,
    first_weight_row: u32,
    weight_rows: u32,
    first_column: u32,
    out_cols: u32,
    row_words: u32,
    #[comptime] kind: u32,
    #[comptime] bits: u32,
    #[comptime] group: u32,
    #[comptime] single_scales: bool,
    #[define(F)] _dtype: StorageType,
) {
    let block_side = comptime![MATMUL_BLOCK];
    let (m, k, weight_rows) = (m as usize, k as usize, weight_rows as usize);
    let column_blocks = weight_rows.div_ceil(block_side);
    let block = cube_index() * MATMUL_UNITS + UNIT_POS_X as usize;
    let first_row = block / column_blocks * block_side;
    let first_weight = block % column_blocks * block_side;
    if first_row < m {
        let mut x_rows = Array::<usize>::new(block_side);
        #[unroll]
        for i in 0..block_side {
            let row = first_row + i;
            x_rows[i] = if row < m { row } else { m - 1 } * k;
        }
        let mut weight_starts = Array::<usize>::new(block_side);
        #[unroll]
        for j in 0..block_side {
            let row = first_weight + j;
            weight_starts[j] = (first_weight_row as usize + if row < weight_rows { row } else { weight_rows - 1 }) * row_words as usize;
        }
        let mut sums = Array::<f32>::new(comptime![MATMUL_BLOCK * MATMUL_BLOCK]);
        #[unroll]
        for i in 0..comptime![MATMUL_BLOCK * MATMUL_BLOCK] {
            sums[i] = 0.0;
        }
        let per_word = comptime![(32 / bits) as usize];
        let mut a = Array::<f32>::new(block_side);
        let mut packed = Array::<u32>::new(block_side);
        let mut scales = Array::<f32>::new(block_side);
        let mut mins = Array::<f32>::new(block_side);
        if comptime![kind == AFFINE] {
            let group_words = comptime![(group * bits / 32) as usize];
            let scale_words = comptime![if single_scales { 2usize } else { 1usize }];
            let mask = comptime![(1u32 << bits) - 1];
            let groups = k / comptime![group as usize];
            for g in 0..groups {
                let group_offset = g * (group_words + scale_words);
                #[unroll]
                for j in 0..block_side {
                    scales[j] = group_scale(words, weight_starts[j] + group_offset, single_scales);
                    mins[j] = group_min(words, weight_starts[j] + group_offset, single_scales);
                }
                for w in 0..group_words {
                    #[unroll]
                    for j in 0..block_side {
                        packed[j] = words[weight_starts[j] + group_offset + scale_words + w];
                    }
                    #[unroll]
                    for v in 0..per_word {
                        let step = g * comptime![group as usize] + w * per_word + v;
                        #[unroll]
                        for i in 0..block_side {
                            a[i] = f32::cast_from(x[x_rows[i] + step]);
                        }
                        #[unroll]
                        for j in 0..block_side {
                            let q = (packed[j] >> (comptime![v as u32] * bits)) & mask;
                            let weight = f32::cast_from(q) * scales[j] + mins[j];
                            #[unroll]
                            for i in 0..block_side {
                                sums[i * block_side + j] += a[i] * weight;
                            }
                        }
                    }
                }
            }
        } else {
            for w in 0..k / 2 {
                #[unroll]
                for j in 0..block_side {
                    packed[j] = words[weight_starts[j] + w];
                }
                #[unroll]
                for v in 0..2usize {
                    #[unroll]
                    for i in 0..block_side {
                        a[i] = f32::cast_from(x[x_rows[i] + 2 * w + v]);
                    }
                    #[unroll]
                    for j in 0..block_side {
                        let weight = half_value((packed[j] >> comptime![16 * v as u32]) & 0xFFFF, kind);
                        #[unroll]
                        for i in 0..block_side {
                            sums[i * block_side + j] += a[i] * weight;
                        }
                    }
                }
            }
        }
        #[unroll]
        for i in 0..block_side {
            #[unroll]
            for j in 0..block_side {
                let (row, weight) = (first_row + i, first_weight + j);
                if row < m && weight < weight_rows {
                    out[row * out_cols as usize + first_column as usize + weight] = F::cast_from(sums[i * block_side + j]);
                }
            }
        }
    }
}

fn upload_u32<R: CubeRuntime>(client: &ComputeClient<R>, device: &R::Device, values: &[u32]) -> CubeTensor<R> {
    // A buffer cannot be empty.
    let bytes: Vec<u8> = if values.is_empty() { vec![0; 4] } else { values.iter().flat_map(|v| v.to_le_bytes()).collect() };
    CubeTensor::new_contiguous(client.clone(), device.clone(), Shape::new([bytes.len() / 4]), client.create_from_slice(&bytes), DType::U32)
}

/// One unit per word of values: unit `u` expands value word `u % value_words` of output row
/// `u / value_words` (stored row `first + that`, or `ids[that]` where `listed`).
#[cube(launch_unchecked)]
fn expand_rows_kernel<F: Float>(
    words: &Tensor<u32>,
    ids: &Tensor<u32>,
    out: &mut Tensor<F>,
    units: u32,
    first: u32,
    value_words: u32,
    row_words: u32,
    #[comptime] kind: u32,
    #[comptime] bits: u32,
    #[comptime] group: u32,
    #[comptime] single_scales: bool,
    #[comptime] listed: bool,
    #[define(F)] _dtype: StorageType,
) {
    let unit = cube_index() * UNITS + UNIT_POS_X as usize;
    if unit < units as usize {
        let (out_row, word) = (unit / value_words as usize, unit % value_words as usize);
        let stored_row = if comptime![listed] { ids[out_row] as usize } else { first as usize + out_row };
        let row_start = stored_row * row_words as usize;
        let per_word = comptime![32 / bits];
        let out_start = out_row * (value_words as usize * comptime![per_word as usize]) + word * comptime![per_word as usize];
        if comptime![kind == AFFINE] {
            let group_words = comptime![(group * bits / 32) as usize];
            let scale_words = comptime![if single_scales { 2usize } else { 1usize }];
            let group_index = word / group_words;
            let group_start = row_start + group_index * (group_words + scale_words);
            let scale = group_scale(words, group_start, single_scales);
            let min = group_min(words, group_start, single_scales);
            let values = words[group_start + scale_words + word % group_words];
            let mask = comptime![(1u32 << bits) - 1];
            #[unroll]
            for i in 0..per_word {
                let q = (values >> (i * bits)) & mask;
                out[out_start + i as usize] = F::cast_from(f32::cast_from(q) * scale + min);
            }
        } else {
            let values = words[row_start + word];
            out[out_start] = F::cast_from(half_value(values & 0xFFFF, kind));
            out[out_start + 1] = F::cast_from(half_value(values >> 16, kind));
        }
    }
}

/// The scale of the affine group whose scale words start at `start`.
#[cube]
fn group_scale(words: &Tensor<u32>, start: usize, #[comptime] single_scales: bool) -> f32 {
    if comptime![single_scales] { f32::reinterpret(words[start]) } else { half_to_f32(words[start] & 0xFFFF) }
}

/// The minimum of the affine group whose scale words start at `start`.
#[cube]
fn group_min(words: &Tensor<u32>, start: usize, #[comptime] single_scales: bool) -> f32 {
    if comptime![single_scales] { f32::reinterpret(words[start + 1]) } else { half_to_f32(words[start] >> 16) }
}

/// The value of a 16-bit float of format `kind` (`F16_BITS` or `BF16_BITS`) from its bits (in
/// the low half of `bits`), exactly.
#[cube]
fn half_value(bits: u32, #[comptime] kind: u32) -> f32 {
    if comptime![kind == F16_BITS] { half_to_f32(bits) } else { f32::reinterpret(bits << 16) }
}

/// An IEEE half's value from its 16 bits (in the low half of `bits`), exactly.
#[cube]
fn half_to_f32(bits: u32) -> f32 {
    let exponent = (bits >> 10) & 0x1F;
    let mantissa = bits & 0x3FF;
    // Subnormal halves (and zero) are `mantissa · 2⁻²⁴`; infinities and NaNs keep their mantissa.
    let magnitude = if exponent == 0 {
        u32::reinterpret(f32::cast_from(mantissa) / 16_777_216.0)
    } else if exponent == 0x1F {
        0x7F80_0000u32 | (mantissa << 13)
    } else {
        ((exponent + 112u32) << 23) | (mantissa << 13)
    };
    f32::reinterpret(magnitude | ((bits & 0x8000) << 16))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_whole_groups_of_words() {
        let q4 = StoredFormat::Affine { bits: 4, group: 32, scales: Scales::Half };
        assert_eq!(q4.row_words(64), Some(2 * 5));
        assert_eq!(StoredFormat::Affine { bits: 4, group: 32, scales: Scales::Single }.row_words(64), Some(2 * 6));
        assert_eq!(StoredFormat::Affine { bits: 8, group: 32, scales: Scales::Half }.row_words(64), Some(2 * 9));
        assert_eq!(StoredFormat::Affine { bits: 8, group: 16, scales: Scales::Single }.row_words(64), Some(4 * 6));
        assert_eq!(StoredFormat::BF16.row_words(6), Some(3));
        assert_eq!(q4.row_words(48), None, "not whole groups");
        assert_eq!(StoredFormat::F16.row_words(5), None, "not whole words");
    }

    #[test]
    fn the_writer_packs_values_low_bits_first() {
        let mut q4 = WordWriter::new(StoredFormat::Affine { bits: 4, group: 32, scales: Scales::Half }, 5);
        assert!(q4.push_group(1.0, -1.0, &(0..32).map(|i| (i % 16) as u8).collect::<Vec<_>>()));
        assert_eq!(q4.finish(), [0xBC00_3C00, 0x7654_3210, 0xFEDC_BA98, 0x7654_3210, 0xFEDC_BA98]);
        let mut q8 = WordWriter::new(StoredFormat::Affine { bits: 8, group: 16, scales: Scales::Single }, 6);
        assert!(q8.push_group(0.1, 2.0, &(0..16).collect::<Vec<u8>>()));
        assert_eq!(q8.finish(), [0.1f32.to_bits(), 2.0f32.to_bits(), 0x0302_0100, 0x0706_0504, 0x0B0A_0908, 0x0F0E_0D0C]);
        let mut rounded = WordWriter::new(StoredFormat::Affine { bits: 8, group: 16, scales: Scales::Half }, 5);
        assert!(!rounded.push_group(0.1, 0.0, &[0; 16]), "0.1 is not an f16");
        let mut halves = WordWriter::new(StoredFormat::F16, 1);
        halves.push_halves([0x1111, 0x2222]);
        assert_eq!(halves.finish(), [0x2222_1111]);
    }

    #[test]
    #[should_panic(expected = "rows end on whole words")]
    fn a_half_filled_word_is_refused() {
        let mut halves = WordWriter::new(StoredFormat::BF16, 1);
        halves.push_halves([1]);
        halves.finish();
    }
}
