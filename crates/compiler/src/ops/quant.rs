//! Rounding and linear quantization, as sequences of existing DVE / ACT / POOL instructions:
//! Round, QuantizeLinear, DequantizeLinear (per tensor and per axis), DynamicQuantizeLinear;
//! and the integer products on PE's `Op::MatMulInteger` (u8/i8 → i32, AVX-512 VNNI on the
//! simulator when the CPU has it): MatMulInteger, and QLinearMatMul as that product
//! requantized (`round(acc · a_scale·b_scale/y_scale) + y_zero_point`, saturated).
//!
//! Rounding to nearest, ties to even, is one ACT instruction, `ActFunc::Round` (NCM 1.7;
//! before it, a clamp to `±2^22`, `(x + 1.5·2^23) − 1.5·2^23` and, for `Round`, a select of
//! the large values: three to five passes). Quantization is then `round(x / scale)`, `+
//! zero_point` and the converting copy into the quantized type, which saturates to the
//! type's range (NaN → 0) — the clamp to that range it replaces gave the same values. Blocked quantization (opset 21's
//! `block_size`) expands each parameter to the input's shape with one POOL `Gather`.
//! Float8 / int4 / int2 types are not supported and are named in the error.

use super::unary::infer_same;
use super::{Dtypes, Registry};
use crate::error::{ErrorKind, Result};
use crate::graph::{Node, Value, ValueId};
use crate::lower::view::{View, dense_ap, mk_ap};
use crate::lower::{At, Lowerer};
use crate::params::{Ctx, Out, matmul_shape, out, window_params};
use crate::tensor::dtype_from_onnx;
use nrt_hal::DType;
use nrt_isa::op;
use nrt_isa::{AccessPattern, ActFunc, BinaryOp, Op, qmatmul_layout};

pub(super) fn register(r: &mut Registry) {
    r.op("Round", 11, infer_same)
        .dtypes(Dtypes::Float)
        .note("ties to even")
        .device(lower!(lower_round));
    r.op("QuantizeLinear", 10, infer_quantize)
        .dtypes(Dtypes::Float)
        .note("per tensor, per axis or blocked; u8, i8, u16, i16")
        .device(lower!(lower_quantize));
    r.op("DequantizeLinear", 10, infer_dequantize)
        .note("per tensor, per axis or blocked; u8, i8, u16, i16, i32 to f32")
        .device(lower!(lower_dequantize));
    r.op("MatMulInteger", 10, infer_matmul_integer)
        .note("u8/i8; zero points per tensor, per row of A, per column of B")
        .device(lower!(lower_matmul_integer));
    r.op("QLinearMatMul", 10, infer_qlinear_matmul)
        .note("u8/i8; scales per tensor (B's also per column), f16/bf16 ones widened")
        .device(lower!(lower_qlinear_matmul));
    r.op("ConvInteger", 10, infer_conv_integer)
        .note("1-D and 2-D, group 1: im2col copies on POOL, then MatMulInteger")
        .device(lower!(lower_conv_integer));
    r.op("QLinearConv", 10, infer_qlinear_conv)
        .note("as ConvInteger, requantized")
        .device(lower!(lower_qlinear_conv));
    r.op("DynamicQuantizeLinear", 11, infer_dynamic_quantize)
        .dtypes(Dtypes::Float)
        .device(lower!(lower_dynamic_quantize));
}

/// Scale / zero-point geometry: `None` per tensor, `Some(axis)` per axis or, with a
/// `block_size`, per block along the axis.
fn q_axis(c: &Ctx, x: &Value, scale: &Value, zp: Option<&Value>) -> Result<Option<usize>> {
    let block = c.n.attr_i("block_size", 0)?;
    if scale.dtype != DType::F32 {
        return Err(c.e(
            ErrorKind::UnsupportedDType,
            format!(
                "scale '{}' is {}; the device quantizes with f32 scales",
                scale.name, scale.dtype
            ),
        ));
    }
    if let Some(z) = zp
        && z.shape != scale.shape
    {
        return Err(c.mismatch(format!(
            "zero point {:?} for scale {:?}",
            z.shape, scale.shape
        )));
    }
    if block != 0 {
        // Blocked: the scale has the input's shape with ⌈D/block⌉ along the axis.
        let axis = c.norm_axis(c.n.attr_i("axis", 1)?, x.shape.len())?;
        let b = usize::try_from(block).map_err(|_| c.bad_attr(format!("block_size {block}")))?;
        let mut want = x.shape.clone();
        want[axis] = x.shape[axis].div_ceil(b);
        if scale.shape != want {
            return Err(c.mismatch(format!(
                "scale of shape {:?} for blocks of {b} along axis {axis} of {:?} ({want:?} expected)",
                scale.shape, x.shape
            )));
        }
        return Ok(Some(axis));
    }
    if scale.shape.iter().product::<usize>() == 1 && scale.shape.len() <= 1 {
        return Ok(None);
    }
    if scale.shape.len() != 1 {
        return Err(c.e(
            ErrorKind::UnsupportedOp,
            format!(
                "scale of shape {:?} (blocked quantization is not supported)",
                scale.shape
            ),
        ));
    }
    let axis = c.norm_axis(c.n.attr_i("axis", 1)?, x.shape.len())?;
    if scale.shape[0] != x.shape[axis] {
        return Err(c.mismatch(format!(
            "{} scales for axis {axis} of size {}",
            scale.shape[0], x.shape[axis]
        )));
    }
    Ok(Some(axis))
}

