//! GGML tensor types and their dequantisation to f32, block by block, as ggml's reference
//! `dequantize_row_*` functions do it. Block layouts (bytes, little-endian):
//!
//! | type | values/block | bytes | layout |
//! |---|---|---|---|
//! | Q4_0 | 32 | 18 | `d: f16, qs[16]` — x = (nibble − 8)·d |
//! | Q4_1 | 32 | 20 | `d, m: f16, qs[16]` — x = nibble·d + m |
//! | Q5_0 | 32 | 22 | `d: f16, qh: u32, qs[16]` — 5-bit q, x = (q − 16)·d |
//! | Q5_1 | 32 | 24 | `d, m: f16, qh: u32, qs[16]` — x = q·d + m |
//! | Q8_0 | 32 | 34 | `d: f16, qs[32]: i8` — x = q·d |
//! | Q4_K | 256 | 144 | `d, dmin: f16, scales[12], qs[128]` — 8 sub-blocks, 6-bit scales/mins |
//! | Q5_K | 256 | 176 | `d, dmin: f16, scales[12], qh[32], qs[128]` |
//! | Q6_K | 256 | 210 | `ql[128], qh[64], scales[16]: i8, d: f16` |
//!
//! In the 32-value types, nibble `j` of the low halves holds value `j`, the high halves value `j + 16`.

use half::{bf16, f16};

/// A GGML tensor type, by its id in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
    /// A type tally does not dequantise (its GGML id).
    Other(u32),
}

impl std::fmt::Display for TensorType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TensorType::Q4K => write!(f, "Q4_K"),
            TensorType::Q5K => write!(f, "Q5_K"),
            TensorType::Q6K => write!(f, "Q6_K"),
            TensorType::Other(id) => write!(f, "{} (GGML type {id})", other_name(*id)),
            kind => write!(f, "{kind:?}"),
        }
    }
}

fn other_name(id: u32) -> &'static str {
    match id {
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        15 => "Q8_K",
        16..=23 | 29 => "an IQ type",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        _ => "unknown",
    }
}

impl TensorType {
    pub const SUPPORTED: &'static str = "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K";

    pub fn from_id(id: u32) -> Self {
        match id {
            0 => TensorType::F32,
            1 => TensorType::F16,
            2 => TensorType::Q4_0,
            3 => TensorType::Q4_1,
            6 => TensorType::Q5_0,
            7 => TensorType::Q5_1,
            8 => TensorType::Q8_0,
            12 => TensorType::Q4K,
            13 => TensorType::Q5K,
            14 => TensorType::Q6K,
            30 => TensorType::BF16,
            other => TensorType::Other(other),
        }
    }

    /// (values per block, bytes per block); `None` for types tally does not know.
    pub fn block(self) -> Option<(usize, usize)> {
        Some(match self {
            TensorType::F32 => (1, 4),
            TensorType::F16 | TensorType::BF16 => (1, 2),
            TensorType::Q4_0 => (32, 18),
            TensorType::Q4_1 => (32, 20),
            TensorType::Q5_0 => (32, 22),
            TensorType::Q5_1 => (32, 24),
            TensorType::Q8_0 => (32, 34),
            TensorType::Q4K => (256, 144),
            TensorType::Q5K => (256, 176),
            TensorType::Q6K => (256, 210),
            TensorType::Other(_) => return None,
        })
    }

    /// Bytes of `elements` values; `None` when the type is unknown or they are not whole blocks.
    pub fn byte_len(self, elements: usize) -> Option<usize> {
        let (values, bytes) = self.block()?;
        elements.is_multiple_of(values).then(|| elements / values * bytes)
    }

    /// `elements` values from `bytes` (exactly [`Self::byte_len`] long); `None` for an
    /// unsupported type.
    pub fn dequantize(self, bytes: &[u8], elements: usize) -> Option<Vec<f32>> {
        self.block()?;
        debug_assert_eq!(Some(bytes.len()), self.byte_len(elements));
        let mut out = vec![0f32; elements];
        self.dequantize_into(bytes, &mut out);
        Some(out)
    }

