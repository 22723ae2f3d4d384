//! `DmaCopy`, `Copy` and `Fill`: strided 4-D data movement.
//!
//! A copy between equal element types moves raw elements of the type's width (1, 2, 4 or 8
//! bytes) through the chunked [`map1`] driver, so transposes (permuted strides), slices,
//! concatenation, padding and expands (stride 0) are all one strided copy; a dense copy is a
//! single `memcpy`. A copy between different types converts each chunk through one
//! intermediate (see [`crate::elem`]) with one monomorphized load and one store loop per type.

use crate::elem::{Bf16, Bool, Elem, F16};
use crate::strided::{CHUNK, In, View, copy_elems, map1, walk};
use crate::{DeviceMemory, KernelError};
use nrt_hal::DType;
use nrt_isa::AccessPattern;

/// Copies `src` to `dst` (same shape), converting the element type if they differ.
///
/// # Safety
/// Both operands must lie inside `mem`, aligned to their element size.
pub unsafe fn copy(
    src: &AccessPattern,
    dst: &AccessPattern,
    mem: DeviceMemory,
) -> Result<(), KernelError> {
    if dst.elements() == 0 {
        return Ok(());
    }
    if src.dtype.size() == dst.dtype.size() && (src.dtype == dst.dtype || raw_compatible(src, dst))
    {
        // SAFETY: the caller's contract.
        unsafe {
            match dst.dtype.size() {
                1 => raw::<u8>(src, dst, mem),
                2 => raw::<u16>(src, dst, mem),
                4 => raw::<u32>(src, dst, mem),
                _ => raw::<u64>(src, dst, mem),
            }
        }
        return Ok(());
    }
    let floaty = |d: DType| matches!(d, DType::F32 | DType::F16 | DType::Bf16);
    let via_f32 = floaty(src.dtype) || floaty(dst.dtype);
    // SAFETY: the caller's contract.
    unsafe {
        if via_f32 {
            convert::<f32>(
                src,
                dst,
                mem,
                loader::<f32>(src.dtype),
                storer::<f32>(dst.dtype),
            );
        } else {
            convert::<i64>(
                src,
                dst,
                mem,
                loader::<i64>(src.dtype),
                storer::<i64>(dst.dtype),
            );
        }
    }
    Ok(())
}

/// Whether a conversion between two same-width types is a bit copy (signed ↔ unsigned
/// integers of one width wrap, which is the identity on bits).
fn raw_compatible(src: &AccessPattern, dst: &AccessPattern) -> bool {
    use DType::*;
    let int = |d: DType| matches!(d, I8 | U8 | I16 | U16 | I32 | U32 | I64 | U64);
    int(src.dtype) && int(dst.dtype)
}

/// # Safety
/// As [`copy`], with `T` of the operands' width.
unsafe fn raw<T: Copy>(src: &AccessPattern, dst: &AccessPattern, mem: DeviceMemory) {
    // SAFETY: the caller's contract; `In::new` marks an overlapping source for buffering.
    unsafe {
        map1::<T, T>(In::new(src, dst, mem), View::new(dst, mem), |a, o| {
            // Two distinct slices: the driver never aliases input and output slices.
            copy_elems(a.as_ptr(), o.as_mut_ptr(), a.len().min(o.len()))
        })
    }
}

/// The intermediate type of a conversion.
pub trait Inter: Copy + Default + 'static {
    /// Converts from a storage type.
    fn of<S: Elem>(s: S) -> Self;
    /// Converts to a storage type.
    fn to<D: Elem>(self) -> D;
}

impl Inter for f32 {
    #[inline(always)]
    fn of<S: Elem>(s: S) -> Self {
        s.to_f32()
    }
    #[inline(always)]
    fn to<D: Elem>(self) -> D {
        D::from_f32(self)
    }
}

impl Inter for i64 {
    #[inline(always)]
    fn of<S: Elem>(s: S) -> Self {
        s.to_i64()
    }
    #[inline(always)]
    fn to<D: Elem>(self) -> D {
        D::from_i64(self)
    }
}

type Loader<I> = unsafe fn(*const u8, isize, &mut [I]);
type Storer<I> = unsafe fn(&[I], *mut u8, isize);

/// Reads `out.len()` elements of `S` at `p` (element stride `s`) converted to `I`.
///
/// # Safety
/// The elements must be readable and aligned.
unsafe fn load<S: Elem, I: Inter>(p: *const u8, s: isize, out: &mut [I]) {
    let p = p as *const S;
    if s == 1 {
        // SAFETY: readable per the contract; the slice is dropped before anything is written.
        let src = unsafe { core::slice::from_raw_parts(p, out.len()) };
        for (o, x) in out.iter_mut().zip(src) {
            *o = I::of(*x);
        }
    } else {
        for (i, o) in out.iter_mut().enumerate() {
            // SAFETY: readable per the contract.
            *o = I::of(unsafe { p.offset(i as isize * s).read() });
        }
    }
}