/// Checks a quantized element type (`what` names the tensor).
fn q_type(c: &Ctx, name: &str, dt: DType, i32_too: bool) -> Result<()> {
    if matches!(dt, DType::U8 | DType::I8 | DType::U16 | DType::I16)
        || (i32_too && dt == DType::I32)
    {
        return Ok(());
    }
    Err(c.e(
        ErrorKind::UnsupportedDType,
        format!("'{name}' is {dt}; the device quantizes to u8, i8, u16 and i16"),
    ))
}

/// QuantizeLinear: the zero point's type, else `output_dtype`, else u8.
pub(crate) fn infer_quantize(c: &Ctx) -> Result<Vec<Out>> {
    let (x, s, z) = (c.input(0)?, c.input(1)?, c.opt(2));
    q_axis(c, x, s, z)?;
    let dt = match z {
        Some(z) => z.dtype,
        None => match c.n.attr_i("output_dtype", 0)? {
            0 => DType::U8,
            t => i32::try_from(t)
                .ok()
                .and_then(dtype_from_onnx)
                .ok_or_else(|| c.e(ErrorKind::UnsupportedDType, format!("output_dtype {t}")))?,
        },
    };
    q_type(c, "y_zero_point", dt, false)?;
    Ok(vec![out(dt, x.shape.clone())])
}

/// DequantizeLinear: f32.
pub(crate) fn infer_dequantize(c: &Ctx) -> Result<Vec<Out>> {
    let (x, s, z) = (c.input(0)?, c.input(1)?, c.opt(2));
    q_type(c, &x.name, x.dtype, true)?;
    if let Some(z) = z
        && z.dtype != x.dtype
    {
        return Err(c.mismatch(format!("zero point of type {} for {}", z.dtype, x.dtype)));
    }
    q_axis(c, x, s, z)?;
    Ok(vec![out(DType::F32, x.shape.clone())])
}

/// DynamicQuantizeLinear: u8 data, f32 scale, u8 zero point (scalars).
pub(crate) fn infer_dynamic_quantize(c: &Ctx) -> Result<Vec<Out>> {
    let x = c.input(0)?;
    Ok(vec![
        out(DType::U8, x.shape.clone()),
        out(DType::F32, vec![]),
        out(DType::U8, vec![]),
    ])
}

/// Checks that `v` is an integer-product operand (u8 or i8).
fn int8_type(c: &Ctx, v: &Value) -> Result<()> {
    if matches!(v.dtype, DType::U8 | DType::I8) {
        return Ok(());
    }
    Err(c.e(
        ErrorKind::UnsupportedDType,
        format!(
            "'{}' is {}; integer products take u8 and i8",
            v.name, v.dtype
        ),
    ))
}

/// The requantization inputs of QLinearMatMul / QLinearConv: float scales 1, 4 and 6
/// (input 4's may hold `per` values, one per output channel) and the scalar output zero
/// point 7, whose type is the output's (returned).
fn requant_params(c: &Ctx, per: usize) -> Result<DType> {
    for i in [1, 4, 6] {
        let v = c.input(i)?;
        let per_ch = i == 4 && v.shape == [per];
        let float = matches!(v.dtype, DType::F32 | DType::F16 | DType::Bf16);
        if !float || !(v.elements() == 1 && v.shape.len() <= 1 || per_ch) {
            return Err(c.e(
                ErrorKind::UnsupportedDType,
                format!(
                    "scale '{}' {:?} ({}): a float scalar (the weights' may be per output channel)",
                    v.name, v.shape, v.dtype
                ),
            ));
        }
    }
    let z = c.input(7)?;
    q_type(c, &z.name, z.dtype, false)?;
    if z.elements() != 1 {
        return Err(c.mismatch(format!("y_zero_point of shape {:?} (a scalar)", z.shape)));
    }
    Ok(z.dtype)
}

/// An integer product's operands (inputs `ia`, `ib` with zero points `iza`, `izb`): the
/// output shape. A and B are u8/i8 of rank 2 to 4; a zero point is a scalar, or per row of
/// A (`[M]`) / per column of B (`[N]`), of its operand's type.
fn int_product(c: &Ctx, ia: usize, iza: usize, ib: usize, izb: usize) -> Result<Vec<usize>> {
    let (a, b) = (c.input(ia)?, c.input(ib)?);
    for v in [a, b] {
        int8_type(c, v)?;
        if !(2..=4).contains(&v.shape.len()) {
            return Err(c.e(
                ErrorKind::UnsupportedOp,
                format!(
                    "'{}' of rank {} (the device multiplies ranks 2 to 4)",
                    v.name,
                    v.shape.len()
                ),
            ));
        }
    }
    let s = matmul_shape(c, &a.shape, &b.shape)?;
    if s.len() > 4 {
        return Err(c.e(
            ErrorKind::UnsupportedOp,
            format!("output of rank {}", s.len()),
        ));
    }
    let (m, n) = (a.shape[a.shape.len() - 2], b.shape[b.shape.len() - 1]);
    for (iz, of, len) in [(iza, a, m), (izb, b, n)] {
        if let Some(z) = c.opt(iz) {
            let ok = z.dtype == of.dtype
                && (z.elements() == 1 && z.shape.len() <= 1
                    || z.shape.len() == 1 && z.shape[0] == len);
            if !ok {
                return Err(c.mismatch(format!(
                    "zero point '{}' {:?} ({}) for '{}' ({}): a scalar or {len} values of its type",
                    z.name, z.shape, z.dtype, of.name, of.dtype
                )));
            }
        }
    }
    Ok(s)
}

