//! The processing engine (PE): matrix products (f32, bf16/f16 weights, integer) and convolution.
//!
//! Each instruction: its fields, then its encoding, decoding (with every check the
//! decoder makes) and operands side by side. Opcodes, sizes and engines: the table in
//! [`super`].

use crate::ap::{AP_SIZE, AccessPattern};
use crate::codec::*;
use crate::error::{DecodeError, Reason};
use crate::instr::{HEADER_SIZE, Role};
use crate::op::block_format::check_block_rows;
use crate::op::*;
use nrt_hal::DType;

/// Flags of [`Op::MatMul`].
pub mod matmul_flags {
    /// `C += …` instead of `C = …`.
    pub const ACCUMULATE: u32 = 1;
    /// A is stored transposed: its AP is `[b1, b2, K, M]`.
    pub const TRANSPOSE_A: u32 = 2;
    /// B is stored transposed: its AP is `[b1, b2, N, K]`.
    pub const TRANSPOSE_B: u32 = 4;
    /// B (f32 constant weights, shared by every batch) is stored in column panels of `NR`
    /// columns (one of [`PANEL_WIDTHS`]), each panel `K × NR` row-major, the last one
    /// zero-padded past N (NCM 1.3): its AP is `[1, ceil(N/NR), K, NR]` with strides
    /// `[any, K·NR, NR, 1]`. bf16 weights pair K: each panel row holds rows `2t` and `2t+1`
    /// of the panel interleaved (`[2t, j]` then `[2t+1, j]`, K zero-padded to even): AP
    /// `[1, ceil(N/NR), ceil(K/2), 2·NR]`, strides `[any, ceil(K/2)·2·NR, 2·NR, 1]`. Not
    /// with `TRANSPOSE_B`.
    pub const PACKED_B: u32 = 8;
    /// With a bf16 B (not packed): A's f32 values multiply the widened B as they are — the
    /// products of ONNX's `MatMul(A, Cast(B))` — instead of A rounded to bf16 first (what
    /// `vdpbf16ps` multiplies; the auto-cast product). NCM 1.13; only with a bf16 B.
    pub const F32_A: u32 = 16;
    /// The panel widths a `PACKED_B` operand may have.
    pub const PANEL_WIDTHS: [u32; 3] = [16, 32, 64];
    /// Every defined bit.
    pub const ALL: u32 = ACCUMULATE | TRANSPOSE_A | TRANSPOSE_B | PACKED_B | F32_A;

    /// Floats of a `k × n` B packed in panels of `nr` columns (`None` on overflow).
    pub fn packed_len(k: usize, n: usize, nr: usize) -> Option<usize> {
        n.div_ceil(nr.max(1)).checked_mul(nr)?.checked_mul(k)
    }

    /// The bf16 [`PACKED_B`] layout of the `k × n` matrix `get(p, j)` (already bf16 bits),
    /// `ceil(k/2)·2·ceil(n/nr)·nr` elements, zero-padded.
    pub fn pack_b_pairs(
        k: usize,
        n: usize,
        nr: usize,
        get: impl Fn(usize, usize) -> u16,
    ) -> Vec<u16> {
        let kp = k.div_ceil(2);
        let panels = n.div_ceil(nr);
        let mut out = vec![0u16; panels * kp * 2 * nr];
        for q in 0..panels {
            for t in 0..kp {
                for jj in 0..nr {
                    let j = q * nr + jj;
                    for h in 0..2 {
                        let p = 2 * t + h;
                        if j < n && p < k {
                            out[((q * kp + t) * nr + jj) * 2 + h] = get(p, j);
                        }
                    }
                }
            }
        }
        out
    }

    /// Packs the `k × n` matrix `get(p, j)` into `out` (at least [`packed_len`] floats) in
    /// the [`PACKED_B`] layout with panels of `nr` columns, zero-padding the last panel.
    pub fn pack_b(
        k: usize,
        n: usize,
        nr: usize,
        get: impl Fn(usize, usize) -> f32,
        out: &mut [f32],
    ) {
        for q in 0..n.div_ceil(nr) {
            for p in 0..k {
                let row = &mut out[(q * k + p) * nr..(q * k + p + 1) * nr];
                for (jj, o) in row.iter_mut().enumerate() {
                    let j = q * nr + jj;
                    *o = if j < n { get(p, j) } else { 0.0 };
                }
            }
        }
    }
}

