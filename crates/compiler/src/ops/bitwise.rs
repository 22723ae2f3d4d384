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

#[cfg(test)]
mod tests {
    use crate::error::ErrorKind;
    use crate::eval::testing::{a_s, out_types, var};
    use nrt_hal::DType;

    #[test]
    fn bitwise_broadcasts_integers_of_one_type() {
        let ins = vec![var(DType::U8, &[2, 1]), var(DType::U8, &[3])];
        let t = out_types("BitwiseAnd", 18, ins, vec![], 1).unwrap();
        assert_eq!(t, vec![(DType::U8, vec![2, 3])]);
        let not = out_types("BitwiseNot", 18, vec![var(DType::I64, &[4])], vec![], 1);
        assert_eq!(not.unwrap(), vec![(DType::I64, vec![4])]);
    }

    #[test]
    fn floats_and_bad_directions_are_refused() {
        let ins = vec![var(DType::F32, &[2]), var(DType::F32, &[2])];
        let e = out_types("BitwiseOr", 18, ins, vec![], 1).unwrap_err();
        assert_eq!(e.kind, ErrorKind::UnsupportedDType, "{e}");
        assert!(e.message.contains("takes integers"), "{e}");
        let ins = vec![var(DType::U32, &[2]), var(DType::U32, &[2])];
        let up = vec![a_s("direction", "UP")];
        let e = out_types("BitShift", 11, ins, up, 1).unwrap_err();
        assert_eq!(e.kind, ErrorKind::BadAttribute, "{e}");
        assert!(e.message.contains("direction 'UP'"), "{e}");
    }
}