/// An integer convolution's output shape (inputs `ix`, `ixz`, `iw`, `iwz` as in
/// ConvInteger): u8/i8, 1-D or 2-D, group 1; the input zero point a scalar, the weights'
/// a scalar or one per output channel.
fn int_conv_shape(c: &Ctx, ix: usize, ixz: usize, iw: usize, iwz: usize) -> Result<Vec<usize>> {
    let (x, w) = (c.input(ix)?, c.input(iw)?);
    int8_type(c, x)?;
    int8_type(c, w)?;
    let r = x.shape.len();
    if !(3..=4).contains(&r) || w.shape.len() != r || w.shape[1] != x.shape[1] {
        return Err(c.mismatch(format!(
            "input {:?} with weights {:?} (1-D or 2-D, group 1)",
            x.shape, w.shape
        )));
    }
    if c.n.attr_i("group", 1)? != 1 {
        return Err(c.e(ErrorKind::UnsupportedOp, "group other than 1"));
    }
    for (iz, of, len) in [(ixz, x, 1), (iwz, w, w.shape[0])] {
        if let Some(z) = c.opt(iz)
            && (z.dtype != of.dtype || (z.elements() != 1 && z.shape != [len]))
        {
            return Err(c.mismatch(format!(
                "zero point '{}' {:?} ({}) for '{}'",
                z.name, z.shape, z.dtype, of.name
            )));
        }
    }
    let p = window_params(c, &x.shape[2..], w.shape[2..].to_vec(), false)?;
    let mut s = vec![x.shape[0], w.shape[0]];
    s.extend(&p.out);
    Ok(s)
}

/// ConvInteger: i32.
pub(crate) fn infer_conv_integer(c: &Ctx) -> Result<Vec<Out>> {
    Ok(vec![out(DType::I32, int_conv_shape(c, 0, 2, 1, 3)?)])
}

/// QLinearConv: the type of `y_zero_point`; an optional i32 bias per output channel.
pub(crate) fn infer_qlinear_conv(c: &Ctx) -> Result<Vec<Out>> {
    let s = int_conv_shape(c, 0, 2, 3, 5)?;
    let dt = requant_params(c, s[1])?;
    if let Some(b) = c.opt(8)
        && (b.dtype != DType::I32 || b.shape != [s[1]])
    {
        return Err(c.mismatch(format!(
            "bias {:?} ({}): {} i32 values",
            b.shape, b.dtype, s[1]
        )));
    }
    Ok(vec![out(dt, s)])
}

/// MatMulInteger: i32.
pub(crate) fn infer_matmul_integer(c: &Ctx) -> Result<Vec<Out>> {
    Ok(vec![out(DType::I32, int_product(c, 0, 2, 1, 3)?)])
}

/// QLinearMatMul: the type of `y_zero_point`.
pub(crate) fn infer_qlinear_matmul(c: &Ctx) -> Result<Vec<Out>> {
    let s = int_product(c, 0, 2, 3, 5)?;
    let dt = requant_params(c, *s.last().expect("rank ≥ 2"))?;
    Ok(vec![out(dt, s)])
}

impl<'a> Lowerer<'a> {
    /// `acc ← (A − za)·(B − zb)` into the i32 view `acc` (of the product's shape), one
    /// `MatMulInteger` on PE (inputs as in [`int_product`]).
    #[allow(clippy::too_many_arguments)]
    fn int_matmul(
        &mut self,
        n: &Node,
        ia: usize,
        iza: usize,
        ib: usize,
        izb: usize,
        acc: &View,
        scale: Option<View>,
    ) -> Result<()> {
        let s = &acc.shape;
        let r = s.len();
        let (m, nn) = (s[r - 2], s[r - 1]);
        let a = self.input_view(n, ia)?;
        let bv = Self::input_id(n, ib)?;
        let k = a.shape[a.shape.len() - 1];
        if s.iter().product::<usize>() == 0 {
            return Ok(());
        }
        let mut ashape = s[..r - 2].to_vec();
        ashape.extend([m, k]);
        let mut bshape = s[..r - 2].to_vec();
        bshape.extend([k, nn]);
        let zero = |l: &mut Self, iz: usize, rows: usize, cols: usize| -> Result<Option<View>> {
            if n.inputs.get(iz).copied().flatten().is_none() {
                return Ok(None);
            }
            let z = l.input_view(n, iz)?;
            let zs = if z.shape.iter().product::<usize>() == 1 {
                [1, 1]
            } else {
                [rows, cols]
            };
            let mut full = s[..r - 2].to_vec();
            full.extend([rows, cols]);
            Ok(Some(View::dense(z.addr, z.dtype, &zs).broadcast(&full)))
        };
        let za = zero(self, iza, m, 1)?;
        let zb = zero(self, izb, 1, nn)?;
        let mut full = s[..r - 2].to_vec();
        full.extend([1, nn]);
        let scale = scale.map(|v| v.broadcast(&full).ap()).transpose()?;
        // (A packed weight is stored packed only: its plain form is never materialized.)
        let (b, packed_b) = match self.pack_int_weight(bv, self.g.values[bv].dtype, k, nn) {
            Some(ap) => (ap, true),
            None => (self.view(bv)?.broadcast(&bshape).ap()?, false),
        };
        let op = Op::MatMulInteger(op::MatMulInteger {
            a: a.broadcast(&ashape).ap()?,
            b,
            c: acc.ap()?,
            a_zero: za.map(|z| z.ap()).transpose()?,
            b_zero: zb.map(|z| z.ap()).transpose()?,
            packed_b,
            scale,
        });
        self.emit(0, nrt_hal::Engine::Pe, op);
        Ok(())
    }