/// The layout of a packed B of [`Op::MatMulInteger`] (`packed_b`, NCM 1.7): constant weights
/// that the compiler lays out once the way the product reads them, so no execution re-packs
/// them (at 64×512×512 that packing was a third of the instruction's time).
///
/// For a `K × N` B of type `u8` or `i8`, with `K4 = ⌈K/4⌉` and
/// `Np =` [`qmatmul_layout::padded_columns`]`(N)`: `K4 + 1` rows of `Np` little-endian
/// 32-bit words. Word `j` of row `w < K4` holds the bytes `B[4w..4w+4, j]` (k order, zero past `K`)
/// *re-biased to i8* (`b` for i8, `b ^ 0x80`
/// — that is `b − 128` — for u8); word `j < N` of row `K4` is column `j`'s sum of those
/// re-biased bytes as an i32 (the zero-point correction's term); every other word is 0. The
/// operand's AP is `[1, 1, K4 + 1, 4·Np]` of B's type with strides `[0, 0, 4·Np, 1]` (the
/// type still says how the zero point is read). Not for a B that differs between batches.
pub mod qmatmul_layout {
    /// The product's column tile: packed rows are padded to a multiple of it.
    pub const COLUMN_TILE: usize = 32;

    /// Words in one packed row for `n` columns: whole tiles plus one 64-byte line (so the
    /// `K4` rows of a tile fall into consecutive L1 sets, not the same few: with `n = 512`
    /// a 2 KiB row stride put every row in one of two sets).
    pub fn padded_columns(n: usize) -> Option<usize> {
        n.div_ceil(COLUMN_TILE)
            .checked_mul(COLUMN_TILE)?
            .checked_add(16)
    }

    /// Bytes of the packed layout of a `k × n` B (`None` on overflow).
    pub fn packed_len(k: usize, n: usize) -> Option<usize> {
        k.div_ceil(4)
            .checked_add(1)?
            .checked_mul(padded_columns(n)?)?
            .checked_mul(4)
    }

    /// Packs the `k × n` matrix `get(p, j)` (its bytes as stored; `signed`: i8, else u8).
    /// `None` on overflow, or when the host cannot give the packed bytes (the compiler then
    /// keeps the weight unpacked).
    pub fn pack(
        k: usize,
        n: usize,
        signed: bool,
        get: impl Fn(usize, usize) -> u8,
    ) -> Option<Vec<u8>> {
        let np = padded_columns(n)?;
        let k4 = k.div_ceil(4);
        let len = packed_len(k, n)?;
        let mut out = Vec::new();
        out.try_reserve_exact(len).ok()?;
        out.resize(len, 0u8);
        let flip = if signed { 0 } else { 0x80 };
        for j in 0..n {
            let mut sum = 0i32;
            for p in 0..k {
                let byte = get(p, j) ^ flip;
                sum = sum.wrapping_add(byte as i8 as i32);
                out[((p / 4) * np + j) * 4 + p % 4] = byte;
            }
            let at = (k4 * np + j) * 4;
            out[at..at + 4].copy_from_slice(&sum.to_le_bytes());
        }
        Some(out)
    }
}

/// What [`Op::MatMul`] applies to each output tile while it is still in cache, before it
/// is stored: `C = func(alpha·op(A)·op(B) [+ C] + bias + residual)`. Both added operands have
/// C's shape (broadcast by stride 0: a per-column bias is `[.., .., M, N]` with strides
/// `[0, 0, 0, 1]`), must be f32 and must not overlap C. The default (no operand, `Identity`)
/// is no epilogue: such a MatMul encodes as [`opcode::MATMUL`], one with an epilogue as
/// [`opcode::MATMUL_EPI`] (NCM 1.1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Epilogue {
    /// Added to every output element (usually a per-column bias vector, broadcast).
    pub bias: Option<AccessPattern>,
    /// A second added tensor (a residual connection: usually C's full shape).
    pub residual: Option<AccessPattern>,
    /// The activation applied last (`Identity`: none).
    pub func: ActFunc,
    /// The function's first parameter (as [`Op::Activation`]'s `alpha`).
    pub act_alpha: f32,
    /// The function's second parameter (as [`Op::Activation`]'s `beta`).
    pub act_beta: f32,
}

impl Epilogue {
    /// No epilogue.
    pub const NONE: Epilogue = Epilogue {
        bias: None,
        residual: None,
        func: ActFunc::Identity,
        act_alpha: 0.0,
        act_beta: 0.0,
    };

