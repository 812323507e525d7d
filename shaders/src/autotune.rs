//! Which shapes make CubeCL compile or tune anew, so a warm-up can meet each once before traffic
//! does. In a scoring pass only the rows vary (pass tokens, items, a query chunk); CubeCL's
//! autotune key rounds each matmul dimension up to a power of two and adds a size class from the
//! exact sizes (it changes at 512 and 2048), and odd sizes fall in alignment classes of their own.

/// Row counts that meet every shape class of passes up to `largest` rows, smallest first: 16,
/// 32, then each power-of-two bucket at its top and inside it (¾ of the top, less one: an odd
/// size), and `largest` itself.
pub fn warmup_rows(largest: usize) -> Vec<usize> {
    let powers = std::iter::successors(Some(16), |p| Some(p * 2)).take_while(|&p| p < largest).chain([largest]);
    let mut rows = Vec::new();
    for size in powers {
        if size >= 64 {
            rows.push(size / 4 * 3 - 1);
        }
        rows.push(size);
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_power_of_two_bucket_is_met_at_its_top_and_inside_at_an_odd_size() {
        assert_eq!(warmup_rows(8192), [16, 32, 47, 64, 95, 128, 191, 256, 383, 512, 767, 1024, 1535, 2048, 3071, 4096, 6143, 8192]);
        assert_eq!(warmup_rows(1000), [16, 32, 47, 64, 95, 128, 191, 256, 383, 512, 749, 1000], "the budget's own bucket, inside and at the budget");
        assert_eq!(warmup_rows(16), [16]);
    }
}
