//! `Gather` along dimension 2: `out[a, b, i, d] = data[a, b, idx[i], d]`; `GatherElements`
//! and `ScatterElements`: one index per element along any dimension.
//!
//! Every index is checked before anything is written: an index outside `[-A, A)` fails the
//! whole instruction with [`KernelError::IndexOutOfRange`] and leaves the output untouched.
//! Negative indices count from the end. Rows move as raw elements of the type's width.

use crate::strided::{View, copy_elems, overlaps};
use crate::{DeviceMemory, KernelError};
use crate::{Execute, Workspace};
use nrt_hal::DType;
use nrt_isa::op;
use nrt_isa::{AccessPattern, ScatterReduce};

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

/// Every position of a 4-D shape, in row-major order.
fn positions(shape: [usize; 4]) -> impl Iterator<Item = [usize; 4]> {
    let [a, b, c, d] = shape;
    (0..a).flat_map(move |i| {
        (0..b).flat_map(move |j| (0..c).flat_map(move |k| (0..d).map(move |l| [i, j, k, l])))
    })
}

/// Checks every index of `indices` against `[-limit, limit)`; the first one outside is the
/// error (its position in row-major order).
///
/// # Safety
/// The operand inside `mem`, aligned.
unsafe fn check_indices(
    indices: &AccessPattern,
    limit: u32,
    mem: DeviceMemory,
) -> Result<(), KernelError> {
    let i64s = indices.dtype == DType::I64;
    let vi = View::<u8>::new(indices, mem);
    for (pos, p) in positions(vi.shape).enumerate() {
        // SAFETY: `p` lies inside the operand.
        let v = unsafe { element_index(&vi, i64s, p) };
        if v < -(limit as i64) || v >= limit as i64 {
            return Err(KernelError::IndexOutOfRange {
                position: pos as u64,
                index: v,
                limit,
            });
        }
    }
    Ok(())
}

/// The index at position `p` of an i32/i64 operand viewed as bytes (element strides).
///
/// # Safety
/// `p` inside the operand; the operand inside device memory, aligned.
#[inline(always)]
unsafe fn element_index(vi: &View<u8>, i64s: bool, p: [usize; 4]) -> i64 {
    let off = (0..4).map(|d| p[d] as isize * vi.stride[d]).sum::<isize>();
    // SAFETY: per the contract.
    unsafe {
        if i64s {
            *(vi.ptr as *const i64).offset(off)
        } else {
            *(vi.ptr as *const i32).offset(off) as i64
        }
    }
}

/// Executes `Op::GatherElements`: `out[p] = data[p with p[axis] = idx[p]]`.
///
/// # Safety
/// Operands inside `mem`, aligned to their element size, shapes as the decoder checks.
pub unsafe fn gather_elements(
    data: &AccessPattern,
    indices: &AccessPattern,
    output: &AccessPattern,
    axis: u8,
    mem: DeviceMemory,
) -> Result<(), KernelError> {
    let axis = axis as usize;
    let limit = data.shape[axis];
    // SAFETY: per the caller's contract.
    unsafe { check_indices(indices, limit, mem)? };
    // SAFETY: indices validated; operands per the caller's contract.
    unsafe {
        match data.dtype.size() {
            1 => gather_el::<u8>(data, indices, output, axis, mem),
            2 => gather_el::<u16>(data, indices, output, axis, mem),
            4 => gather_el::<u32>(data, indices, output, axis, mem),
            _ => gather_el::<u64>(data, indices, output, axis, mem),
        }
    }
    Ok(())
}

/// # Safety
/// As [`gather_elements`], every index validated.
unsafe fn gather_el<T: Copy>(
    data: &AccessPattern,
    indices: &AccessPattern,
    output: &AccessPattern,
    axis: usize,
    mem: DeviceMemory,
) {
    let (vd, vo) = (View::<T>::new(data, mem), View::<T>::new(output, mem));
    let vi = View::<u8>::new(indices, mem);
    let i64s = indices.dtype == DType::I64;
    let limit = vd.shape[axis] as i64;
    for p in positions(vo.shape) {
        // SAFETY: `p` inside the indices (same shape as the output); the index validated,
        // so `q` lies inside `data`.
        unsafe {
            let v = element_index(&vi, i64s, p);
            let mut q = p;
            q[axis] = if v < 0 { v + limit } else { v } as usize;
            vo.at(p).write(*vd.at(q));
        }
    }
}