    /// `out.len()` values (whole blocks) from `bytes`, as [`Self::dequantize`] gives them; a
    /// row at a time for the block kernels. Panics for a type tally does not know.
    pub fn dequantize_into(self, bytes: &[u8], out: &mut [f32]) {
        let (values, size) = self.block().expect("a type tally dequantises");
        let blocks = bytes.chunks_exact(size).zip(out.chunks_exact_mut(values));
        match self {
            TensorType::F32 => blocks.for_each(|(b, y)| y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            TensorType::F16 => blocks.for_each(|(b, y)| y[0] = half(b, 0)),
            TensorType::BF16 => blocks.for_each(|(b, y)| y[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32()),
            TensorType::Q4_0 => blocks.for_each(|(b, y)| q4(&b[2..18], half(b, 0), -8.0 * half(b, 0), y)),
            TensorType::Q4_1 => blocks.for_each(|(b, y)| q4(&b[4..20], half(b, 0), half(b, 2), y)),
            TensorType::Q5_0 => blocks.for_each(|(b, y)| q5(&b[2..6], &b[6..22], half(b, 0), -16.0 * half(b, 0), y)),
            TensorType::Q5_1 => blocks.for_each(|(b, y)| q5(&b[4..8], &b[8..24], half(b, 0), half(b, 2), y)),
            TensorType::Q8_0 => blocks.for_each(|(b, y)| {
                let d = half(b, 0);
                for (y, &q) in y.iter_mut().zip(&b[2..34]) {
                    *y = f32::from(q as i8) * d;
                }
            }),
            TensorType::Q4K => blocks.for_each(|(b, y)| q4_k(b, y)),
            TensorType::Q5K => blocks.for_each(|(b, y)| q5_k(b, y)),
            TensorType::Q6K => blocks.for_each(|(b, y)| q6_k(b, y)),
            TensorType::Other(_) => unreachable!("block() is None"),
        }
    }
}

impl TensorType {
    /// `values` (whole blocks) in this type, as ggml's reference quantisers round them: Q8_0
    /// (`d = max |x| / 127`), Q4_0 (`d = x_maxabs / −8`), Q4_1 (`d = (max − min) / 15`, `m = min`),
    /// F16 and BF16. `None` for other types: tally reads them, it does not write them.
    pub fn quantize(self, values: &[f32]) -> Option<Vec<u8>> {
        let (per_block, _) = self.block()?;
        if !values.len().is_multiple_of(per_block) {
            return None;
        }
        let mut out = Vec::with_capacity(self.byte_len(values.len())?);
        let nibbles = |q: &[u8], out: &mut Vec<u8>| out.extend((0..16).map(|j| q[j] | (q[j + 16] << 4)));
        for x in values.chunks_exact(per_block) {
            match self {
                TensorType::F16 => out.extend(f16::from_f32(x[0]).to_le_bytes()),
                TensorType::BF16 => out.extend(bf16::from_f32(x[0]).to_le_bytes()),
                TensorType::Q8_0 => {
                    let d = x.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
                    let inverse = if d > 0.0 { 1.0 / d } else { 0.0 };
                    out.extend(f16::from_f32(d).to_le_bytes());
                    out.extend(x.iter().map(|v| (v * inverse).round() as i8 as u8));
                }
                TensorType::Q4_0 => {
                    let extreme = x.iter().fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
                    let d = extreme / -8.0;
                    let inverse = if d != 0.0 { 1.0 / d } else { 0.0 };
                    out.extend(f16::from_f32(d).to_le_bytes());
                    let q: Vec<u8> = x.iter().map(|v| (v * inverse + 8.5).clamp(0.0, 15.0) as u8).collect();
                    nibbles(&q, &mut out);
                }
                TensorType::Q4_1 => {
                    let (min, max) = x.iter().fold((f32::MAX, f32::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
                    let d = (max - min) / 15.0;
                    let inverse = if d > 0.0 { 1.0 / d } else { 0.0 };
                    out.extend(f16::from_f32(d).to_le_bytes());
                    out.extend(f16::from_f32(min).to_le_bytes());
                    let q: Vec<u8> = x.iter().map(|v| ((v - min) * inverse + 0.5).clamp(0.0, 15.0) as u8).collect();
                    nibbles(&q, &mut out);
                }
                _ => return None,
            }
        }
        Some(out)
    }
}

impl TensorType {
    /// `(bits, values)` of the groups [`Self::affine_groups`] gives: every quantised type's
    /// values are unsigned `bits`-bit integers in groups of `values` sharing a scale and a
    /// minimum. `None` for the float types.
    pub fn affine_layout(self) -> Option<(u32, usize)> {
        Some(match self {
            TensorType::Q4_0 | TensorType::Q4_1 | TensorType::Q4K => (4, 32),
            TensorType::Q5_0 | TensorType::Q5_1 | TensorType::Q5K => (5, 32),
            TensorType::Q8_0 => (8, 32),
            TensorType::Q6K => (6, 16),
            _ => return None,
        })
    }

    /// Calls `visit(scale, min, q)` for each group of one block's bytes, in value order: value
    /// `i` of the group is `q[i]·scale + min` — in float32, exactly what [`Self::dequantize_into`]
    /// gives. Signed quants are offset to unsigned (Q8_0's `q + 128` with `min = −128·d`).
    /// Panics for a float type (no groups: see [`Self::affine_layout`]).
    pub fn affine_groups(self, b: &[u8], visit: &mut dyn FnMut(f32, f32, &[u8])) {
        let mut q = [0u8; 32];
        match self {
            TensorType::Q4_0 | TensorType::Q4_1 => {
                let (d, m, qs) = if self == TensorType::Q4_0 { (half(b, 0), -8.0 * half(b, 0), &b[2..18]) } else { (half(b, 0), half(b, 2), &b[4..20]) };
                for (j, &byte) in qs.iter().enumerate() {
                    (q[j], q[j + 16]) = (byte & 0x0F, byte >> 4);
                }
                visit(d, m, &q);
            }
            TensorType::Q5_0 | TensorType::Q5_1 => {
                let (d, m, qh, qs) = if self == TensorType::Q5_0 { (half(b, 0), -16.0 * half(b, 0), &b[2..6], &b[6..22]) } else { (half(b, 0), half(b, 2), &b[4..8], &b[8..24]) };
                let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
                for (j, &byte) in qs.iter().enumerate() {
                    q[j] = (byte & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
                    q[j + 16] = (byte >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
                }
                visit(d, m, &q);
            }
            TensorType::Q8_0 => {
                for (q, &byte) in q.iter_mut().zip(&b[2..34]) {
                    *q = (byte as i8 as i16 + 128) as u8;
                }
                visit(half(b, 0), -128.0 * half(b, 0), &q);
            }
            TensorType::Q4K | TensorType::Q5K => {
                let (d, dmin) = (half(b, 0), half(b, 2));
                let (qh, qs) = if self == TensorType::Q4K { (None, &b[16..144]) } else { (Some(&b[16..48]), &b[48..176]) };
                for group in 0..8 {
                    let (chunk, high_nibble) = (group / 2, group % 2 == 1);
                    for (l, q) in q.iter_mut().enumerate() {
                        let byte = qs[chunk * 32 + l];
                        let fifth = qh.map_or(0, |qh| ((qh[l] >> group) & 1) << 4);
                        *q = if high_nibble { byte >> 4 } else { byte & 0x0F } | fifth;
                    }
                    let (scale, min) = scale_min_k4(group, &b[4..16]);
                    visit(d * scale, -(dmin * min), &q);
                }
            }
            TensorType::Q6K => {
                let (ql, qh, scales, d) = (&b[0..128], &b[128..192], &b[192..208], half(b, 208));
                // Value `128h + 32k + l` (k < 4, l < 32) is in group `8h + 2k + l / 16`.
                for group in 0..16 {
                    let (h, k, first) = (group / 8, group % 8 / 2, group % 2 * 16);
                    for (i, q) in q[..16].iter_mut().enumerate() {
                        let l = first + i;
                        let low = ql[h * 64 + l + 32 * (k % 2)];
                        let low = if k < 2 { low & 0x0F } else { low >> 4 };
                        *q = low | (((qh[h * 32 + l] >> (2 * k)) & 3) << 4);
                    }
                    let scale = d * f32::from(scales[group] as i8);
                    visit(scale, -32.0 * scale, &q[..16]);
                }
            }
            kind => panic!("{kind} values are floats, not groups"),
        }
    }
}

fn half(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// 32 values from 16 bytes of nibbles: `x = q·d + m`.
fn q4(qs: &[u8], d: f32, m: f32, y: &mut [f32]) {
    for (j, &q) in qs.iter().enumerate() {
        y[j] = f32::from(q & 0x0F) * d + m;
        y[j + 16] = f32::from(q >> 4) * d + m;
    }
}

/// 32 values of 5 bits: nibbles in `qs`, the fifth bits in the u32 `qh` (bit `j` for value `j`).
fn q5(qh: &[u8], qs: &[u8], d: f32, m: f32, y: &mut [f32]) {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    for (j, &q) in qs.iter().enumerate() {
        let high_low = ((qh >> j) & 1) as u8;
        let high_high = ((qh >> (j + 16)) & 1) as u8;
        y[j] = f32::from((q & 0x0F) | (high_low << 4)) * d + m;
        y[j + 16] = f32::from((q >> 4) | (high_high << 4)) * d + m;
    }
}

/// Scale and min of sub-block `j` (0..8), 6 bits each, packed into 12 bytes.
fn scale_min_k4(j: usize, scales: &[u8]) -> (f32, f32) {
    let (scale, min) = if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        ((scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4), (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4))
    };
    (f32::from(scale), f32::from(min))
}

fn q4_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (half(b, 0), half(b, 2));
    let (scales, qs) = (&b[4..16], &b[16..144]);
    for chunk in 0..4 {
        let q = &qs[chunk * 32..chunk * 32 + 32];
        let (s1, m1) = scale_min_k4(2 * chunk, scales);
        let (s2, m2) = scale_min_k4(2 * chunk + 1, scales);
        let out = &mut y[chunk * 64..chunk * 64 + 64];
        for l in 0..32 {
            out[l] = d * s1 * f32::from(q[l] & 0x0F) - dmin * m1;
            out[l + 32] = d * s2 * f32::from(q[l] >> 4) - dmin * m2;
        }
    }
}

fn q5_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (half(b, 0), half(b, 2));
    let (scales, qh, qs) = (&b[4..16], &b[16..48], &b[48..176]);
    for chunk in 0..4 {
        let q = &qs[chunk * 32..chunk * 32 + 32];
        let (s1, m1) = scale_min_k4(2 * chunk, scales);
        let (s2, m2) = scale_min_k4(2 * chunk + 1, scales);
        let (bit1, bit2) = (1u8 << (2 * chunk), 2u8 << (2 * chunk));
        let out = &mut y[chunk * 64..chunk * 64 + 64];
        for l in 0..32 {
            let high1 = if qh[l] & bit1 != 0 { 16 } else { 0 };
            let high2 = if qh[l] & bit2 != 0 { 16 } else { 0 };
            out[l] = d * s1 * f32::from((q[l] & 0x0F) + high1) - dmin * m1;
            out[l + 32] = d * s2 * f32::from((q[l] >> 4) + high2) - dmin * m2;
        }
    }
}

fn q6_k(b: &[u8], y: &mut [f32]) {
    let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = half(b, 208);
    for half_block in 0..2 {
        let (ql, qh) = (&ql[half_block * 64..], &qh[half_block * 32..]);
        let sc = &scales[half_block * 8..];
        let out = &mut y[half_block * 128..half_block * 128 + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            let scale = |k: usize| d * f32::from(sc[is + k] as i8);
            out[l] = scale(0) * q1 as f32;
            out[l + 32] = scale(2) * q2 as f32;
            out[l + 64] = scale(4) * q3 as f32;
            out[l + 96] = scale(6) * q4 as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_the_block_tables() {
        assert_eq!(TensorType::Q4_1.byte_len(64), Some(40));
        assert_eq!(TensorType::Q6K.byte_len(512), Some(420));
        assert_eq!(TensorType::Q8_0.byte_len(33), None, "not whole blocks");
        assert_eq!(TensorType::from_id(10).byte_len(256), None, "Q2_K is not supported");
        assert_eq!(TensorType::from_id(10).to_string(), "Q2_K (GGML type 10)");
    }

    /// Every quantised type's groups give back exactly what dequantising gives, on blocks of
    /// seeded random bytes (any bytes are a valid block, but for the f16 scales' NaNs and
    /// infinities, which the seed avoids by clearing their top exponent bit).
    #[test]
    fn affine_groups_reproduce_dequantisation_exactly() {
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        for kind in [TensorType::Q4_0, TensorType::Q4_1, TensorType::Q5_0, TensorType::Q5_1, TensorType::Q8_0, TensorType::Q4K, TensorType::Q5K, TensorType::Q6K] {
            let (values, size) = kind.block().unwrap();
            let (bits, group) = kind.affine_layout().unwrap();
            for _ in 0..20 {
                let mut block: Vec<u8> = (0..size)
                    .map(|_| {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        (state >> 24) as u8
                    })
                    .collect();
                let scale_bytes: &[usize] = match kind {
                    TensorType::Q6K => &[209],
                    TensorType::Q4_0 | TensorType::Q5_0 | TensorType::Q8_0 => &[1],
                    _ => &[1, 3],
                };
                for &at in scale_bytes {
                    block[at] &= 0b1011_1111;
                }
                let expected = kind.dequantize(&block, values).unwrap();
                let mut got = Vec::new();
                kind.affine_groups(&block, &mut |scale, min, q| {
                    assert_eq!(q.len(), group, "{kind}");
                    assert!(q.iter().all(|&q| u32::from(q) < 1 << bits), "{kind}: {q:?}");
                    got.extend(q.iter().map(|&q| f32::from(q) * scale + min));
                });
                assert_eq!(got, expected, "{kind}");
            }
        }
    }

    /// Quantised values come back within half a step of each block's scale (Q4_0: a whole step
    /// at the positive end, which its −8…7 range clips, as ggml's does).
    #[test]
    fn quantised_values_come_back_within_half_a_step() {
        let values: Vec<f32> = (0..96).map(|i| ((i * 37 % 101) as f32 - 50.0) / 40.0).collect();
        for (kind, steps) in [(TensorType::Q8_0, 254.0), (TensorType::Q4_0, 8.0), (TensorType::Q4_1, 15.0), (TensorType::F16, 2048.0), (TensorType::BF16, 256.0)] {
            let bytes = kind.quantize(&values).unwrap();
            assert_eq!(Some(bytes.len()), kind.byte_len(values.len()), "{kind}");
            let back = kind.dequantize(&bytes, values.len()).unwrap();
            for (block, (x, y)) in values.chunks(32).zip(back.chunks(32)).enumerate() {
                let range = x.iter().fold(0f32, |m, v| m.max(v.abs())) * 2.0;
                for (a, b) in x.iter().zip(y) {
                    assert!((a - b).abs() <= range / steps * 0.55, "{kind} block {block}: {a} came back {b}");
                }
            }
        }
        assert_eq!(TensorType::Q6K.quantize(&[0.0; 256]), None, "tally does not write K-quants");
    }

    /// Hand-made blocks with known values. Every type is also checked end to end: the GGUF
    /// fixtures (`tests/fixtures/models/*-gguf`) hold all eleven, and their expected scores come
    /// from weights the `gguf` package dequantised.
    #[test]
    fn small_types_decode_hand_made_blocks() {
        let d = f16::from_f32(0.5).to_le_bytes();
        let m = f16::from_f32(-1.0).to_le_bytes();
        let nibbles: Vec<u8> = (0..16).map(|j| (j as u8) | ((15 - j as u8) << 4)).collect();
        let q4_1 = [&d[..], &m, &nibbles].concat();
        let y = TensorType::Q4_1.dequantize(&q4_1, 32).unwrap();
        assert_eq!(y[3], 3.0 * 0.5 - 1.0);
        assert_eq!(y[16 + 3], 12.0 * 0.5 - 1.0);

        let q4_0 = [&d[..], &nibbles].concat();
        assert_eq!(TensorType::Q4_0.dequantize(&q4_0, 32).unwrap()[0], -4.0);

        // Q5_0 with the fifth bit set for values 1 and 17.
        let qh = ((1u32 << 1) | (1u32 << 17)).to_le_bytes();
        let q5_0 = [&d[..], &qh, &nibbles].concat();
        let y = TensorType::Q5_0.dequantize(&q5_0, 32).unwrap();
        assert_eq!(y[1], (1.0 + 16.0 - 16.0) * 0.5);
        assert_eq!(y[17], (14.0 + 16.0 - 16.0) * 0.5);
        assert_eq!(y[2], (2.0 - 16.0) * 0.5);

        let q8: Vec<u8> = (0..32).map(|j| (j as i8 - 16) as u8).collect();
        let y = TensorType::Q8_0.dequantize(&[&d[..], &q8].concat(), 32).unwrap();
        assert_eq!((y[0], y[31]), (-8.0, 7.5));
    }
}
