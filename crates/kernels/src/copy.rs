//! `DmaCopy`, `Copy` and `Fill`: strided 4-D data movement.
//!
//! A copy between equal element types moves raw elements of the type's width (1, 2, 4 or 8
//! bytes) through the chunked [`map1`] driver, so transposes (permuted strides), slices,
//! concatenation, padding and expands (stride 0) are all one strided copy; a dense copy is a
//! single `memcpy`. A copy between different types converts each chunk through one
//! intermediate (see [`crate::elem`]) with one monomorphized load and one store loop per type.

use crate::elem::{Bf16, Bool, Elem, F16};
use crate::strided::{CHUNK, In, View, Walk, copy_elems, map1, overlaps, walk};
use crate::{DeviceMemory, KernelError};
use crate::{Execute, Workspace};
use nrt_hal::DType;
use nrt_hal::tuning::KERNEL_TRANSPOSE_TILE;
use nrt_isa::AccessPattern;
use nrt_isa::op;

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
        if src.shape == dst.shape && src.is_dense() && dst.is_dense() {
            // Both dense row-major: one `memmove` (a small copy through the chunked driver
            // costs ~700 instructions, more than the rest of a near-null execution).
            let bytes = dst.elements() as usize * dst.dtype.size();
            // SAFETY: the caller's contract: both operands lie inside `mem`; a dense view
            // spans exactly `elements × size` bytes from its address. `copy` tolerates
            // overlap.
            unsafe { core::ptr::copy(mem.ptr(src.addr).cast_const(), mem.ptr(dst.addr), bytes) };
            return Ok(());
        }
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
    let floaty = |d: DType| matches!(d, DType::F32 | DType::F16 | DType::Bf16 | DType::F64);
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
    let (vs, vd) = (View::<T>::new(src, mem), View::<T>::new(dst, mem));
    let w = walk(vd.shape, [vs.stride, vd.stride]);
    let [si, so] = w.inner();
    if so == 1
        && si.unsigned_abs() > 1
        && !overlaps(src, dst)
        && let Some(d) = (0..3).find(|&d| w.shape[d] > 1 && w.strides[0][d] == 1)
    {
        // SAFETY: the caller's contract; disjoint operands.
        unsafe { transpose(&w, d, vs.ptr, vd.ptr) };
        return;
    }
    // SAFETY: the caller's contract; `In::new` marks an overlapping source for buffering.
    unsafe {
        map1::<T, T>(In::new(src, dst, mem), View::new(dst, mem), |a, o| {
            // Two distinct slices: the driver never aliases input and output slices.
            copy_elems(a.as_ptr(), o.as_mut_ptr(), a.len().min(o.len()))
        })
    }
}

/// A copy whose source is contiguous along walk dimension `d` while the destination is
/// contiguous along the inner one: blocked in square tiles so every cache line of both sides
/// is used fully while it is in L1 (a row-by-row walk would touch a new source line per
/// element).
///
/// # Safety
/// The walk's elements lie inside both operands, which are disjoint.
unsafe fn transpose<T: Copy>(w: &Walk<2>, d: usize, ps: *const T, pd: *mut T) {
    const TILE: usize = KERNEL_TRANSPOSE_TILE;
    let (nr, nc) = (w.shape[d], w.shape[3]);
    let [si, _] = w.inner();
    let sor = w.strides[1][d];
    // The two remaining outer dimensions.
    let others: [usize; 2] = {
        let mut o = [0usize; 2];
        let mut k = 0;
        for e in 0..3 {
            if e != d {
                o[k] = e;
                k += 1;
            }
        }
        o
    };
    let [e0, e1] = others;
    for i0 in 0..w.shape[e0] {
        for i1 in 0..w.shape[e1] {
            let bs = i0 as isize * w.strides[0][e0] + i1 as isize * w.strides[0][e1];
            let bd = i0 as isize * w.strides[1][e0] + i1 as isize * w.strides[1][e1];
            #[cfg(all(target_arch = "x86_64", target_feature = "avx"))]
            if size_of::<T>() == 4 && TILE == 8 {
                // SAFETY: forwarded contract (4-byte elements).
                unsafe {
                    transpose_8x8_blocks(
                        nr,
                        nc,
                        ps.wrapping_offset(bs) as *const f32,
                        si,
                        pd.wrapping_offset(bd) as *mut f32,
                        sor,
                    )
                };
                continue;
            }
            for r0 in (0..nr).step_by(TILE) {
                for c0 in (0..nc).step_by(TILE) {
                    for c in c0..(c0 + TILE).min(nc) {
                        let s = ps.wrapping_offset(bs + c as isize * si);
                        let dd = pd.wrapping_offset(bd + c as isize);
                        for r in r0..(r0 + TILE).min(nr) {
                            // SAFETY: element (r, c) of this outer position, inside both
                            // operands per the contract.
                            unsafe { dd.offset(r as isize * sor).write(s.add(r).read()) };
                        }
                    }
                }
            }
        }
    }
}