    /// Whether it does nothing.
    pub const fn is_none(&self) -> bool {
        self.bias.is_none() && self.residual.is_none() && matches!(self.func, ActFunc::Identity)
    }
}

impl Default for Epilogue {
    fn default() -> Self {
        Epilogue::NONE
    }
}

/// The layout of a `PACKED_B` operand holding a `k × n` matrix (offsets inside its AP):
/// `[1, ceil(n/NR), k, NR]`, NR one of the panel widths, strides `[any, k·NR, NR, 1]`.
/// bf16: `[1, ceil(n/NR), ceil(k/2), 2·NR]`, strides `[any, ceil(k/2)·2·NR, 2·NR, 1]`.
fn check_packed_b(b: &AccessPattern, k: u32, n: u32) -> Result<(), DecodeError> {
    let pairs = b.dtype == DType::Bf16;
    let row = b.shape[3];
    let nr = if pairs { row / 2 } else { row };
    if !matmul_flags::PANEL_WIDTHS.contains(&nr) || (pairs && !row.is_multiple_of(2)) {
        return Err(DecodeError::field("b.shape", Reason::OutOfRange(row as u64)).at(16 + 12));
    }
    let rows = if pairs { k.div_ceil(2) } else { k };
    dim_eq("b.shape", 0, 1, b.shape[0])?;
    dim_eq("b.shape", 1, n.div_ceil(nr), b.shape[1])?;
    dim_eq("b.shape", 2, rows, b.shape[2])?;
    let want = [
        None,
        Some(rows as i64 * row as i64),
        Some(row as i64),
        Some(1),
    ];
    for (d, w) in want.into_iter().enumerate() {
        if let Some(w) = w
            && b.stride[d] as i64 != w
            && !(d == 1 && b.shape[1] == 1)
        {
            return Err(
                DecodeError::field("b.stride", Reason::OutOfRange(b.stride[d] as u64))
                    .at(32 + 4 * d),
            );
        }
    }
    Ok(())
}

/// The layout of a packed B of [`Op::MatMulInteger`] holding a `k × n` matrix
/// ([`qmatmul_layout`]): `[1, 1, ⌈k/4⌉ + 1, 4·Np]`, strides `[any, any, 4·Np, 1]`, at a
/// 4-byte aligned address (the product reads it as words).
fn check_packed_int_b(b: &AccessPattern, k: u32, n: u32) -> Result<(), DecodeError> {
    let np = qmatmul_layout::padded_columns(n as usize)
        .and_then(|np| u32::try_from(np.checked_mul(4)?).ok())
        .ok_or_else(|| DecodeError::field("b.shape", Reason::OutOfRange(n as u64)).at(16 + 12))?;
    dim_eq("b.shape", 0, 1, b.shape[0])?;
    dim_eq("b.shape", 1, 1, b.shape[1])?;
    dim_eq("b.shape", 2, k.div_ceil(4) + 1, b.shape[2])?;
    dim_eq("b.shape", 3, np, b.shape[3])?;
    for (d, w) in [(2, np as i64), (3, 1)] {
        if b.stride[d] as i64 != w {
            return Err(
                DecodeError::field("b.stride", Reason::OutOfRange(b.stride[d] as u64))
                    .at(32 + 4 * d),
            );
        }
    }
    if !b.addr.is_multiple_of(4) {
        return Err(DecodeError::field("b.addr", Reason::OutOfRange(b.addr)).at(0));
    }
    Ok(())
}

/// PE: `C (+)= alpha · op(A) · op(B)`, batched over the two leading dimensions, then the
/// optional [`Epilogue`] (bias, residual, activation) on each output tile. A and C are
/// f32; B is f32, or bf16/f16 weights (NCM 1.1; the products accumulate in f32, and
/// with bf16 B the device rounds A to bf16 too).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MatMul {
    /// `[b1, b2, M, K]` (or `[b1, b2, K, M]` with `TRANSPOSE_A`).
    pub a: AccessPattern,
    /// `[b1, b2, K, N]` (or `[b1, b2, N, K]` with `TRANSPOSE_B`, or panels with
    /// `PACKED_B`: see [`matmul_flags::PACKED_B`]).
    pub b: AccessPattern,
    /// `[b1, b2, M, N]`.
    pub c: AccessPattern,
    /// Scale applied to the product.
    pub alpha: f32,
    /// [`matmul_flags`].
    pub flags: u32,
    /// Bias, residual and activation applied to the output tiles ([`Epilogue::NONE`]:
    /// none).
    pub epilogue: Epilogue,
}