/// Executes `Op::ScatterElements`: for every position `p` of `updates`, in row-major order,
/// `out[p with p[axis] = idx[p]] = out[…] ∘ updates[p]`.
///
/// # Safety
/// Operands inside `mem`, aligned to their element size, shapes and types as the decoder
/// checks.
pub unsafe fn scatter_elements(
    indices: &AccessPattern,
    updates: &AccessPattern,
    output: &AccessPattern,
    axis: u8,
    reduce: ScatterReduce,
    mem: DeviceMemory,
) -> Result<(), KernelError> {
    let axis = axis as usize;
    // SAFETY: per the caller's contract.
    unsafe { check_indices(indices, output.shape[axis], mem)? };
    // SAFETY: indices validated; operands per the caller's contract.
    unsafe {
        match (reduce, output.dtype) {
            (ScatterReduce::None, dt) => match dt.size() {
                1 => scatter_el::<u8>(indices, updates, output, axis, mem, |_, u| u),
                2 => scatter_el::<u16>(indices, updates, output, axis, mem, |_, u| u),
                4 => scatter_el::<u32>(indices, updates, output, axis, mem, |_, u| u),
                _ => scatter_el::<u64>(indices, updates, output, axis, mem, |_, u| u),
            },
            (r, DType::F32) => scatter_el::<f32>(indices, updates, output, axis, mem, combine(r)),
            (r, DType::I32) => scatter_el::<i32>(indices, updates, output, axis, mem, combine(r)),
            (r, DType::I64) => scatter_el::<i64>(indices, updates, output, axis, mem, combine(r)),
            _ => return Err(KernelError::Unsupported("ScatterElements reduction type")),
        }
    }
    Ok(())
}

/// Arithmetic of the scatter reductions.
trait Combine: Copy + PartialOrd {
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
}
impl Combine for f32 {
    fn add(self, o: Self) -> Self {
        self + o
    }
    fn mul(self, o: Self) -> Self {
        self * o
    }
}
impl Combine for i32 {
    fn add(self, o: Self) -> Self {
        self.wrapping_add(o)
    }
    fn mul(self, o: Self) -> Self {
        self.wrapping_mul(o)
    }
}
impl Combine for i64 {
    fn add(self, o: Self) -> Self {
        self.wrapping_add(o)
    }
    fn mul(self, o: Self) -> Self {
        self.wrapping_mul(o)
    }
}

/// `old ∘ update` for reduction `r` (integers wrap, as ONNX Runtime's do).
fn combine<T: Combine>(r: ScatterReduce) -> impl Fn(T, T) -> T {
    move |old, u| match r {
        ScatterReduce::None => u,
        ScatterReduce::Add => old.add(u),
        ScatterReduce::Mul => old.mul(u),
        ScatterReduce::Max => {
            if u > old {
                u
            } else {
                old
            }
        }
        ScatterReduce::Min => {
            if u < old {
                u
            } else {
                old
            }
        }
    }
}

/// # Safety
/// As [`scatter_elements`], every index validated.
unsafe fn scatter_el<T: Copy>(
    indices: &AccessPattern,
    updates: &AccessPattern,
    output: &AccessPattern,
    axis: usize,
    mem: DeviceMemory,
    f: impl Fn(T, T) -> T,
) {
    let (vu, vo) = (View::<T>::new(updates, mem), View::<T>::new(output, mem));
    let vi = View::<u8>::new(indices, mem);
    let i64s = indices.dtype == DType::I64;
    let limit = vo.shape[axis] as i64;
    for p in positions(vu.shape) {
        // SAFETY: `p` inside the indices and updates (same shape); the index validated, so
        // `q` lies inside the output.
        unsafe {
            let v = element_index(&vi, i64s, p);
            let mut q = p;
            q[axis] = if v < 0 { v + limit } else { v } as usize;
            let o = vo.at(q);
            o.write(f(*o, *vu.at(p)));
        }
    }
}

impl Execute for op::Gather {
    unsafe fn execute(&self, mem: DeviceMemory, _ws: &mut Workspace) -> Result<(), KernelError> {
        // The caller guarantees every operand in bounds and aligned ([`crate::execute`]).
        let op::Gather {
            data,
            indices,
            output,
        } = self;

        // SAFETY: see above.
        unsafe { gather(data, indices, output, mem) }
    }
}

impl Execute for op::GatherElements {
    unsafe fn execute(&self, mem: DeviceMemory, _ws: &mut Workspace) -> Result<(), KernelError> {
        // The caller guarantees every operand in bounds and aligned ([`crate::execute`]).
        let op::GatherElements {
            data,
            indices,
            output,
            axis,
        } = self;

        // SAFETY: see above.
        unsafe { gather_elements(data, indices, output, *axis, mem) }
    }
}

impl Execute for op::ScatterElements {
    unsafe fn execute(&self, mem: DeviceMemory, _ws: &mut Workspace) -> Result<(), KernelError> {
        // The caller guarantees every operand in bounds and aligned ([`crate::execute`]).
        let op::ScatterElements {
            indices,
            updates,
            output,
            axis,
            reduce,
        } = self;

        // SAFETY: see above.
        unsafe { scatter_elements(indices, updates, output, *axis, *reduce, mem) }
    }
}
