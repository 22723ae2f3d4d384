//! ggml tensor types and their dequantization to f32.
//!
//! A quantized tensor is a sequence of fixed-size blocks along its first dimension; each
//! block holds [`GgmlType::block_size`] values in [`GgmlType::type_size`] bytes. The layouts
//! (ggml's `block_q4_0`, ... in `ggml-common.h`), all little-endian:
//!
//! | type | values | bytes | layout | value |
//! |------|-------:|------:|--------|-------|
//! | F32  | 1 | 4 | f32 | x |
//! | F16  | 1 | 2 | IEEE half | x |
//! | BF16 | 1 | 2 | bfloat16 | x |
//! | Q4_0 | 32 | 18 | f16 d, 16 B nibbles | d·(q − 8) |
//! | Q4_1 | 32 | 20 | f16 d, f16 m, 16 B nibbles | d·q + m |
//! | Q5_0 | 32 | 22 | f16 d, u32 high bits, 16 B nibbles | d·(q − 16) |
//! | Q5_1 | 32 | 24 | f16 d, f16 m, u32 high bits, 16 B nibbles | d·q + m |
//! | Q8_0 | 32 | 34 | f16 d, 32 × i8 | d·q |
//! | Q4_K | 256 | 144 | f16 d, f16 dmin, 12 B 6-bit scales/mins, 128 B nibbles | d·sc·q − dmin·m |
//! | Q5_K | 256 | 176 | as Q4_K plus 32 B of fifth bits | d·sc·q − dmin·m |
//! | Q6_K | 256 | 210 | 128 B low nibbles, 64 B high 2-bit pairs, 16 × i8 scales, f16 d | d·sc·(q − 32) |
//!
//! In the 32-value blocks byte `j` of the nibbles holds value `j` in its low nibble and value
//! `j + 16` in its high nibble. The other ggml types (Q2_K, Q3_K, the IQ and ternary types)
//! are known by size, so files using them parse, but are refused for dequantization.

use std::fmt;

use half::{bf16, f16};

/// A ggml tensor type (the ids of ggml's `enum ggml_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    Iq2Xxs,
    Iq2Xs,
    Iq3Xxs,
    Iq1S,
    Iq4Nl,
    Iq3S,
    Iq2S,
    Iq4Xs,
    I8,
    I16,
    I32,
    I64,
    F64,
    Iq1M,
    Bf16,
    Tq1_0,
    Tq2_0,
    Mxfp4,
}

/// (type, id, name, block size, bytes per block).
const TABLE: &[(GgmlType, u32, &str, u64, u64)] = &[
    (GgmlType::F32, 0, "F32", 1, 4),
    (GgmlType::F16, 1, "F16", 1, 2),
    (GgmlType::Q4_0, 2, "Q4_0", 32, 18),
    (GgmlType::Q4_1, 3, "Q4_1", 32, 20),
    (GgmlType::Q5_0, 6, "Q5_0", 32, 22),
    (GgmlType::Q5_1, 7, "Q5_1", 32, 24),
    (GgmlType::Q8_0, 8, "Q8_0", 32, 34),
    (GgmlType::Q8_1, 9, "Q8_1", 32, 40),
    (GgmlType::Q2K, 10, "Q2_K", 256, 84),
    (GgmlType::Q3K, 11, "Q3_K", 256, 110),
    (GgmlType::Q4K, 12, "Q4_K", 256, 144),
    (GgmlType::Q5K, 13, "Q5_K", 256, 176),
    (GgmlType::Q6K, 14, "Q6_K", 256, 210),
    (GgmlType::Q8K, 15, "Q8_K", 256, 292),
    (GgmlType::Iq2Xxs, 16, "IQ2_XXS", 256, 66),
    (GgmlType::Iq2Xs, 17, "IQ2_XS", 256, 74),
    (GgmlType::Iq3Xxs, 18, "IQ3_XXS", 256, 98),
    (GgmlType::Iq1S, 19, "IQ1_S", 256, 50),
    (GgmlType::Iq4Nl, 20, "IQ4_NL", 32, 18),
    (GgmlType::Iq3S, 21, "IQ3_S", 256, 110),
    (GgmlType::Iq2S, 22, "IQ2_S", 256, 82),
    (GgmlType::Iq4Xs, 23, "IQ4_XS", 256, 136),
    (GgmlType::I8, 24, "I8", 1, 1),
    (GgmlType::I16, 25, "I16", 1, 2),
    (GgmlType::I32, 26, "I32", 1, 4),
    (GgmlType::I64, 27, "I64", 1, 8),
    (GgmlType::F64, 28, "F64", 1, 8),
    (GgmlType::Iq1M, 29, "IQ1_M", 256, 56),
    (GgmlType::Bf16, 30, "BF16", 1, 2),
    (GgmlType::Tq1_0, 34, "TQ1_0", 256, 54),
    (GgmlType::Tq2_0, 35, "TQ2_0", 256, 66),
    (GgmlType::Mxfp4, 39, "MXFP4", 32, 17),
];