impl MatMul {
    /// Its opcode: [`opcode::MATMUL_EPI`] with an epilogue, else [`opcode::MATMUL`].
    pub const fn opcode(&self) -> u8 {
        if self.epilogue.is_none() {
            opcode::MATMUL
        } else {
            opcode::MATMUL_EPI
        }
    }
}

impl Unit for MatMul {
    fn encode(&self, w: &mut W<'_>) {
        let Self {
            a,
            b,
            c,
            alpha,
            flags,
            epilogue,
        } = self;
        w.ap(a);
        w.ap(b);
        w.ap(c);
        if !epilogue.is_none() {
            w.opt_ap(&epilogue.bias);
            w.opt_ap(&epilogue.residual);
        }
        w.f32(*alpha);
        w.u32(*flags);
        if !epilogue.is_none() {
            w.u8(epilogue.func as u8);
            w.zeros(3);
            w.u32(epilogue.bias.is_some() as u32 | (epilogue.residual.is_some() as u32) << 1);
            w.f32(epilogue.act_alpha);
            w.f32(epilogue.act_beta);
        }
    }

    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError> {
        let b = r.b;
        let a = r.ap("a")?;
        let b_ = r.ap("b")?;
        let c = r.ap("c")?;
        let epi = b[0] == opcode::MATMUL_EPI;
        let epi_flags_at = HEADER_SIZE + 5 * AP_SIZE + 12;
        let epi_flags = if epi {
            let v = u32::from_le_bytes(b[epi_flags_at..epi_flags_at + 4].try_into().expect("4"));
            if v & !3 != 0 {
                return Err(
                    DecodeError::field("epilogue.flags", Reason::UnknownFlags(v & !3))
                        .at(epi_flags_at),
                );
            }
            v
        } else {
            0
        };
        let (bias, residual) = if epi {
            (
                r.opt_ap("bias", epi_flags & 1 != 0)?,
                r.opt_ap("residual", epi_flags & 2 != 0)?,
            )
        } else {
            (None, None)
        };
        let alpha = r.f32("alpha")?;
        let flags_at = r.pos;
        let flags = r.flags("flags", matmul_flags::ALL)?;
        let packed = flags & matmul_flags::PACKED_B != 0;
        if packed && flags & matmul_flags::TRANSPOSE_B != 0 {
            return Err(DecodeError::field(
                "flags",
                Reason::UnknownFlags(matmul_flags::TRANSPOSE_B),
            )
            .at(flags_at));
        }
        let mut epilogue = Epilogue {
            bias,
            residual,
            ..Epilogue::NONE
        };
        if epi {
            epilogue.func = r.enum_u8("epilogue.func", ActFunc::from_u8)?;
            r.zeros(3, "reserved")?;
            r.pos += 4;
            epilogue.act_alpha = r.f32("epilogue.act_alpha")?;
            epilogue.act_beta = r.f32("epilogue.act_beta")?;
            if epilogue.is_none() {
                // The encoding is canonical: no epilogue is opcode MATMUL.
                return Err(
                    DecodeError::field("epilogue", Reason::ReservedNonZero).at(epi_flags_at)
                );
            }
            for (ap, name, slot) in [
                (&epilogue.bias, "bias.dtype", 3),
                (&epilogue.residual, "residual.dtype", 4),
            ] {
                if let Some(ap) = ap {
                    let shape = if slot == 3 {
                        "bias.shape"
                    } else {
                        "residual.shape"
                    };
                    require_dtype(ap, name, F32)
                        .map_err(|e| e.shifted(HEADER_SIZE + slot * AP_SIZE))?;
                    same_shape(shape, &c.shape, ap)
                        .map_err(|e| e.shifted(HEADER_SIZE + slot * AP_SIZE))?;
                }
            }
        }
        let base = HEADER_SIZE;
        require_dtype(&a, "a.dtype", F32).map_err(|e| e.shifted(base))?;
        // B may hold half-precision weights (auto-cast): bf16 or f16, f32 accumulation.
        let b_types: &[DType] = if packed {
            &[DType::F32, DType::Bf16]
        } else {
            &[DType::F32, DType::Bf16, DType::F16]
        };
        require_dtype(&b_, "b.dtype", b_types).map_err(|e| e.shifted(base + AP_SIZE))?;
        if flags & matmul_flags::F32_A != 0 && (packed || b_.dtype != DType::Bf16) {
            return Err(
                DecodeError::field("flags", Reason::UnknownFlags(matmul_flags::F32_A)).at(flags_at),
            );
        }
        require_dtype(&c, "c.dtype", F32).map_err(|e| e.shifted(base + 2 * AP_SIZE))?;
        let (m, k) = if flags & matmul_flags::TRANSPOSE_A != 0 {
            (a.shape[3], a.shape[2])
        } else {
            (a.shape[2], a.shape[3])
        };
        let (kb, n) = if flags & matmul_flags::TRANSPOSE_B != 0 {
            (b_.shape[3], b_.shape[2])
        } else if packed {
            // K is A's (B's rows were checked against it, pairs for bf16).
            (k, c.shape[3])
        } else {
            (b_.shape[2], b_.shape[3])
        };
        let bo = base + AP_SIZE;
        let co = base + 2 * AP_SIZE;
        if packed {
            check_packed_b(&b_, k, n).map_err(|e| e.shifted(bo))?;
        }
        if kb != k {
            return Err(DecodeError::field(
                "b.shape",
                Reason::ShapeMismatch {
                    dim: 2,
                    expected: k,
                    found: kb,
                },
            )
            .at(bo + 16 + 8));
        }
        for d in 0..2 {
            if !packed {
                dim_eq("b.shape", d, c.shape[d], b_.shape[d]).map_err(|e| e.shifted(bo))?;
            }
            dim_eq("a.shape", d, c.shape[d], a.shape[d]).map_err(|e| e.shifted(base))?;
        }
        dim_eq("c.shape", 2, m, c.shape[2]).map_err(|e| e.shifted(co))?;
        dim_eq("c.shape", 3, n, c.shape[3]).map_err(|e| e.shifted(co))?;
        Ok(Self {
            a,
            b: b_,
            c,
            alpha,
            flags,
            epilogue,
        })
    }