    /// A constant 2-D `k × n` weight B of the integer product stored once in the product's
    /// packed layout (`qmatmul_layout`: its words and column sums, so no execution re-packs
    /// them), as the instruction's B operand. `None` — B used as stored — when B is not a
    /// constant matrix, when `n` is under half a column tile (the padding would dominate),
    /// or when the packed size overflows the operand's fields.
    fn pack_int_weight(
        &mut self,
        v: ValueId,
        dtype: DType,
        k: usize,
        n: usize,
    ) -> Option<AccessPattern> {
        let val = &self.g.values[v];
        let t = val.konst.as_deref()?;
        if val.shape != [k, n] || n < qmatmul_layout::COLUMN_TILE / 2 {
            return None;
        }
        let np4 = u32::try_from(qmatmul_layout::padded_columns(n)?.checked_mul(4)?).ok()?;
        let rows = u32::try_from(k.div_ceil(4) + 1).ok()?;
        i32::try_from(np4).ok()?;
        let addr = match self.qpacked_addr.get(&v) {
            Some(&a) => a,
            None => {
                let bytes = t.try_to_bytes("an int8 weight").ok()?;
                let packed =
                    qmatmul_layout::pack(k, n, dtype == DType::I8, |p, j| bytes[p * n + j])?;
                let a = nrt_model::vaddr(self.b.try_constant(&packed, 64).ok()?, 0);
                self.qpacked_addr.insert(v, a);
                a
            }
        };
        Some(AccessPattern {
            addr,
            dtype,
            shape: [1, 1, rows, np4],
            stride: [0, 0, np4 as i32, 1],
        })
    }