impl GgmlType {
    fn entry(self) -> &'static (GgmlType, u32, &'static str, u64, u64) {
        TABLE.iter().find(|e| e.0 == self).unwrap_or(&TABLE[0])
    }

    /// The type for a ggml type id.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TABLE.iter().find(|e| e.1 == id).map(|e| e.0)
    }

    /// The ggml type id.
    pub fn id(self) -> u32 {
        self.entry().1
    }

    /// ggml's name (`Q4_1`, `F32`).
    pub fn name(self) -> &'static str {
        self.entry().2
    }

    /// Values per block.
    pub fn block_size(self) -> u64 {
        self.entry().3
    }

    /// Bytes per block.
    pub fn type_size(self) -> u64 {
        self.entry().4
    }

    /// The bytes of `n` values; `None` when `n` is not a whole number of blocks or the size
    /// overflows.
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        if !n.is_multiple_of(self.block_size()) {
            return None;
        }
        (n / self.block_size()).checked_mul(self.type_size())
    }

    /// Whether [`dequantize`] converts this type.
    pub fn can_dequantize(self) -> bool {
        use GgmlType::*;
        matches!(
            self,
            F32 | F16 | Bf16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q4K | Q5K | Q6K
        )
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a dequantization was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DequantError {
    /// A type without a dequantizer here.
    Unsupported(GgmlType),
    /// The bytes are not the size of the values asked for.
    SizeMismatch {
        /// The type.
        ggml_type: GgmlType,
        /// Values asked for.
        values: u64,
        /// Bytes given.
        bytes: u64,
    },
    /// The host cannot give the output's memory.
    OutOfMemory(u64),
}

impl fmt::Display for DequantError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DequantError::Unsupported(t) => write!(f, "dequantizing {t} is not supported"),
            DequantError::SizeMismatch {
                ggml_type,
                values,
                bytes,
            } => write!(
                f,
                "{bytes} bytes of {ggml_type} do not hold {values} values (need {})",
                ggml_type
                    .row_bytes(*values)
                    .map_or("a whole number of blocks".to_string(), |b| b.to_string())
            ),
            DequantError::OutOfMemory(n) => write!(f, "cannot allocate {n} f32 values"),
        }
    }
}

impl std::error::Error for DequantError {}