    operands!(|f| Self {
        a,
        b,
        c,
        flags,
        epilogue: Epilogue { bias, residual, .. },
        ..
    } => {
        f(0, "a", Role::Read, a);
        f(1, "b", Role::Read, b);
        let accumulate = *flags & matmul_flags::ACCUMULATE != 0;
        f(
            2,
            "c",
            if accumulate {
                Role::ReadWrite
            } else {
                Role::Write
            },
            c,
        );
        if let Some(x) = bias {
            f(3, "bias", Role::Read, x);
        }
        if let Some(x) = residual {
            f(4, "residual", Role::Read, x);
        }
    });
}

/// PE: integer matrix product, `C = (A − a_zero)·(B − b_zero)` in i32 (wrapping),
/// batched over the two leading dimensions (ONNX MatMulInteger); with `scale`, the sums
/// are converted to f32 and multiplied by it (ONNX Runtime's `MatMulIntegerToFloat`:
/// a dynamically quantized layer's `Cast` and `Mul` fused, [`opcode::MATMUL_INTEGER_SCALED`],
/// NCM 1.7).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MatMulInteger {
    /// `[b1, b2, M, K]` u8 or i8.
    pub a: AccessPattern,
    /// `[b1, b2, K, N]` u8 or i8; with `packed_b`, the layout of
    /// [`qmatmul_layout`] instead.
    pub b: AccessPattern,
    /// `[b1, b2, M, N]` i32 (f32 with `scale`).
    pub c: AccessPattern,
    /// `[b1, b2, M, 1]` of A's type (per row, usually broadcast), if any.
    pub a_zero: Option<AccessPattern>,
    /// `[b1, b2, 1, N]` of B's type (per column, usually broadcast), if any.
    pub b_zero: Option<AccessPattern>,
    /// B is constant weights packed once by the compiler ([`qmatmul_layout`], NCM 1.7).
    pub packed_b: bool,
    /// `[b1, b2, 1, N]` f32 (per column or, with strides 0, per tensor), if any.
    pub scale: Option<AccessPattern>,
}

impl MatMulInteger {
    /// Its opcode: [`opcode::MATMUL_INTEGER_SCALED`] with a scale, else
    /// [`opcode::MATMUL_INTEGER`].
    pub const fn opcode(&self) -> u8 {
        if self.scale.is_none() {
            opcode::MATMUL_INTEGER
        } else {
            opcode::MATMUL_INTEGER_SCALED
        }
    }
}