    /// `acc ← conv(x − x_zero, w − w_zero)` into the i32 view `acc` (`[N, M, OH, OW]` or
    /// 1-D): the input padded with its zero point, im2col by `KH·KW` strided POOL copies
    /// into `[N, C·KH·KW, OH·OW]`, then one `MatMulInteger` with the weights as A (their
    /// zero point per row) broadcast over the batch.
    fn int_conv(
        &mut self,
        c: &Ctx,
        ix: usize,
        ixz: usize,
        iw: usize,
        iwz: usize,
        acc: &View,
    ) -> Result<()> {
        let n = c.n;
        let (xv, wv) = (c.input(ix)?, c.input(iw)?);
        let two = |s: &[usize]| -> Vec<usize> {
            if s.len() == 3 {
                vec![s[0], s[1], 1, s[2]]
            } else {
                s.to_vec()
            }
        };
        let (xs, ws) = (two(&xv.shape), two(&wv.shape));
        let p = window_params(c, &xv.shape[2..], wv.shape[2..].to_vec(), false)?;
        let one_d = xv.shape.len() == 3;
        let g2 = |v: &[usize], d: usize| {
            if one_d {
                if d == 0 { 0 } else { v[0] }
            } else {
                v[d]
            }
        };
        let (pt, pl) = (g2(&p.pad_begin, 0), g2(&p.pad_begin, 1));
        let (pb, pr) = (g2(&p.pad_end, 0), g2(&p.pad_end, 1));
        let (sh, sw) = (
            if one_d { 1 } else { p.strides[0] },
            *p.strides.last().expect("1-D+"),
        );
        let (dh, dw) = (
            if one_d { 1 } else { p.dilations[0] },
            *p.dilations.last().expect("1-D+"),
        );
        let (nb, ch, hh, ww) = (xs[0], xs[1], xs[2], xs[3]);
        let (m, kh, kw) = (ws[0], ws[2], ws[3]);
        let (oh, ow) = (
            if one_d { 1 } else { p.out[0] },
            *p.out.last().expect("1-D+"),
        );
        if nb * m * oh * ow == 0 {
            return Ok(());
        }
        let (hp, wp) = (hh + pt + pb, ww + pl + pr);
        let x = self.input_view(n, ix)?;
        let dt = x.dtype;
        // The input padded with its zero point (constant, else the pad must be empty).
        let xp = if pt + pb + pl + pr == 0 {
            View::dense(x.addr, dt, &[nb, ch, hp, wp])
        } else {
            let zp = match c.opt(ixz) {
                None => 0.0,
                Some(z) => match &z.konst {
                    Some(t) => t.get_f64(0),
                    None => {
                        return Err(c.e(
                            ErrorKind::UnsupportedOp,
                            format!(
                                "input zero point '{}' computed at run time with padding",
                                z.name
                            ),
                        ));
                    }
                },
            };
            let xp = View::dense(self.temp(nb * ch * hp * wp), dt, &[nb, ch, hp, wp]);
            self.fill(nrt_hal::Engine::Pool, &xp, zp)?;
            let inner = View {
                addr: xp.elems((pt * wp + pl) as i64),
                dtype: dt,
                shape: vec![nb, ch, hh, ww],
                strides: xp.strides.clone(),
            };
            self.copy(
                nrt_hal::Engine::Pool,
                &View::dense(x.addr, dt, &[nb, ch, hh, ww]),
                &inner,
            )?;
            xp
        };
        // im2col: col[n, c, i, j, oy, ox] = xp[n, c, oy·sh + i·dh, ox·sw + j·dw].
        let ckk = ch * kh * kw;
        let col = View::dense(self.temp(nb * ckk * oh * ow), dt, &[nb, ckk, oh * ow]);
        for i in 0..kh {
            for j in 0..kw {
                let src = View {
                    addr: xp.elems((i * dh * wp + j * dw) as i64),
                    dtype: dt,
                    shape: vec![nb, ch, oh, ow],
                    strides: vec![
                        (ch * hp * wp) as i64,
                        (hp * wp) as i64,
                        (sh * wp) as i64,
                        sw as i64,
                    ],
                };
                let dst = View {
                    addr: col.elems(((i * kw + j) * oh * ow) as i64),
                    dtype: dt,
                    shape: vec![nb, ch, oh, ow],
                    strides: vec![
                        (ckk * oh * ow) as i64,
                        (kh * kw * oh * ow) as i64,
                        ow as i64,
                        1,
                    ],
                };
                self.copy(nrt_hal::Engine::Pool, &src, &dst)?;
            }
        }
        let w = self.input_view(n, iw)?;
        let zero = |l: &mut Self,
                    iz: usize,
                    shape: [usize; 3],
                    strides: [i64; 3]|
         -> Result<Option<AccessPattern>> {
            if n.inputs.get(iz).copied().flatten().is_none() {
                return Ok(None);
            }
            let z = l.input_view(n, iz)?;
            let per = z.shape.iter().product::<usize>() != 1;
            let st = if per { strides } else { [0, 0, 0] };
            Ok(Some(mk_ap(z.addr, z.dtype, &shape, &st)?))
        };
        let a_zero = zero(self, iwz, [nb, m, 1], [0, 1, 0])?;
        let b_zero = zero(self, ixz, [nb, 1, oh * ow], [0, 0, 0])?;
        let op = Op::MatMulInteger(op::MatMulInteger {
            a: mk_ap(w.addr, w.dtype, &[nb, m, ckk], &[0, ckk as i64, 1])?,
            b: dense_ap(col.addr, dt, &[nb, ckk, oh * ow])?,
            c: dense_ap(acc.addr, DType::I32, &[nb, m, oh * ow])?,
            a_zero,
            b_zero,
            packed_b: false,
            scale: None,
        });
        self.emit(0, nrt_hal::Engine::Pe, op);
        Ok(())
    }

    /// ConvInteger: [`Self::int_conv`] into the output.
    pub(crate) fn lower_conv_integer(&mut self, at: At<'a>) -> Result<()> {
        let y = self.alloc(at.o0);
        self.int_conv(&at.c, 0, 2, 1, 3, &y)
    }

    /// QLinearConv: [`Self::int_conv`], the bias added in i32, then requantized as
    /// QLinearMatMul (`round(acc · x_scale·w_scale/y_scale) + y_zero_point`, saturated).
    pub(crate) fn lower_qlinear_conv(&mut self, at: At<'a>) -> Result<()> {
        let At {
            n, c, o0, oshape, ..
        } = at;
        let y = self.alloc(o0);
        let total: usize = oshape.iter().product();
        if total == 0 {
            return Ok(());
        }
        let acc = View::dense(self.temp(total * 4), DType::I32, oshape);
        self.int_conv(&c, 0, 2, 3, 5, &acc)?;
        let mch = oshape[1];
        let mut cshape = vec![1; oshape.len()];
        cshape[1] = mch;
        if n.inputs.get(8).copied().flatten().is_some() {
            let b = self.input_view(n, 8)?;
            let bb = View::dense(b.addr, DType::I32, &cshape).broadcast(oshape);
            self.binary(&acc, &bb, &acc, BinaryOp::Add)?;
        }
        self.requantize(n, &acc, &y, 1)
    }