fn h(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Dequantizes `data` (whole blocks of `ty`) into `out`; `data` must hold exactly
/// `out.len()` values.
pub fn dequantize(ty: GgmlType, data: &[u8], out: &mut [f32]) -> Result<(), DequantError> {
    if !ty.can_dequantize() {
        return Err(DequantError::Unsupported(ty));
    }
    let n = out.len() as u64;
    if ty.row_bytes(n) != Some(data.len() as u64) {
        return Err(DequantError::SizeMismatch {
            ggml_type: ty,
            values: n,
            bytes: data.len() as u64,
        });
    }
    let bs = ty.block_size() as usize;
    let ts = ty.type_size() as usize;
    let blocks = data.chunks_exact(ts).zip(out.chunks_exact_mut(bs));
    match ty {
        GgmlType::F32 => {
            for (b, y) in blocks {
                y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::F16 => {
            for (b, y) in blocks {
                y[0] = h(b, 0);
            }
        }
        GgmlType::Bf16 => {
            for (b, y) in blocks {
                y[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        GgmlType::Q4_0 => {
            for (b, y) in blocks {
                let d = h(b, 0);
                let qs = &b[2..18];
                for j in 0..16 {
                    y[j] = d * ((qs[j] & 0x0f) as i32 - 8) as f32;
                    y[j + 16] = d * ((qs[j] >> 4) as i32 - 8) as f32;
                }
            }
        }
        GgmlType::Q4_1 => {
            for (b, y) in blocks {
                let (d, m) = (h(b, 0), h(b, 2));
                let qs = &b[4..20];
                for j in 0..16 {
                    y[j] = d * (qs[j] & 0x0f) as f32 + m;
                    y[j + 16] = d * (qs[j] >> 4) as f32 + m;
                }
            }
        }
        GgmlType::Q5_0 => {
            for (b, y) in blocks {
                let d = h(b, 0);
                let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                let qs = &b[6..22];
                for j in 0..16 {
                    let xh0 = (((qh >> j) << 4) & 0x10) as u8;
                    let xh1 = ((qh >> (j + 12)) & 0x10) as u8;
                    y[j] = d * (((qs[j] & 0x0f) | xh0) as i32 - 16) as f32;
                    y[j + 16] = d * (((qs[j] >> 4) | xh1) as i32 - 16) as f32;
                }
            }
        }
        GgmlType::Q5_1 => {
            for (b, y) in blocks {
                let (d, m) = (h(b, 0), h(b, 2));
                let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
                let qs = &b[8..24];
                for j in 0..16 {
                    let xh0 = (((qh >> j) << 4) & 0x10) as u8;
                    let xh1 = ((qh >> (j + 12)) & 0x10) as u8;
                    y[j] = d * ((qs[j] & 0x0f) | xh0) as f32 + m;
                    y[j + 16] = d * ((qs[j] >> 4) | xh1) as f32 + m;
                }
            }
        }
        GgmlType::Q8_0 => {
            for (b, y) in blocks {
                let d = h(b, 0);
                for (y, &q) in y.iter_mut().zip(&b[2..34]) {
                    *y = d * (q as i8) as f32;
                }
            }
        }
        GgmlType::Q4K => {
            for (b, y) in blocks {
                let (d, dmin) = (h(b, 0), h(b, 2));
                let scales = &b[4..16];
                let qs = &b[16..144];
                for (j, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
                    let (sc0, m0) = scale_min_k4(2 * j, scales);
                    let (sc1, m1) = scale_min_k4(2 * j + 1, scales);
                    let (d0, m0) = (d * sc0 as f32, dmin * m0 as f32);
                    let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
                    for l in 0..32 {
                        y[l] = d0 * (q[l] & 0x0f) as f32 - m0;
                        y[l + 32] = d1 * (q[l] >> 4) as f32 - m1;
                    }
                }
            }
        }
        GgmlType::Q5K => {
            for (b, y) in blocks {
                let (d, dmin) = (h(b, 0), h(b, 2));
                let scales = &b[4..16];
                let qh = &b[16..48];
                let qs = &b[48..176];
                for (j, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
                    let (sc0, m0) = scale_min_k4(2 * j, scales);
                    let (sc1, m1) = scale_min_k4(2 * j + 1, scales);
                    let (d0, m0) = (d * sc0 as f32, dmin * m0 as f32);
                    let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
                    let (u0, u1) = (1u8 << (2 * j), 2u8 << (2 * j));
                    for l in 0..32 {
                        let h0 = if qh[l] & u0 != 0 { 16 } else { 0 };
                        let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
                        y[l] = d0 * ((q[l] & 0x0f) + h0) as f32 - m0;
                        y[l + 32] = d1 * ((q[l] >> 4) + h1) as f32 - m1;
                    }
                }
            }
        }
        GgmlType::Q6K => {
            for (b, y) in blocks {
                let ql = &b[0..128];
                let qh = &b[128..192];
                let sc = &b[192..208];
                let d = h(b, 208);
                for half in 0..2 {
                    let ql = &ql[64 * half..64 * half + 64];
                    let qh = &qh[32 * half..32 * half + 32];
                    let sc = &sc[8 * half..8 * half + 8];
                    let y = &mut y[128 * half..128 * half + 128];
                    for l in 0..32 {
                        let is = l / 16;
                        let q1 = ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) as i32 - 32;
                        let q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                        let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                        let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                        let s = |i: usize| d * (sc[i] as i8) as f32;
                        y[l] = s(is) * q1 as f32;
                        y[l + 32] = s(is + 2) * q2 as f32;
                        y[l + 64] = s(is + 4) * q3 as f32;
                        y[l + 96] = s(is + 6) * q4 as f32;
                    }
                }
            }
        }
        _ => return Err(DequantError::Unsupported(ty)),
    }
    Ok(())
}

/// The `j`-th 6-bit scale and min of a Q4_K/Q5_K block (ggml's `get_scale_min_k4`).
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Dequantizes `n` values into a new vector (its allocation is fallible).
pub fn dequantize_vec(ty: GgmlType, data: &[u8], n: u64) -> Result<Vec<f32>, DequantError> {
    if ty.row_bytes(n) != Some(data.len() as u64) {
        return Err(DequantError::SizeMismatch {
            ggml_type: ty,
            values: n,
            bytes: data.len() as u64,
        });
    }
    if !ty.can_dequantize() {
        return Err(DequantError::Unsupported(ty));
    }
    let len = usize::try_from(n).map_err(|_| DequantError::OutOfMemory(n))?;
    let mut out = Vec::new();
    out.try_reserve_exact(len)
        .map_err(|_| DequantError::OutOfMemory(n))?;
    out.resize(len, 0.0);
    dequantize(ty, data, &mut out)?;
    Ok(out)
}

/// Quantizes whole blocks of 32 values to Q4_1 (ggml's `quantize_row_q4_1_ref`): per block
/// `d = (max − min)/15`, `m = min`, `q = round((x − min)/d)`. For test models and
/// `--weights q4`; `None` when `x.len()` is not a multiple of 32.
pub fn quantize_q4_1(x: &[f32]) -> Option<Vec<u8>> {
    if !x.len().is_multiple_of(32) {
        return None;
    }
    let mut out = Vec::with_capacity(x.len() / 32 * 20);
    for b in x.chunks_exact(32) {
        let min = b.iter().copied().fold(f32::INFINITY, f32::min);
        let max = b.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        out.extend_from_slice(&f16::from_f32(min).to_le_bytes());
        let q = |v: f32| (((v - min) * id + 0.5) as u8).min(15);
        for j in 0..16 {
            out.push(q(b[j]) | (q(b[j + 16]) << 4));
        }
    }
    Some(out)
}

/// Quantizes whole blocks of 32 values to Q8_0 (ggml's `quantize_row_q8_0_ref`): per block
/// `d = max|x|/127`, `q = round(x/d)`; `None` when `x.len()` is not a multiple of 32.
pub fn quantize_q8_0(x: &[f32]) -> Option<Vec<u8>> {
    if !x.len().is_multiple_of(32) {
        return None;
    }
    let mut out = Vec::with_capacity(x.len() / 32 * 34);
    for b in x.chunks_exact(32) {
        let amax = b.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        out.extend(b.iter().map(|v| (v * id).round() as i8 as u8));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn deq(ty: GgmlType, data: &[u8], n: usize) -> Vec<f32> {
        let mut out = vec![f32::NAN; n];
        dequantize(ty, data, &mut out).unwrap();
        out
    }

    /// Nibbles `j | (15 - j) << 4`: low nibble j (value j), high nibble 15 - j (value j + 16).
    fn nibbles() -> Vec<u8> {
        (0..16u8).map(|j| j | ((15 - j) << 4)).collect()
    }

    #[test]
    fn q4_1_block() {
        // d = 0.5 (f16 0x3800), m = -1 (0xBC00).
        let mut b = vec![0x00, 0x38, 0x00, 0xBC];
        b.extend(nibbles());
        let y = deq(GgmlType::Q4_1, &b, 32);
        for j in 0..16 {
            assert_eq!(y[j], 0.5 * j as f32 - 1.0, "value {j}");
            assert_eq!(y[j + 16], 0.5 * (15 - j) as f32 - 1.0, "value {}", j + 16);
        }
    }

    #[test]
    fn q4_0_block() {
        // d = 2 (0x4000): value = 2·(q − 8).
        let mut b = vec![0x00, 0x40];
        b.extend(nibbles());
        let y = deq(GgmlType::Q4_0, &b, 32);
        for j in 0..16 {
            assert_eq!(y[j], 2.0 * (j as f32 - 8.0));
            assert_eq!(y[j + 16], 2.0 * (7.0 - j as f32));
        }
    }

    #[test]
    fn q8_0_block() {
        // d = 0.25 (0x3400), q_i = i − 16.
        let mut b = vec![0x00, 0x34];
        b.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let y = deq(GgmlType::Q8_0, &b, 32);
        for (i, y) in y.iter().enumerate() {
            assert_eq!(*y, 0.25 * (i as f32 - 16.0));
        }
    }

    #[test]
    fn q5_0_block() {
        // d = 1; the fifth bits set for values 16..32 only: value j = j − 16, value j + 16 =
        // (15 − j + 16) − 16.
        let mut b = vec![0x00, 0x3C];
        b.extend(0xFFFF_0000u32.to_le_bytes());
        b.extend(nibbles());
        let y = deq(GgmlType::Q5_0, &b, 32);
        for j in 0..16 {
            assert_eq!(y[j], j as f32 - 16.0);
            assert_eq!(y[j + 16], (15 - j) as f32);
        }
    }

    #[test]
    fn q5_1_block() {
        // d = 0.5, m = 1; the fifth bits set for values 0..16 only.
        let mut b = vec![0x00, 0x38, 0x00, 0x3C];
        b.extend(0x0000_FFFFu32.to_le_bytes());
        b.extend(nibbles());
        let y = deq(GgmlType::Q5_1, &b, 32);
        for j in 0..16 {
            assert_eq!(y[j], 0.5 * (j + 16) as f32 + 1.0);
            assert_eq!(y[j + 16], 0.5 * (15 - j) as f32 + 1.0);
        }
    }

    #[test]
    fn float_types() {
        // 1.5, −2, 65504 (largest f16), 2^−24 (smallest subnormal), −inf.
        let f16 = [0x00, 0x3E, 0x00, 0xC0, 0xFF, 0x7B, 0x01, 0x00, 0x00, 0xFC];
        let y = deq(GgmlType::F16, &f16, 5);
        assert_eq!(y, [1.5, -2.0, 65504.0, 2f32.powi(-24), f32::NEG_INFINITY]);
        // 1, −0.5, 3.140625.
        let bf16 = [0x80, 0x3F, 0x00, 0xBF, 0x49, 0x40];
        assert_eq!(deq(GgmlType::Bf16, &bf16, 3), [1.0, -0.5, 3.140625]);
        let f32s: Vec<u8> = [0.1f32, -7.25]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(deq(GgmlType::F32, &f32s, 2), [0.1, -7.25]);
    }

    /// Random blocks dequantized by the `gguf` Python package (gguf.quants.dequantize,
    /// gguf 0.19.0): selected values and the sum.
    /// A type, a block's bytes in hex, (index, value) pairs, the sum.
    type KCase = (GgmlType, &'static str, [(usize, f64); 11], f64);

    #[test]
    fn k_quants_match_gguf_python() {
        let cases: [KCase; 3] = [
            (
                GgmlType::Q4K,
                "c5281524804c4063a0bcf27f879c84989ede87acb96e8883e8c46e0caf38cab11830e6efe8060aa7\
                 44a1d0db1239f5dc4e9efe9a65f3ff96f58ff82287422987dfc84dc865748fc599747cce920be635\
                 255e3fcfa344e61a096cdf5d244be4155f27c45ec566af79efe7cb09aabd746098e3b7f38166fd2d\
                 9776ffc95d6b4f598a3a7016194848ab58c40eff0082c1b5",
                [
                    (0, -0.51025390625),
                    (1, -0.51025390625),
                    (31, -0.51025390625),
                    (32, 3.06756591796875),
                    (63, 4.85614013671875),
                    (64, -0.797271728515625),
                    (100, 6.8204498291015625),
                    (127, 2.9079437255859375),
                    (128, 6.628265380859375),
                    (200, 4.32373046875),
                    (255, 9.438522338867188),
                ],
                1360.3006591796875,
            ),
            (
                GgmlType::Q5K,
                "0e1f8524933e5405265b1c7d5d2e14c309914281e8f47fa52dab9466ccb7d576f3ec934a4fc68461\
                 583bf03cdcdea2b476b454c9ed1ca4e24fef67aa2a023e277ec5876912ed3940f924e1a7938a5459\
                 14d71901b119a8f37cd6ee9ec3ee7e129059b9c06b00be769efef3e08189cd483504691e0b8b0ddb\
                 3b647b4fae4a0ae8b6d7251e3a220ae169ca6a86e5301d6c7aa8e4a70e774917feda5e06e44dea96\
                 69dfd585b392389b79fa17adde554048",
                [
                    (0, 2.2088775634765625),
                    (1, 1.94708251953125),
                    (31, 0.5072097778320312),
                    (32, 2.5133056640625),
                    (63, 1.659027099609375),
                    (64, 0.05682373046875),
                    (100, -0.14685821533203125),
                    (127, -0.9391326904296875),
                    (128, 1.4618301391601562),
                    (200, 1.9113616943359375),
                    (255, -0.080963134765625),
                ],
                529.1259765625,
            ),
            (
                GgmlType::Q6K,
                "fcce5d0f847f360f6cac5cefac6121fd0c148fc3317995067aee6a84ec27f5616fb55e1209093c9a\
                 66ef82ba73f2582f02f685a953ad5c5f1a047ad1fc3c1bf51f87c83f3e3c0999a0ac51b4092fbafd\
                 9120ac428bc6bdf197e1f47b2b8ba1cfaaeea726e91509032358f8ec2ec51e21c17b22b0fb752d45\
                 e9070a7d571e0669cf93d42b46a19ceaff5cf3f2006196b0f2fb098973329594f21589046aa77534\
                 ee40ca98b8dc43b4216a23241697ec071a0d7aad6c041eab33daf8d72cbb96955903de427ff66110\
                 0da5219c1b71b1cb5526",
                [
                    (0, 61.63836669921875),
                    (1, 66.04110717773438),
                    (31, -2.3003082275390625),
                    (32, -26.070159912109375),
                    (63, -17.957244873046875),
                    (64, -53.40177917480469),
                    (100, -38.387939453125),
                    (127, -6.727783203125),
                    (128, 4.8232269287109375),
                    (200, 6.678314208984375),
                    (255, -7.865570068359375),
                ],
                214.7201690673828,
            ),
        ];
        for (ty, bytes, values, sum) in cases {
            let b = hex(bytes);
            assert_eq!(b.len() as u64, ty.type_size(), "{ty}");
            let y = deq(ty, &b, 256);
            for (i, v) in values {
                let v = v as f32;
                assert!(
                    (y[i] - v).abs() <= 1e-5 * v.abs().max(1.0),
                    "{ty}[{i}]: {} vs {v}",
                    y[i]
                );
            }
            let s: f64 = y.iter().map(|&v| f64::from(v)).sum();
            assert!((s - sum).abs() < 1e-3, "{ty} sum {s} vs {sum}");
        }
    }

    #[test]
    fn quantizers_round_trip() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 64) as f32 - 30.0) / 17.0)
            .collect();
        let q = quantize_q4_1(&x).unwrap();
        let y = deq(GgmlType::Q4_1, &q, 64);
        for (b, (x, y)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
            let (lo, hi) = x
                .iter()
                .fold((f32::MAX, f32::MIN), |(l, h), &v| (l.min(v), h.max(v)));
            let step = (hi - lo) / 15.0;
            for (a, b2) in x.iter().zip(y) {
                assert!(
                    (a - b2).abs() <= step * 0.51 + 1e-2,
                    "block {b}: {a} vs {b2}"
                );
            }
        }
        let q = quantize_q8_0(&x).unwrap();
        let y = deq(GgmlType::Q8_0, &q, 64);
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() <= 2.0 / 127.0, "{a} vs {b}");
        }
        assert!(quantize_q4_1(&x[..31]).is_none());
    }

    #[test]
    fn sizes_and_refusals() {
        assert_eq!(GgmlType::Q4_1.row_bytes(576), Some(18 * 20));
        assert_eq!(GgmlType::Q4_1.row_bytes(33), None);
        assert_eq!(GgmlType::F32.row_bytes(u64::MAX / 2), None);
        assert_eq!(GgmlType::Q6K.row_bytes(256 * 3), Some(630));
        assert_eq!(GgmlType::from_id(4), None);
        assert_eq!(GgmlType::from_id(30), Some(GgmlType::Bf16));
        let mut out = [0.0; 32];
        assert_eq!(
            dequantize(GgmlType::Q2K, &[0; 84], &mut out),
            Err(DequantError::Unsupported(GgmlType::Q2K))
        );
        assert!(matches!(
            dequantize(GgmlType::Q4_1, &[0; 19], &mut out),
            Err(DequantError::SizeMismatch { .. })
        ));
        assert!(matches!(
            dequantize_vec(GgmlType::F32, &[0; 4], u64::MAX),
            Err(DequantError::SizeMismatch { .. })
        ));
        for e in TABLE {
            assert_eq!(GgmlType::from_id(e.1), Some(e.0));
            assert_eq!(e.0.id(), e.1);
        }
    }
}
