//! The byte reader and writer every instruction's encoding uses, and the checks the
//! decoders share.

use crate::ap::{AP_SIZE, AccessPattern};
use crate::error::{DecodeError, Reason};
use crate::op::Window;
use nrt_hal::DType;

pub(crate) struct W<'a>(pub(crate) &'a mut Vec<u8>);

impl W<'_> {
    pub(crate) fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub(crate) fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn f32(&mut self, v: f32) {
        self.u32(v.to_bits());
    }
    pub(crate) fn ap(&mut self, ap: &AccessPattern) {
        ap.encode(self.0);
    }
    pub(crate) fn opt_ap(&mut self, ap: &Option<AccessPattern>) {
        match ap {
            Some(ap) => ap.encode(self.0),
            None => self.0.extend_from_slice(&[0u8; AP_SIZE]),
        }
    }
    pub(crate) fn zeros(&mut self, n: usize) {
        self.0.resize(self.0.len() + n, 0);
    }
    pub(crate) fn window(&mut self, w: &Window) {
        for v in w
            .kernel
            .iter()
            .chain(&w.stride)
            .chain(&w.pad)
            .chain(&w.dilation)
        {
            self.u32(*v);
        }
    }
}

pub(crate) struct R<'a> {
    pub(crate) b: &'a [u8],
    pub(crate) pos: usize,
}

impl<'a> R<'a> {
    pub(crate) fn u8(&mut self) -> u8 {
        let v = self.b[self.pos];
        self.pos += 1;
        v
    }
    pub(crate) fn u16(&mut self) -> u16 {
        let v = u16::from_le_bytes([self.b[self.pos], self.b[self.pos + 1]]);
        self.pos += 2;
        v
    }
    pub(crate) fn u32(&mut self) -> u32 {
        let v = u32::from_le_bytes(self.b[self.pos..self.pos + 4].try_into().expect("4 bytes"));
        self.pos += 4;
        v
    }
    pub(crate) fn u64(&mut self) -> u64 {
        let v = u64::from_le_bytes(self.b[self.pos..self.pos + 8].try_into().expect("8 bytes"));
        self.pos += 8;
        v
    }
    pub(crate) fn f32(&mut self, field: &'static str) -> Result<f32, DecodeError> {
        let at = self.pos;
        let v = f32::from_bits(self.u32());
        if v.is_nan() {
            return Err(DecodeError::field(field, Reason::OutOfRange(v.to_bits() as u64)).at(at));
        }
        Ok(v)
    }
    pub(crate) fn ap(&mut self, field: &'static str) -> Result<AccessPattern, DecodeError> {
        let at = self.pos;
        let ap = AccessPattern::decode(&self.b[at..at + AP_SIZE], field).map_err(|e| {
            let off = e.field_offset;
            e.at(at + off)
        })?;
        self.pos += AP_SIZE;
        Ok(ap)
    }
    /// An optional operand: present iff `present`; absent ones must be all zero.
    pub(crate) fn opt_ap(
        &mut self,
        field: &'static str,
        present: bool,
    ) -> Result<Option<AccessPattern>, DecodeError> {
        if present {
            return self.ap(field).map(Some);
        }
        self.zeros(AP_SIZE, field)?;
        Ok(None)
    }
    pub(crate) fn zeros(&mut self, n: usize, field: &'static str) -> Result<(), DecodeError> {
        let at = self.pos;
        if self.b[at..at + n].iter().any(|&x| x != 0) {
            return Err(DecodeError::field(field, Reason::ReservedNonZero).at(at));
        }
        self.pos += n;
        Ok(())
    }
    pub(crate) fn flags(&mut self, field: &'static str, allowed: u32) -> Result<u32, DecodeError> {
        let at = self.pos;
        let v = self.u32();
        if v & !allowed != 0 {
            return Err(DecodeError::field(field, Reason::UnknownFlags(v & !allowed)).at(at));
        }
        Ok(v)
    }
    pub(crate) fn bool32(&mut self, field: &'static str) -> Result<bool, DecodeError> {
        Ok(self.flags(field, 1)? != 0)
    }
    pub(crate) fn enum_u8<T>(
        &mut self,
        field: &'static str,
        f: fn(u8) -> Option<T>,
    ) -> Result<T, DecodeError> {
        let at = self.pos;
        let v = self.u8();
        f(v).ok_or(DecodeError::field(field, Reason::BadEnum(v as u32)).at(at))
    }
    /// A dimension index of an access pattern (0..4).
    pub(crate) fn axis(&mut self) -> Result<u8, DecodeError> {
        let at = self.pos;
        let a = self.u8();
        if a > 3 {
            return Err(DecodeError::field("axis", Reason::OutOfRange(a as u64)).at(at));
        }
        Ok(a)
    }
    pub(crate) fn window(&mut self, pooling: bool) -> Result<Window, DecodeError> {
        let at = self.pos;
        let mut v = [0u32; 10];
        for x in &mut v {
            *x = self.u32();
        }
        let w = Window {
            kernel: [v[0], v[1]],
            stride: [v[2], v[3]],
            pad: [v[4], v[5], v[6], v[7]],
            dilation: [v[8], v[9]],
        };
        let check = |ok: bool, field: &'static str, value: u32, off: usize| {
            if ok {
                Ok(())
            } else {
                Err(DecodeError::field(field, Reason::OutOfRange(value as u64)).at(at + off))
            }
        };
        for i in 0..2 {
            if pooling {
                check(w.kernel[i] >= 1, "window.kernel", w.kernel[i], 4 * i)?;
            } else {
                check(w.kernel[i] == 0, "window.kernel", w.kernel[i], 4 * i)?;
            }
            check(w.stride[i] >= 1, "window.stride", w.stride[i], 8 + 4 * i)?;
            check(
                w.dilation[i] >= 1,
                "window.dilation",
                w.dilation[i],
                32 + 4 * i,
            )?;
        }
        for i in 0..4 {
            check(w.pad[i] < 1 << 20, "window.pad", w.pad[i], 16 + 4 * i)?;
        }
        Ok(w)
    }
}