    /// `y ← saturate(round(acc · s1·s4/s6) + z7)` for QLinearMatMul / QLinearConv (inputs
    /// as in [`requant_params`]): input 4's scale per output channel along `axis` of
    /// `acc` when it holds more than one value; f16 / bf16 scales widened exactly.
    fn requantize(&mut self, n: &Node, acc: &View, y: &View, axis: usize) -> Result<()> {
        let shape = acc.shape.clone();
        let mut sc = Vec::new();
        for i in [1, 4, 6] {
            let v = self.input_view(n, i)?;
            sc.push(self.converted(v, DType::F32)?);
        }
        let ch = shape[axis];
        let per = sc[1].shape.iter().product::<usize>() != 1;
        let mult = self.f32_temp(&[if per { ch } else { 1 }]);
        let one = |v: &View| View::dense(v.addr, DType::F32, &[1]).broadcast(&mult.shape);
        let s4 = if per {
            View::dense(sc[1].addr, DType::F32, &[ch])
        } else {
            one(&sc[1])
        };
        self.binary(&one(&sc[0]), &s4, &mult, BinaryOp::Mul)?;
        self.binary(&mult, &one(&sc[2]), &mult, BinaryOp::Div)?;
        let t = self.f32_temp(&shape);
        self.copy(nrt_hal::Engine::Dve, acc, &t)?;
        let mut ms = vec![1; shape.len()];
        if per {
            ms[axis] = ch;
        }
        let mb = View::dense(mult.addr, DType::F32, &ms).broadcast(&shape);
        self.binary(&t, &mb, &t, BinaryOp::Mul)?;
        let z = self.input_view(n, 7)?;
        let zf = self.converted(View::dense(z.addr, z.dtype, &[1]), DType::F32)?;
        self.q_store(&t, Some(&zf.broadcast(&shape)), y)
    }

    /// MatMulInteger: one instruction on PE. When the i32 result is only converted to f32
    /// and multiplied by a per-tensor or per-column scale (`Cast(to=FLOAT)` then `Mul`, as
    /// ONNX Runtime's `quantize_dynamic` writes a layer), both nodes are the instruction's
    /// f32 output (its `scale`, ONNX Runtime's `MatMulIntegerToFloat`).
    pub(crate) fn lower_matmul_integer(&mut self, at: At<'a>) -> Result<()> {
        if let Some((nodes, s, out)) = self.dequantizing_consumers(at.o0)
            && self.hoist_producer(s)?
        {
            let sv = self.sview(s)?;
            let sv = if sv.strides.iter().any(|&x| x < 0) {
                self.view(s)?
            } else {
                sv
            };
            for j in nodes {
                self.skip[j] = true;
            }
            let y = self.alloc(out);
            self.int_matmul(at.n, 0, 2, 1, 3, &y, Some(sv))?;
            return self.finish_value(out);
        }
        let y = self.alloc(at.o0);
        self.int_matmul(at.n, 0, 2, 1, 3, &y, None)
    }

    /// The `Cast(to=FLOAT)` and `Mul` by a scale that follow the integer product `v`, if
    /// they are its only readers and the scale is f32 with one value per tensor or per
    /// column: `(nodes, scale, result)` (the caller makes the scale available,
    /// [`Lowerer::hoist_producer`]).
    fn dequantizing_consumers(&self, v: ValueId) -> Option<([usize; 2], ValueId, ValueId)> {
        let g = self.g;
        let shape = &g.values[v].shape;
        let cast = self.sole_consumer(v)?;
        let nc = &g.nodes[cast];
        let cv = nc.outputs.first().copied().flatten()?;
        if nc.op != "Cast"
            || i32::try_from(nc.attr_i("to", 0).ok()?)
                .ok()
                .and_then(dtype_from_onnx)
                != Some(DType::F32)
            || g.values[cv].dtype != DType::F32
            || self.skip[cast]
        {
            return None;
        }
        let mul = self.sole_consumer(cv)?;
        let nm = &g.nodes[mul];
        let ins: Vec<ValueId> = nm.inputs.iter().flatten().copied().collect();
        let other = match (nm.op.as_str(), ins.as_slice()) {
            ("Mul", &[p, q]) if p == cv && q != cv => q,
            ("Mul", &[p, q]) if q == cv && p != cv => p,
            _ => return None,
        };
        let out = nm.outputs.first().copied().flatten()?;
        let os = &g.values[other].shape;
        let per_column = os.iter().rev().skip(1).all(|&d| d == 1)
            && os
                .last()
                .is_none_or(|&d| d == 1 || Some(&d) == shape.last())
            && os.len() <= shape.len();
        (g.values[out].shape == *shape
            && g.values[out].dtype == DType::F32
            && g.values[other].dtype == DType::F32
            && per_column
            && !self.skip[mul])
            .then_some(([cast, mul], other, out))
    }

    /// QLinearMatMul: the integer product, then `round(acc · a_scale·b_scale/y_scale)` plus
    /// the output zero point, saturated (as ONNX Runtime's requantization).
    pub(crate) fn lower_qlinear_matmul(&mut self, at: At<'a>) -> Result<()> {
        let At { n, o0, oshape, .. } = at;
        let y = self.alloc(o0);
        let total: usize = oshape.iter().product();
        if total == 0 {
            return Ok(());
        }
        let acc = View::dense(self.temp(total * 4), DType::I32, oshape);
        self.int_matmul(n, 0, 2, 3, 5, &acc, None)?;
        self.requantize(n, &acc, &y, oshape.len() - 1)
    }

