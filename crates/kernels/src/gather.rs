//! `Gather` along dimension 2: `out[a, b, i, d] = data[a, b, idx[i], d]`.
//!
//! Every index is checked before anything is written: an index outside `[-A, A)` fails the
//! whole instruction with [`KernelError::IndexOutOfRange`] and leaves the output untouched.
//! Negative indices count from the end. Rows move as raw elements of the type's width.

use crate::strided::{View, copy_elems, overlaps};
use crate::{DeviceMemory, KernelError};
use nrt_hal::DType;
use nrt_isa::AccessPattern;

/// Reads index `i` of the indices operand.
///
/// # Safety
/// `i` < the operand's length; the operand inside device memory, aligned.
#[inline(always)]
unsafe fn index(ip: *const u8, stride: isize, i64s: bool, i: usize) -> i64 {
    // SAFETY: per the contract.
    unsafe {
        if i64s {
            *(ip as *const i64).offset(i as isize * stride)
        } else {
            *(ip as *const i32).offset(i as isize * stride) as i64
        }
    }
}

/// Executes `Op::Gather`.
///
/// # Safety
/// Operands inside `mem`, aligned to their element size.
pub unsafe fn gather(
    data: &AccessPattern,
    indices: &AccessPattern,
    output: &AccessPattern,
    mem: DeviceMemory,
) -> Result<(), KernelError> {
    let n = indices.shape[3] as usize;
    let limit = data.shape[2];
    let ip = mem.ptr(indices.addr) as *const u8;
    let is = indices.stride[3] as isize;
    let i64s = indices.dtype == DType::I64;
    for i in 0..n {
        // SAFETY: i < n, the indices operand's length.
        let v = unsafe { index(ip, is, i64s, i) };
        if v < -(limit as i64) || v >= limit as i64 {
            return Err(KernelError::IndexOutOfRange {
                position: i as u64,
                index: v,
                limit,
            });
        }
    }
    if output.elements() == 0 {
        return Ok(());
    }
    // SAFETY: indices validated; operands per the caller's contract.
    unsafe {
        match data.dtype.size() {
            1 => rows::<u8>(data, output, ip, is, i64s, mem),
            2 => rows::<u16>(data, output, ip, is, i64s, mem),
            4 => rows::<u32>(data, output, ip, is, i64s, mem),
            _ => rows::<u64>(data, output, ip, is, i64s, mem),
        }
    }
    Ok(())
}

/// # Safety
/// As [`gather`], with every index already validated.
unsafe fn rows<T: Copy>(
    data: &AccessPattern,
    output: &AccessPattern,
    ip: *const u8,
    is: isize,
    i64s: bool,
    mem: DeviceMemory,
) {
    let vd = View::<T>::new(data, mem);
    let vo = View::<T>::new(output, mem);
    let limit = vd.shape[2] as i64;
    let [d0, d1, n, d3] = vo.shape;
    let disjoint = !overlaps(data, output);
    for i in 0..n {
        // SAFETY: i < the indices' length; validated to lie in [-limit, limit).
        let v = unsafe { index(ip, is, i64s, i) };
        let src = if v < 0 { v + limit } else { v } as usize;
        for a in 0..d0 {
            for b in 0..d1 {
                let (s, o) = (vd.at([a, b, src, 0]), vo.at([a, b, i, 0]));
                if vd.stride[3] == 1 && vo.stride[3] == 1 {
                    // SAFETY: both rows of d3 elements lie inside their operands; `copy`
                    // tolerates overlap, `copy_elems` is for disjoint operands.
                    unsafe {
                        if disjoint {
                            copy_elems(s, o, d3)
                        } else {
                            core::ptr::copy(s, o, d3)
                        }
                    };
                } else {
                    for x in 0..d3 {
                        // SAFETY: as above.
                        unsafe {
                            o.offset(x as isize * vo.stride[3])
                                .write(*s.offset(x as isize * vd.stride[3]))
                        };
                    }
                }
            }
        }
    }
}