/// `dst[r·dr + c] = src[r + c·sc]` for `r < nr`, `c < nc`, with 8×8 AVX register transposes
/// (any 4-byte element; moved as f32 bits) and scalar edges.
///
/// # Safety
/// Every addressed element inside the (disjoint) operands.
#[cfg(all(target_arch = "x86_64", target_feature = "avx"))]
unsafe fn transpose_8x8_blocks(
    nr: usize,
    nc: usize,
    src: *const f32,
    sc: isize,
    dst: *mut f32,
    dr: isize,
) {
    use core::arch::x86_64::*;
    let at = |r: usize, c: usize| src.wrapping_offset(r as isize + c as isize * sc);
    let to = |r: usize, c: usize| dst.wrapping_offset(r as isize * dr + c as isize);
    let (br, bc) = (nr / 8 * 8, nc / 8 * 8);
    for c0 in (0..bc).step_by(8) {
        for r0 in (0..br).step_by(8) {
            // SAFETY: the 8×8 block (r0.., c0..) lies inside both operands; loads and stores
            // are unaligned.
            unsafe {
                let v: [__m256; 8] = core::array::from_fn(|i| _mm256_loadu_ps(at(r0, c0 + i)));
                let t0 = _mm256_unpacklo_ps(v[0], v[1]);
                let t1 = _mm256_unpackhi_ps(v[0], v[1]);
                let t2 = _mm256_unpacklo_ps(v[2], v[3]);
                let t3 = _mm256_unpackhi_ps(v[2], v[3]);
                let t4 = _mm256_unpacklo_ps(v[4], v[5]);
                let t5 = _mm256_unpackhi_ps(v[4], v[5]);
                let t6 = _mm256_unpacklo_ps(v[6], v[7]);
                let t7 = _mm256_unpackhi_ps(v[6], v[7]);
                let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
                let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
                let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
                let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
                let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
                let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
                let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
                let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
                let o = [
                    _mm256_permute2f128_ps::<0x20>(u0, u4),
                    _mm256_permute2f128_ps::<0x20>(u1, u5),
                    _mm256_permute2f128_ps::<0x20>(u2, u6),
                    _mm256_permute2f128_ps::<0x20>(u3, u7),
                    _mm256_permute2f128_ps::<0x31>(u0, u4),
                    _mm256_permute2f128_ps::<0x31>(u1, u5),
                    _mm256_permute2f128_ps::<0x31>(u2, u6),
                    _mm256_permute2f128_ps::<0x31>(u3, u7),
                ];
                for (j, oj) in o.iter().enumerate() {
                    _mm256_storeu_ps(to(r0 + j, c0), *oj);
                }
            }
        }
    }
    // Edges: the columns past the last full block, then the rows past it.
    let one = |r: usize, c: usize| {
        // SAFETY: (r, c) inside both operands.
        unsafe { to(r, c).write(at(r, c).read()) }
    };
    for c in bc..nc {
        for r in 0..nr {
            one(r, c);
        }
    }
    for c in 0..bc {
        for r in br..nr {
            one(r, c);
        }
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
            DType::F64 => $f::<f64, $i>,
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

impl Execute for op::DmaCopy {
    unsafe fn execute(&self, mem: DeviceMemory, _ws: &mut Workspace) -> Result<(), KernelError> {
        // The caller guarantees every operand in bounds and aligned ([`crate::execute`]).
        let op::DmaCopy { src, dst } = self;

        // SAFETY: see above.
        unsafe { copy(src, dst, mem) }
    }
}

impl Execute for op::Copy {
    unsafe fn execute(&self, mem: DeviceMemory, _ws: &mut Workspace) -> Result<(), KernelError> {
        // The caller guarantees every operand in bounds and aligned ([`crate::execute`]).
        let op::Copy { input, output } = self;

        // SAFETY: see above.
        unsafe { copy(input, output, mem) }
    }
}

impl Execute for op::Fill {
    unsafe fn execute(&self, mem: DeviceMemory, _ws: &mut Workspace) -> Result<(), KernelError> {
        // The caller guarantees every operand in bounds and aligned ([`crate::execute`]).
        let op::Fill { out, bits } = self;

        // SAFETY: see above.
        unsafe { fill(out, *bits, mem) };
        Ok(())
    }
}