impl Unit for MatMulInteger {
    fn encode(&self, w: &mut W<'_>) {
        let Self {
            a,
            b,
            c,
            a_zero,
            b_zero,
            packed_b,
            scale,
        } = self;
        w.ap(a);
        w.ap(b);
        w.ap(c);
        w.opt_ap(a_zero);
        w.opt_ap(b_zero);
        if scale.is_some() {
            w.opt_ap(scale);
        }
        w.u32(a_zero.is_some() as u32 | (b_zero.is_some() as u32) << 1 | (*packed_b as u32) << 2);
        w.u32(0);
    }

    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError> {
        let b = r.b;
        let scaled = b[0] == opcode::MATMUL_INTEGER_SCALED;
        let aps = if scaled { 6 } else { 5 };
        let flags_at = HEADER_SIZE + aps * AP_SIZE;
        let flags = u32::from_le_bytes(b[flags_at..flags_at + 4].try_into().expect("4"));
        if flags & !7 != 0 {
            return Err(DecodeError::field("flags", Reason::UnknownFlags(flags)).at(flags_at));
        }
        let packed_b = flags & 4 != 0;
        let a = r.ap("a")?;
        let b_ = r.ap("b")?;
        let c = r.ap("c")?;
        let a_zero = r.opt_ap("a_zero", flags & 1 != 0)?;
        let b_zero = r.opt_ap("b_zero", flags & 2 != 0)?;
        let scale = if scaled { Some(r.ap("scale")?) } else { None };
        r.u32();
        r.zeros(4, "reserved")?;
        const Q: &[DType] = &[DType::U8, DType::I8];
        require_dtype(&a, "a.dtype", Q).map_err(|e| e.shifted(HEADER_SIZE))?;
        require_dtype(&b_, "b.dtype", Q).map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
        let c_type = if scaled { DType::F32 } else { DType::I32 };
        require_dtype(&c, "c.dtype", &[c_type])
            .map_err(|e| e.shifted(HEADER_SIZE + 2 * AP_SIZE))?;
        let [b1, b2, m, k] = a.shape;
        let n = c.shape[3];
        if packed_b {
            check_packed_int_b(&b_, k, n).map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
        } else {
            same_shape("b.shape", &[b1, b2, k, n], &b_)
                .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
        }
        same_shape("c.shape", &[b1, b2, m, n], &c)
            .map_err(|e| e.shifted(HEADER_SIZE + 2 * AP_SIZE))?;
        if let Some(z) = &a_zero {
            let at = HEADER_SIZE + 3 * AP_SIZE;
            require_dtype(z, "a_zero.dtype", &[a.dtype]).map_err(|e| e.shifted(at))?;
            same_shape("a_zero.shape", &[b1, b2, m, 1], z).map_err(|e| e.shifted(at))?;
        }
        if let Some(z) = &b_zero {
            let at = HEADER_SIZE + 4 * AP_SIZE;
            require_dtype(z, "b_zero.dtype", &[b_.dtype]).map_err(|e| e.shifted(at))?;
            same_shape("b_zero.shape", &[b1, b2, 1, n], z).map_err(|e| e.shifted(at))?;
        }
        if let Some(sc) = &scale {
            let at = HEADER_SIZE + 5 * AP_SIZE;
            require_dtype(sc, "scale.dtype", &[DType::F32]).map_err(|e| e.shifted(at))?;
            same_shape("scale.shape", &[b1, b2, 1, n], sc).map_err(|e| e.shifted(at))?;
        }
        Ok(Self {
            a,
            b: b_,
            c,
            a_zero,
            b_zero,
            packed_b,
            scale,
        })
    }

    operands!(|f| Self {
        a,
        b,
        c,
        a_zero,
        b_zero,
        scale,
        ..
    } => {
        f(0, "a", Role::Read, a);
        f(1, "b", Role::Read, b);
        f(2, "c", Role::Write, c);
        if let Some(x) = a_zero {
            f(3, "a_zero", Role::Read, x);
        }
        if let Some(x) = b_zero {
            f(4, "b_zero", Role::Read, x);
        }
        if let Some(x) = scale {
            f(5, "scale", Role::Read, x);
        }
    });
}