/// Writes `buf` converted to `D` at `p` (element stride `s`).
///
/// # Safety
/// The elements must be writable and aligned.
unsafe fn store<D: Elem, I: Inter>(buf: &[I], p: *mut u8, s: isize) {
    let p = p as *mut D;
    if s == 1 {
        // SAFETY: writable per the contract, and no other reference to it is alive.
        let dst = unsafe { core::slice::from_raw_parts_mut(p, buf.len()) };
        for (o, x) in dst.iter_mut().zip(buf) {
            *o = x.to::<D>();
        }
    } else {
        for (i, x) in buf.iter().enumerate() {
            // SAFETY: writable per the contract.
            unsafe { p.offset(i as isize * s).write(x.to::<D>()) };
        }
    }
}

macro_rules! by_dtype {
    ($d:expr, $f:ident, $i:ty) => {
        match $d {
            DType::F32 => $f::<f32, $i>,
            DType::F16 => $f::<F16, $i>,
            DType::Bf16 => $f::<Bf16, $i>,
            DType::I8 => $f::<i8, $i>,
            DType::U8 => $f::<u8, $i>,
            DType::I16 => $f::<i16, $i>,
            DType::U16 => $f::<u16, $i>,
            DType::I32 => $f::<i32, $i>,
            DType::U32 => $f::<u32, $i>,
            DType::I64 => $f::<i64, $i>,
            DType::U64 => $f::<u64, $i>,
            DType::Bool => $f::<Bool, $i>,
        }
    };
}

fn loader<I: Inter>(d: DType) -> Loader<I> {
    by_dtype!(d, load, I)
}

fn storer<I: Inter>(d: DType) -> Storer<I> {
    by_dtype!(d, store, I)
}

/// # Safety
/// As [`copy`].
unsafe fn convert<I: Inter>(
    src: &AccessPattern,
    dst: &AccessPattern,
    mem: DeviceMemory,
    ld: Loader<I>,
    st: Storer<I>,
) {
    let (ss, ds) = (src.dtype.size() as isize, dst.dtype.size() as isize);
    let w = walk(
        dst.shape.map(|d| d as usize),
        [
            src.stride.map(|s| s as isize),
            dst.stride.map(|s| s as isize),
        ],
    );
    let n = w.len();
    let [si, di] = w.inner();
    let (ps, pd) = (mem.ptr(src.addr), mem.ptr(dst.addr));
    let mut buf = [I::default(); CHUNK];
    w.rows(|[os, od]| {
        let mut i = 0;
        while i < n {
            let m = CHUNK.min(n - i);
            let ii = i as isize;
            let b = &mut buf[..m];
            // SAFETY: the elements lie inside the operands (caller's contract); the chunk is
            // fully read into `buf` before any of it is written.
            unsafe {
                ld(ps.wrapping_offset((os + ii * si) * ss), si, b);
                st(b, pd.wrapping_offset((od + ii * di) * ds), di);
            }
            i += m;
        }
    });
}

/// Fills `out` with the element whose little-endian bits are the low bytes of `bits`.
///
/// # Safety
/// `out` must lie inside `mem`, aligned to its element size.
pub unsafe fn fill(out: &AccessPattern, bits: u64, mem: DeviceMemory) {
    // SAFETY: the caller's contract.
    unsafe {
        match out.dtype.size() {
            1 => fill_as::<u8>(out, bits as u8, mem),
            2 => fill_as::<u16>(out, bits as u16, mem),
            4 => fill_as::<u32>(out, bits as u32, mem),
            _ => fill_as::<u64>(out, bits, mem),
        }
    }
}

/// # Safety
/// As [`fill`].
unsafe fn fill_as<T: Copy>(out: &AccessPattern, v: T, mem: DeviceMemory) {
    let view = View::<T>::new(out, mem);
    let w = walk(view.shape, [view.stride]);
    let n = w.len();
    let [s] = w.inner();
    w.rows(|[o]| {
        let p = view.ptr.wrapping_offset(o);
        if s == 1 {
            // SAFETY: the row lies inside `out`; nothing else references it.
            unsafe { core::slice::from_raw_parts_mut(p, n) }.fill(v);
        } else {
            for i in 0..n {
                // SAFETY: as above.
                unsafe { p.offset(i as isize * s).write(v) };
            }
        }
    });
}
