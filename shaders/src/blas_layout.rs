//! How a strided matrix operand reads as a BLAS matrix: the last two dimensions row-major (the
//! last one contiguous) or column-major (a transposed view) with a leading dimension, the batch
//! dimensions folded into one stride. Pure index arithmetic, so it is tested on any machine; the
//! cuBLASLt route ([`crate::cublas`]) is its user.

/// A `[.., rows, cols]` operand as BLAS reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlasLayout {
    /// Row-major (consecutive columns adjacent) or column-major (consecutive rows adjacent).
    pub row_major: bool,
    /// Elements between consecutive rows (row-major) or columns (column-major).
    pub leading: usize,
    /// Elements between consecutive matrices of the batch; 0 for a batch of one.
    pub batch_stride: usize,
}

/// The layout of a tensor of `shape` and `strides` (rank ≥ 2), or `None` if BLAS cannot read it
/// as it sits: neither of the last two dimensions contiguous, a leading dimension shorter than
/// a row or column (overlapping rows), or batch dimensions that do not fold into one stride.
pub fn blas_layout(shape: &[usize], strides: &[usize]) -> Option<BlasLayout> {
    let rank = shape.len();
    assert!(rank >= 2 && strides.len() == rank, "a matrix or a batch of matrices");
    let (rows, cols) = (shape[rank - 2], shape[rank - 1]);
    let (row_stride, col_stride) = (strides[rank - 2], strides[rank - 1]);
    // A dimension of one has no meaningful stride: it never constrains the order.
    let (row_major, leading) = if col_stride == 1 || cols == 1 {
        (true, if rows == 1 { cols } else { row_stride })
    } else if row_stride == 1 || rows == 1 {
        (false, if cols == 1 { rows } else { col_stride })
    } else {
        return None;
    };
    if leading < if row_major { cols } else { rows } {
        return None;
    }
    let batch: usize = shape[..rank - 2].iter().product();
    let batch_stride = if batch > 1 {
        // Outer batch dimensions must step over whole inner ones (size-one dimensions aside).
        let batch_dims: Vec<(usize, usize)> = (0..rank - 2).filter(|&d| shape[d] > 1).map(|d| (shape[d], strides[d])).collect();
        if batch_dims.windows(2).any(|pair| pair[0].1 != pair[1].1 * pair[1].0) {
            return None;
        }
        batch_dims.last().expect("a batch of more than one has a dimension past one").1
    } else {
        0
    };
    Some(BlasLayout { row_major, leading: leading.max(1), batch_stride })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(row_major: bool, leading: usize, batch_stride: usize) -> Option<BlasLayout> {
        Some(BlasLayout { row_major, leading, batch_stride })
    }

    #[test]
    fn contiguous_pitched_and_transposed_matrices() {
        assert_eq!(blas_layout(&[3, 4], &[4, 1]), layout(true, 4, 0));
        // CUDA pads new tensors' rows: 4 columns in rows of 8.
        assert_eq!(blas_layout(&[3, 4], &[8, 1]), layout(true, 8, 0));
        // A [4, 3] matrix viewed transposed as [3, 4].
        assert_eq!(blas_layout(&[3, 4], &[1, 3]), layout(false, 3, 0));
        // Neither dimension contiguous, and overlapping rows.
        assert_eq!(blas_layout(&[3, 4], &[8, 2]), None);
        assert_eq!(blas_layout(&[3, 4], &[2, 1]), None);
    }

    #[test]
    fn rows_and_columns_of_one() {
        assert_eq!(blas_layout(&[1, 33], &[7, 1]), layout(true, 33, 0));
        assert_eq!(blas_layout(&[5, 1], &[1, 1]), layout(true, 1, 0));
        assert_eq!(blas_layout(&[5, 1], &[3, 9]), layout(true, 3, 0));
        assert_eq!(blas_layout(&[1, 1], &[0, 0]), layout(true, 1, 0));
    }

    #[test]
    fn batches_fold_into_one_stride() {
        assert_eq!(blas_layout(&[2, 3, 4], &[12, 4, 1]), layout(true, 4, 12));
        assert_eq!(blas_layout(&[2, 5, 3, 4], &[60, 12, 4, 1]), layout(true, 4, 12));
        // Keys viewed transposed per head: [heads, d, keys] of a [heads, keys, d] buffer.
        assert_eq!(blas_layout(&[8, 64, 100], &[6400, 1, 64]), layout(false, 64, 6400));
        // A batch dimension of one in between does not break the fold.
        assert_eq!(blas_layout(&[2, 1, 3, 4], &[12, 99, 4, 1]), layout(true, 4, 12));
        // Batch dimensions that do not nest (a permuted view).
        assert_eq!(blas_layout(&[2, 5, 3, 4], &[12, 24, 4, 1]), None);
    }
}
