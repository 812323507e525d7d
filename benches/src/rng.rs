//! A small deterministic generator (xorshift64*) for the benchmarks' random token ids:
//! reproducible runs without a dependency.

pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        // Xorshift must not start at zero.
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in (0, 1].
    pub fn unit(&mut self) -> f64 {
        ((self.next() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// `n` token ids below `vocab`.
    pub fn ids(&mut self, n: usize, vocab: u64) -> Vec<i64> {
        (0..n).map(|_| (self.next() % vocab) as i64).collect()
    }
}