    /// A dense f32 temporary of `shape`.
    fn f32_temp(&mut self, shape: &[usize]) -> View {
        let n: usize = shape.iter().product();
        View::dense(self.temp(n.max(1) * 4), DType::F32, shape)
    }

    /// `t ← round(t)` (ties to even) in place on ACT.
    fn round(&mut self, t: &View) -> Result<()> {
        self.activation(t, t, None, (ActFunc::Round, 0.0, 0.0), 1.0)
    }

    /// Scale or zero point input `i` of `n` seen with `x`'s shape (per tensor or along
    /// `axis`), converted to `dt`.
    fn q_param(
        &mut self,
        n: &Node,
        i: usize,
        xshape: &[usize],
        axis: Option<usize>,
        dt: DType,
    ) -> Result<View> {
        let v = self.input_view(n, i)?;
        let block = n.attr_i("block_size", 0)?;
        if let (Some(a), Ok(b @ 1..)) = (axis, usize::try_from(block)) {
            // Blocked: one POOL Gather repeats each block's parameter `block` times along
            // the axis (the last block may be shorter), giving the input's shape.
            let d = xshape[a];
            let outer: usize = xshape[..a].iter().product();
            let inner: usize = xshape[a + 1..].iter().product();
            let idx: Vec<i64> = (0..d).map(|j| (j / b) as i64).collect();
            let ia = self.add_const(&crate::tensor::HostTensor::i64(vec![d], idx))?;
            let full = View::dense(
                self.temp(xshape.iter().product::<usize>() * v.dtype.size()),
                v.dtype,
                xshape,
            );
            let op = nrt_isa::Op::Gather(op::Gather {
                data: dense_ap(v.addr, v.dtype, &[outer, d.div_ceil(b), inner])?,
                indices: dense_ap(ia, DType::I64, &[d])?,
                output: dense_ap(full.addr, v.dtype, &[outer, d, inner])?,
            });
            self.emit(0, nrt_hal::Engine::Pool, op);
            return self.converted(full, dt);
        }
        let v = self.converted(v, dt)?;
        let mut shape = vec![1; xshape.len()];
        if let Some(a) = axis {
            shape[a] = xshape[a];
        }
        Ok(View::dense(v.addr, v.dtype, &shape).broadcast(xshape))
    }

    /// `y ← saturate(round(t) + zp)` as `y`'s type, `t` an f32 temporary (overwritten).
    fn q_store(&mut self, t: &View, zp: Option<&View>, y: &View) -> Result<()> {
        self.round(t)?;
        if let Some(z) = zp {
            self.binary(t, z, t, BinaryOp::Add)?;
        }
        // The converting copy saturates to y's type (the kernels' f32 → integer conversion:
        // truncation of the exact integers here, saturation, NaN → 0).
        self.copy(nrt_hal::Engine::Dve, t, y)
    }

    /// Round: ties to even, one ACT instruction.
    pub(crate) fn lower_round(&mut self, at: At<'a>) -> Result<()> {
        let At { n, o0, oshape, .. } = at;
        let (x, y) = self.unary_io(n, o0)?;
        if oshape.iter().product::<usize>() == 0 {
            return Ok(());
        }
        self.activation(&x, &y, None, (ActFunc::Round, 0.0, 0.0), 1.0)
    }

    /// Quantize / Dequantize operands: the axis of the scale (`None` per tensor), the input
    /// and the allocated output, and the scale seen with the input's shape; `None` for an
    /// empty tensor.
    #[allow(clippy::type_complexity)]
    fn q_operands(&mut self, at: &At<'a>) -> Result<Option<(Option<usize>, View, View, View)>> {
        let c = &at.c;
        let axis = q_axis(c, c.input(0)?, c.input(1)?, c.opt(2))?;
        let (x, y) = self.unary_io(at.n, at.o0)?;
        if at.oshape.iter().product::<usize>() == 0 {
            return Ok(None);
        }
        let s = self.q_param(at.n, 1, at.oshape, axis, DType::F32)?;
        Ok(Some((axis, x, y, s)))
    }

    /// QuantizeLinear: `saturate(round(x / scale) + zero_point)`.
    pub(crate) fn lower_quantize(&mut self, at: At<'a>) -> Result<()> {
        let (n, oshape) = (at.n, at.oshape);
        let Some((axis, x, y, s)) = self.q_operands(&at)? else {
            return Ok(());
        };
        let z = match at.c.opt(2) {
            Some(_) => Some(self.q_param(n, 2, oshape, axis, DType::F32)?),
            None => None,
        };
        let t = self.f32_temp(oshape);
        self.binary(&x, &s, &t, BinaryOp::Div)?;
        self.q_store(&t, z.as_ref(), &y)
    }

    /// DequantizeLinear: `(x − zero_point) · scale`, the difference in i32.
    pub(crate) fn lower_dequantize(&mut self, at: At<'a>) -> Result<()> {
        let (n, oshape) = (at.n, at.oshape);
        let Some((axis, x, y, s)) = self.q_operands(&at)? else {
            return Ok(());
        };
        if at.c.opt(2).is_some() {
            let z = self.q_param(n, 2, oshape, axis, DType::I32)?;
            let xi = self.converted(x, DType::I32)?;
            let d = View::dense(
                self.temp(oshape.iter().product::<usize>() * 4),
                DType::I32,
                oshape,
            );
            self.binary(&xi, &z, &d, BinaryOp::Sub)?;
            self.copy(nrt_hal::Engine::Dve, &d, &y)?;
        } else {
            self.copy(nrt_hal::Engine::Dve, &x, &y)?;
        }
        self.binary(&y, &s, &y, BinaryOp::Mul)
    }

