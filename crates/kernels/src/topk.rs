//! `TopK` along dimension 3: per row, the indices of the `K` largest (or smallest) elements
//! are selected (`select_nth_unstable_by`, O(N)) and the `K` sorted (O(K log K)), in an
//! index scratch from the [`Workspace`]; equal elements keep the lower index first and NaN
//! ranks above every number (as ONNX Runtime orders them).

use crate::Execute;
use crate::strided::View;
use crate::{DeviceMemory, KernelError, Workspace};
use core::cmp::Ordering;
use nrt_hal::DType;
use nrt_isa::AccessPattern;
use nrt_isa::op;

/// Executes `Op::TopK`.
///
/// # Safety
/// Operands inside `mem`, aligned to their element size, shapes and types as the decoder
/// checks.
pub unsafe fn top_k(
    input: &AccessPattern,
    values: &AccessPattern,
    indices: &AccessPattern,
    largest: bool,
    mem: DeviceMemory,
    ws: &mut Workspace,
) -> Result<(), KernelError> {
    // SAFETY: per the caller's contract.
    unsafe {
        match input.dtype {
            DType::F32 => rows::<f32>(input, values, indices, largest, mem, ws)?,
            DType::I32 => rows::<i32>(input, values, indices, largest, mem, ws)?,
            DType::I64 => rows::<i64>(input, values, indices, largest, mem, ws)?,
            DType::I16 => rows::<i16>(input, values, indices, largest, mem, ws)?,
            DType::I8 => rows::<i8>(input, values, indices, largest, mem, ws)?,
            DType::U64 => rows::<u64>(input, values, indices, largest, mem, ws)?,
            DType::U32 => rows::<u32>(input, values, indices, largest, mem, ws)?,
            DType::U16 => rows::<u16>(input, values, indices, largest, mem, ws)?,
            DType::U8 => rows::<u8>(input, values, indices, largest, mem, ws)?,
            _ => return Err(KernelError::Unsupported("TopK element type")),
        }
    }
    Ok(())
}

/// Ascending order with NaN above everything (a NaN is its own self's equal).
fn ascending<T: PartialOrd>(a: &T, b: &T) -> Ordering {
    a.partial_cmp(b).unwrap_or_else(|| {
        #[allow(clippy::eq_op)]
        let (a_nan, b_nan) = (a != a, b != b);
        match (a_nan, b_nan) {
            (true, false) => Ordering::Greater,
            (false, true) => Ordering::Less,
            _ => Ordering::Equal,
        }
    })
}

/// # Safety
/// As [`top_k`], `T` the input's element type.
unsafe fn rows<T: Copy + PartialOrd>(
    input: &AccessPattern,
    values: &AccessPattern,
    indices: &AccessPattern,
    largest: bool,
    mem: DeviceMemory,
    ws: &mut Workspace,
) -> Result<(), KernelError> {
    let vi = View::<T>::new(input, mem);
    let vv = View::<T>::new(values, mem);
    let vx = View::<i64>::new(indices, mem);
    let n = vi.shape[3];
    let k = vv.shape[3];
    if k == 0 {
        return Ok(());
    }
    let order = ws.words(n)?;
    for a in 0..vi.shape[0] {
        for b in 0..vi.shape[1] {
            for c in 0..vi.shape[2] {
                let row = vi.at([a, b, c, 0]);
                let s = vi.stride[3];
                // SAFETY: j < n, inside the row.
                let at = |j: u64| unsafe { *row.offset(j as isize * s) };
                let cmp = |x: &u64, y: &u64| {
                    let o = ascending(&at(*x), &at(*y));
                    let o = if largest { o.reverse() } else { o };
                    o.then(x.cmp(y))
                };
                for (j, o) in order.iter_mut().enumerate() {
                    *o = j as u64;
                }
                if k < n {
                    order.select_nth_unstable_by(k - 1, cmp);
                }
                order[..k].sort_unstable_by(cmp);
                for (j, &src) in order[..k].iter().enumerate() {
                    // SAFETY: j < K, inside the outputs' rows.
                    unsafe {
                        vv.at([a, b, c, j]).write(at(src));
                        vx.at([a, b, c, j]).write(src as i64);
                    }
                }
            }
        }
    }
    Ok(())
}

impl Execute for op::TopK {
    unsafe fn execute(&self, mem: DeviceMemory, ws: &mut Workspace) -> Result<(), KernelError> {
        // The caller guarantees every operand in bounds and aligned ([`crate::execute`]).
        let op::TopK {
            input,
            values,
            indices,
            largest,
        } = self;

        // SAFETY: see above.
        unsafe { top_k(input, values, indices, *largest, mem, ws) }
    }
}