/// PE: 2-D convolution, `out[n,o,y,x] = bias[o] + Σ in[n,c,·,·]·w[o,c,·,·]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Conv {
    /// `[N, C, H, W]`.
    pub input: AccessPattern,
    /// `[O, C/groups, KH, KW]`.
    pub weight: AccessPattern,
    /// `[N, O, OH, OW]`.
    pub output: AccessPattern,
    /// `[1, 1, 1, O]`, if any.
    pub bias: Option<AccessPattern>,
    /// Scratch for the im2col lowering: `(C/groups)·KH·KW·OH·OW` fp32 elements, if any
    /// (without it the engine convolves directly).
    pub workspace: Option<AccessPattern>,
    /// Stride, padding, dilation (kernel unused).
    pub window: Window,
    /// Groups.
    pub groups: u32,
    /// Applied to each output element after the bias, while the output rows are still
    /// in cache (`Identity`: none — encoded as [`opcode::CONV`]; any other function as
    /// [`opcode::CONV_ACT`], NCM 1.5): `(function, alpha, beta)` as
    /// [`Op::Activation`]'s.
    pub act: (ActFunc, f32, f32),
}

impl Conv {
    /// Its opcode: [`opcode::CONV_ACT`] with an activation, else [`opcode::CONV`].
    pub const fn opcode(&self) -> u8 {
        if matches!(self.act.0, ActFunc::Identity) {
            opcode::CONV
        } else {
            opcode::CONV_ACT
        }
    }
}

impl Unit for Conv {
    fn encode(&self, w: &mut W<'_>) {
        let Self {
            input,
            weight,
            output,
            bias,
            workspace,
            window,
            groups,
            act,
        } = self;
        w.ap(input);
        w.ap(weight);
        w.ap(output);
        w.opt_ap(bias);
        w.opt_ap(workspace);
        w.window(window);
        w.u32(*groups);
        w.u32(bias.is_some() as u32 | (workspace.is_some() as u32) << 1);
        if !matches!(act.0, ActFunc::Identity) {
            w.u8(act.0 as u8);
            w.zeros(3);
            w.f32(act.1);
            w.f32(act.2);
            w.zeros(4);
        }
    }

    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError> {
        let b = r.b;
        let input = r.ap("input")?;
        let weight = r.ap("weight")?;
        let output = r.ap("output")?;
        let flags_at = HEADER_SIZE + 5 * AP_SIZE + 40 + 4;
        let flags = u32::from_le_bytes(b[flags_at..flags_at + 4].try_into().expect("4"));
        if flags & !3 != 0 {
            return Err(DecodeError::field("flags", Reason::UnknownFlags(flags)).at(flags_at));
        }
        let bias = r.opt_ap("bias", flags & 1 != 0)?;
        let workspace = r.opt_ap("workspace", flags & 2 != 0)?;
        let window = r.window(false)?;
        let at = r.pos;
        let groups = r.u32();
        let base = HEADER_SIZE;
        for (ap, f, i) in [
            (&input, "input.dtype", 0),
            (&weight, "weight.dtype", 1),
            (&output, "output.dtype", 2),
        ] {
            require_dtype(ap, f, F32).map_err(|e| e.shifted(base + i * AP_SIZE))?;
        }
        let (c, o) = (input.shape[1], weight.shape[0]);
        if groups == 0 || c % groups != 0 || o % groups != 0 {
            return Err(DecodeError::field("groups", Reason::OutOfRange(groups as u64)).at(at));
        }
        let wo = base + AP_SIZE;
        let oo = base + 2 * AP_SIZE;
        dim_eq("weight.shape", 1, c / groups, weight.shape[1]).map_err(|e| e.shifted(wo))?;
        dim_eq("output.shape", 0, input.shape[0], output.shape[0]).map_err(|e| e.shifted(oo))?;
        dim_eq("output.shape", 1, o, output.shape[1]).map_err(|e| e.shifted(oo))?;
        for d in 0..2 {
            let want = window
                .out_dim(d, input.shape[2 + d], weight.shape[2 + d])
                .ok_or(
                    DecodeError::field("window", Reason::OutOfRange(weight.shape[2 + d] as u64))
                        .at(HEADER_SIZE + 5 * AP_SIZE),
                )?;
            dim_eq("output.shape", 2 + d, want, output.shape[2 + d]).map_err(|e| e.shifted(oo))?;
        }
        if let Some(bias) = &bias {
            require_dtype(bias, "bias.dtype", F32).map_err(|e| e.shifted(base + 3 * AP_SIZE))?;
            same_shape("bias.shape", &[1, 1, 1, o], bias)
                .map_err(|e| e.shifted(base + 3 * AP_SIZE))?;
        }
        if let Some(ws) = &workspace {
            let need = (c / groups) as u64
                * weight.shape[2] as u64
                * weight.shape[3] as u64
                * output.shape[2] as u64
                * output.shape[3] as u64;
            require_dtype(ws, "workspace.dtype", F32).map_err(|e| e.shifted(base + 4 * AP_SIZE))?;
            if ws.elements() < need || !ws.is_dense() {
                return Err(DecodeError::field(
                    "workspace.shape",
                    Reason::OutOfRange(ws.elements()),
                )
                .at(base + 4 * AP_SIZE + 16));
            }
        }
        let mut act = (ActFunc::Identity, 0.0, 0.0);
        if b[0] == opcode::CONV_ACT {
            r.pos = flags_at + 4;
            let at = r.pos;
            act.0 = r.enum_u8("act.func", ActFunc::from_u8)?;
            r.zeros(3, "reserved")?;
            act.1 = r.f32("act.alpha")?;
            act.2 = r.f32("act.beta")?;
            r.zeros(4, "reserved")?;
            if matches!(act.0, ActFunc::Identity) {
                // The encoding is canonical: no activation is opcode CONV.
                return Err(DecodeError::field("act.func", Reason::ReservedNonZero).at(at));
            }
        }
        Ok(Self {
            input,
            weight,
            output,
            bias,
            workspace,
            window,
            groups,
            act,
        })
    }