    /// DynamicQuantizeLinear (u8): one POOL `DynamicQuantize` (NCM 1.8) — the range of `x`
    /// widened to include 0 gives `scale = (max − min) / 255` (1 for an empty range, as ONNX
    /// Runtime) and `zero_point = round(clamp(−min / scale, 0, 255))`, then
    /// `y = saturate(round(x / scale) + zero_point)` (the ONNX reference's order). A strided
    /// (or non-f32) input is first copied dense in f32; outputs nobody reads go to
    /// temporaries.
    pub(crate) fn lower_dynamic_quantize(&mut self, at: At<'a>) -> Result<()> {
        let At { n, o0, oshape, .. } = at;
        let total: usize = oshape.iter().product();
        let (x, y) = self.unary_io(n, o0)?;
        let scale = match n.outputs.get(1).copied().flatten() {
            Some(v) => self.alloc(v),
            None => self.f32_temp(&[]),
        };
        let zero = match n.outputs.get(2).copied().flatten() {
            Some(v) => self.alloc(v),
            None => View::dense(self.temp(1), DType::U8, &[]),
        };
        // The instruction reads f32 (an f64 input, stored as such, is converted first).
        let x = self.converted(x, DType::F32)?;
        let x = if x.is_dense() {
            x
        } else {
            let t = self.f32_temp(oshape);
            self.copy(nrt_hal::Engine::Dve, &x, &t)?;
            t
        };
        let yd = if y.is_dense() {
            y.clone()
        } else {
            View::dense(self.temp(total.max(1)), DType::U8, oshape)
        };
        let op = Op::DynamicQuantize(op::DynamicQuantize {
            input: dense_ap(x.addr, DType::F32, &[total])?,
            output: dense_ap(yd.addr, DType::U8, &[total])?,
            scale: dense_ap(scale.addr, DType::F32, &[1])?,
            zero_point: dense_ap(zero.addr, DType::U8, &[1])?,
        });
        self.emit(0, nrt_hal::Engine::Pool, op);
        if !y.is_dense() {
            self.copy(nrt_hal::Engine::Dve, &yd, &y)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::eval::testing::{a_i, ctx, one_node, out_types, var};
    use nrt_hal::DType;

    #[test]
    fn quantize_output_type_comes_from_the_zero_point_or_output_dtype() {
        let (x, s) = (|| var(DType::F32, &[2, 3]), || var(DType::F32, &[]));
        let t = out_types(
            "QuantizeLinear",
            13,
            vec![x(), s(), var(DType::I8, &[])],
            vec![],
            1,
        );
        assert_eq!(t.unwrap(), vec![(DType::I8, vec![2, 3])]);
        let t = out_types(
            "QuantizeLinear",
            21,
            vec![x(), s()],
            vec![a_i("output_dtype", 5)],
            1,
        );
        assert_eq!(t.unwrap(), vec![(DType::I16, vec![2, 3])]);
        let t = out_types("QuantizeLinear", 13, vec![x(), s()], vec![], 1);
        assert_eq!(t.unwrap(), vec![(DType::U8, vec![2, 3])]);
    }

    #[test]
    fn scale_geometry_per_tensor_axis_and_block() {
        let axis = |x: &[usize], s: &[usize], attrs| {
            let g = one_node(
                "DequantizeLinear",
                21,
                vec![var(DType::I8, x), var(DType::F32, s)],
                attrs,
                1,
            );
            let c = ctx(&g);
            super::q_axis(&c, &g.values[0], &g.values[1], None).map_err(|e| e.message)
        };
        assert_eq!(axis(&[2, 3], &[1], vec![]), Ok(None));
        assert_eq!(axis(&[2, 3], &[2], vec![a_i("axis", 0)]), Ok(Some(0)));
        assert_eq!(
            axis(&[2, 4], &[2, 2], vec![a_i("block_size", 2)]),
            Ok(Some(1))
        );
        let e = axis(&[2, 3], &[2], vec![]).unwrap_err();
        assert!(e.contains("2 scales for axis 1 of size 3"), "{e}");
    }

    #[test]
    fn integer_products_are_i32_of_u8_and_i8() {
        let ins = vec![var(DType::U8, &[2, 3]), var(DType::I8, &[3, 4])];
        let t = out_types("MatMulInteger", 10, ins, vec![], 1).unwrap();
        assert_eq!(t, vec![(DType::I32, vec![2, 4])]);
        let ins = vec![var(DType::F32, &[2, 3]), var(DType::I8, &[3, 4])];
        let e = out_types("MatMulInteger", 10, ins, vec![], 1).unwrap_err();
        assert!(
            e.message
                .contains("'x0' is f32; integer products take u8 and i8"),
            "{e}"
        );
    }
}
