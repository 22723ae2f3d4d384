//! Bitwise operators on DVE (`BinaryOp::BitAnd` … `ShiftRight`, NCM 1.2): BitwiseAnd / Or /
//! Xor / Not and BitShift. The engine computes them on i32 and i64 as bits; narrower and
//! unsigned integers go through i64 and back (integer conversions wrap, so every bit of
//! u64 survives the round trip, and a zero-extended unsigned value shifts right logically).

use super::Registry;
use crate::error::{ErrorKind, Result};
use crate::lower::view::View;
use crate::lower::{At, Lowerer};
use crate::params::{Ctx, Out, broadcast_all, elementwise_dtype_check, out};
use crate::tensor::HostTensor;
use nrt_hal::{DType, Engine};
use nrt_isa::BinaryOp;

pub(super) fn register(r: &mut Registry) {
    for name in ["BitwiseAnd", "BitwiseOr", "BitwiseXor"] {
        r.op(name, 18, infer_bitwise)
            .note("integers, as their bits")
            .device(lower!(lower_bitwise));
    }
    r.op("BitwiseNot", 18, infer_bitwise)
        .note("integers: xor with all ones")
        .device(lower!(lower_bitwise));
    r.op("BitShift", 11, infer_bitwise)
        .note("unsigned integers; an amount of at least the width gives 0")
        .device(lower!(lower_bitwise));
}

/// The integer types these operators take.
fn is_integer(d: DType) -> bool {
    matches!(
        d,
        DType::I8
            | DType::U8
            | DType::I16
            | DType::U16
            | DType::I32
            | DType::U32
            | DType::I64
            | DType::U64
    )
}

/// Integer inputs of one type, broadcast (BitwiseNot: one input).
pub(crate) fn infer_bitwise(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
    let unary = n.op == "BitwiseNot";
    let vals = if unary {
        vec![c.input(0)?]
    } else {
        vec![c.input(0)?, c.input(1)?]
    };
    let d = elementwise_dtype_check(c, &vals)?;
    if !is_integer(d) {
        return Err(c.e(
            ErrorKind::UnsupportedDType,
            format!("input '{}' is {d}; {} takes integers", vals[0].name, n.op),
        ));
    }
    if n.op == "BitShift" {
        let dir = n.attr_s("direction", "")?;
        if dir != "LEFT" && dir != "RIGHT" {
            return Err(c.bad_attr(format!("direction '{dir}' (LEFT or RIGHT)")));
        }
    }
    Ok(vec![out(d, broadcast_all(c, &vals)?)])
}

impl<'a> Lowerer<'a> {
    /// One `Binary` on DVE in i32 / i64 (other integer types converted there and back).
    pub(crate) fn lower_bitwise(&mut self, at: At<'a>) -> Result<()> {
        let At {
            n, o0, oshape, odt, ..
        } = at;
        let op = match n.op.as_str() {
            "BitwiseAnd" => BinaryOp::BitAnd,
            "BitwiseOr" => BinaryOp::BitOr,
            "BitwiseXor" | "BitwiseNot" => BinaryOp::BitXor,
            _ if n.attr_s("direction", "")? == "LEFT" => BinaryOp::ShiftLeft,
            _ => BinaryOp::ShiftRight,
        };
        let cd = match odt {
            DType::I32 | DType::I64 => odt,
            _ => DType::I64,
        };
        let y = self.alloc(o0);
        let total: usize = oshape.iter().product();
        if total == 0 {
            return Ok(());
        }
        let a = self.input_view(n, 0)?;
        let a = self.converted(a, cd)?.broadcast(oshape);
        let b = if n.op == "BitwiseNot" {
            // x ^ all-ones: −1 in the compute type, whose low bits are all ones in every
            // narrower type.
            let m = self.add_const(&HostTensor::ints(cd, vec![1], vec![-1]))?;
            View::dense(m, cd, &[1]).broadcast(oshape)
        } else {
            let b = self.input_view(n, 1)?;
            self.converted(b, cd)?.broadcast(oshape)
        };
        if cd == odt {
            return self.binary(&a, &b, &y, op);
        }
        let acc = View::dense(self.temp(total * cd.size()), cd, oshape);
        self.binary(&a, &b, &acc, op)?;
        self.copy(Engine::Dve, &acc, &y)
    }
}