    operands!(|f| Self {
        input,
        weight,
        output,
        bias,
        workspace,
        ..
    } => {
        f(0, "input", Role::Read, input);
        f(1, "weight", Role::Read, weight);
        f(2, "output", Role::Write, output);
        if let Some(x) = bias {
            f(3, "bias", Role::Read, x);
        }
        if let Some(x) = workspace {
            f(4, "workspace", Role::Write, x);
        }
    });
}

/// PE: a product with block-quantized weights (NCM 1.11), `C = A·Wᵀ`: `A` f32
/// `[b1, b2, M, K]`, `W` the `N` rows of `K` weights of a linear layer in a
/// [`BlockFormat`] (as a GGUF file stores them, never widened to f32: the kernel decodes each
/// block in registers), `C` f32 `[b1, b2, M, N]`. The device rounds each row of A to 8-bit
/// blocks of 32 with their own scale (llama.cpp's `Q8` activations) and multiplies in
/// integers, block by block, accumulating in f32.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MatMulBlockQuant {
    /// `[b1, b2, M, K]` f32, `K` a multiple of 32.
    pub a: AccessPattern,
    /// `[1, 1, N, K/32 · block_bytes]` u8, strides `[any, any, ≥ row bytes, 1]` (shared by
    /// every batch).
    pub w: AccessPattern,
    /// `[b1, b2, M, N]` f32.
    pub c: AccessPattern,
    /// How `w` is stored.
    pub format: BlockFormat,
}

impl Unit for MatMulBlockQuant {
    fn encode(&self, w: &mut W<'_>) {
        w.ap(&self.a);
        w.ap(&self.w);
        w.ap(&self.c);
        w.u8(self.format as u8);
        w.zeros(7);
    }

    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError> {
        let a = r.ap("a")?;
        let w_ = r.ap("w")?;
        let c = r.ap("c")?;
        let format = r.enum_u8("format", BlockFormat::from_u8)?;
        r.zeros(7, "reserved")?;
        require_dtype(&a, "a.dtype", &[DType::F32]).map_err(|e| e.shifted(HEADER_SIZE))?;
        require_dtype(&c, "c.dtype", &[DType::F32])
            .map_err(|e| e.shifted(HEADER_SIZE + 2 * AP_SIZE))?;
        let [b1, b2, m, k] = a.shape;
        check_block_rows(&w_, ("w.dtype", "w.shape", "w.stride"), format, k)
            .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
        same_shape("c.shape", &[b1, b2, m, w_.shape[2]], &c)
            .map_err(|e| e.shifted(HEADER_SIZE + 2 * AP_SIZE))?;
        Ok(Self {
            a,
            w: w_,
            c,
            format,
        })
    }

    operands!(|f| Self { a, w, c, .. } => {
        f(0, "a", Role::Read, a);
        f(1, "w", Role::Read, w);
        f(2, "c", Role::Write, c);
    });
}