pub(crate) fn require_dtype(
    ap: &AccessPattern,
    field: &'static str,
    ok: &[DType],
) -> Result<(), DecodeError> {
    if ok.contains(&ap.dtype) {
        Ok(())
    } else {
        Err(DecodeError::field(field, Reason::UnsupportedDType(ap.dtype)).at(8))
    }
}

pub(crate) fn same_shape(
    field: &'static str,
    want: &[u32; 4],
    got: &AccessPattern,
) -> Result<(), DecodeError> {
    for (d, (&w, &g)) in want.iter().zip(&got.shape).enumerate() {
        if w != g {
            return Err(DecodeError::field(
                field,
                Reason::ShapeMismatch {
                    dim: d,
                    expected: w,
                    found: g,
                },
            )
            .at(16 + 4 * d));
        }
    }
    Ok(())
}

/// The `shape` operand of an instruction with a data-dependent output: `[1, 1, 1, rank]`
/// of i64, at byte `off` of the instruction.
pub(crate) fn shape_operand(ap: &AccessPattern, rank: u32, off: usize) -> Result<(), DecodeError> {
    require_dtype(ap, "shape.dtype", &[DType::I64]).map_err(|e| e.shifted(off))?;
    same_shape("shape.shape", &[1, 1, 1, rank], ap).map_err(|e| e.shifted(off))
}

pub(crate) fn dim_eq(
    field: &'static str,
    dim: usize,
    expected: u32,
    found: u32,
) -> Result<(), DecodeError> {
    if expected == found {
        Ok(())
    } else {
        Err(DecodeError::field(
            field,
            Reason::ShapeMismatch {
                dim,
                expected,
                found,
            },
        )
        .at(16 + 4 * dim))
    }
}

pub(crate) const F32: &[DType] = &[DType::F32];

pub(crate) const NUMERIC: &[DType] = &[DType::F32, DType::I32, DType::I64];

pub(crate) const INTEGER: &[DType] = &[DType::I32, DType::I64];

/// What [`Op::TopK`] orders: f32 and every integer type.
pub(crate) const TOP_K_TYPES: &[DType] = &[
    DType::F32,
    DType::I64,
    DType::I32,
    DType::I16,
    DType::I8,
    DType::U64,
    DType::U32,
    DType::U16,
    DType::U8,
];
