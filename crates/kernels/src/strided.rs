//! Strided iteration shared by the kernels: typed views of access patterns, dimension
//! coalescing, and the chunked elementwise drivers [`map1`], [`map2`] and [`map3`].
//!
//! The drivers walk a common 4-D shape row by row. Adjacent dimensions that every operand
//! strides contiguously are merged first, so a dense tensor is one long row whatever its
//! shape. Each row is processed in chunks handed to a slice kernel (`Fn(&[A], &mut [O])`)
//! that the caller monomorphizes per operation and element type, so dispatch happens once per
//! call and the per-element loop vectorizes:
//! - an input with unit inner stride that does not overlap the output is passed as a slice of
//!   device memory directly; any other input (strided, broadcast by stride 0, negative, or
//!   overlapping the output — in-place included) is first copied into a stack buffer, which
//!   makes aliasing safe: a chunk is read completely before any of it is written;
//! - an output with unit inner stride is written directly, any other through a stack buffer.

use crate::DeviceMemory;
use core::mem::MaybeUninit;
use nrt_isa::AccessPattern;

/// Elements per chunk of the strided paths (see
/// [`KERNEL_CHUNK_ELEMS`](nrt_hal::tuning::KERNEL_CHUNK_ELEMS)).
pub const CHUNK: usize = nrt_hal::tuning::KERNEL_CHUNK_ELEMS;

/// A typed strided 4-D view of device memory (element strides).
#[derive(Debug)]
pub struct View<T> {
    /// Host pointer of element `[0,0,0,0]`.
    pub ptr: *mut T,
    /// Sizes.
    pub shape: [usize; 4],
    /// Element strides.
    pub stride: [isize; 4],
}

impl<T> Clone for View<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for View<T> {}

impl<T> View<T> {
    /// The view of `ap` in `mem`.
    pub fn new(ap: &AccessPattern, mem: DeviceMemory) -> Self {
        View {
            ptr: mem.ptr(ap.addr) as *mut T,
            shape: ap.shape.map(|d| d as usize),
            stride: ap.stride.map(|s| s as isize),
        }
    }

    /// Pointer of the element at `idx` (computed with wrapping arithmetic; dereferencing it
    /// is the caller's business).
    #[inline(always)]
    pub fn at(&self, idx: [usize; 4]) -> *mut T {
        let off = idx[0] as isize * self.stride[0]
            + idx[1] as isize * self.stride[1]
            + idx[2] as isize * self.stride[2]
            + idx[3] as isize * self.stride[3];
        self.ptr.wrapping_offset(off)
    }

    /// Number of elements.
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Whether the byte ranges two access patterns touch intersect.
pub fn overlaps(a: &AccessPattern, b: &AccessPattern) -> bool {
    let (alo, ahi) = a.byte_extent();
    let (blo, bhi) = b.byte_extent();
    if alo == ahi || blo == bhi {
        return false;
    }
    let (a0, a1) = (a.addr as i128 + alo, a.addr as i128 + ahi);
    let (b0, b1) = (b.addr as i128 + blo, b.addr as i128 + bhi);
    a0 < b1 && b0 < a1
}

/// A coalesced iteration space for `N` operands of one shape: dimensions of size 1 dropped,
/// mergeable neighbours merged, right-aligned (`shape[3]` is the inner row).
#[derive(Clone, Copy, Debug)]
pub struct Walk<const N: usize> {
    /// Sizes (leading unused dimensions are 1).
    pub shape: [usize; 4],
    /// Element strides per operand.
    pub strides: [[isize; 4]; N],
}

/// Builds the coalesced walk of `shape` for operands with `strides`.
pub fn walk<const N: usize>(shape: [usize; 4], strides: [[isize; 4]; N]) -> Walk<N> {
    let mut dims: [(usize, [isize; N]); 4] = [(1, [0; N]); 4];
    let mut n = 0;
    for d in 0..4 {
        if shape[d] == 1 {
            continue;
        }
        let s: [isize; N] = core::array::from_fn(|k| strides[k][d]);
        if n > 0 {
            let (pn, ps) = dims[n - 1];
            let _ = pn;
            // Merge into the previous (outer) dimension when every operand steps from its
            // last element in this dimension to the next outer one contiguously.
            if (0..N).all(|k| ps[k] == s[k] * shape[d] as isize) {
                dims[n - 1] = (pn * shape[d], s);
                continue;
            }
        }
        dims[n] = (shape[d], s);
        n += 1;
    }
    let mut w = Walk {
        shape: [1; 4],
        strides: [[0; 4]; N],
    };
    for (i, (size, s)) in dims[..n].iter().enumerate() {
        let d = 4 - n + i;
        w.shape[d] = *size;
        for (ws, sk) in w.strides.iter_mut().zip(s) {
            ws[d] = *sk;
        }
    }
    w
}

impl<const N: usize> Walk<N> {
    /// Length of the inner row.
    #[inline]
    pub fn len(&self) -> usize {
        self.shape[3]
    }

    /// Whether the walk is empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.shape.contains(&0)
    }

    /// Inner element stride of each operand.
    #[inline]
    pub fn inner(&self) -> [isize; N] {
        core::array::from_fn(|k| self.strides[k][3])
    }

    /// Calls `f` with the element offset of every operand at the start of each row.
    #[inline]
    pub fn rows(&self, mut f: impl FnMut([isize; N])) {
        if self.is_empty() {
            return;
        }
        for i0 in 0..self.shape[0] {
            for i1 in 0..self.shape[1] {
                for i2 in 0..self.shape[2] {
                    let o = core::array::from_fn(|k| {
                        let s = &self.strides[k];
                        i0 as isize * s[0] + i1 as isize * s[1] + i2 as isize * s[2]
                    });
                    f(o);
                }
            }
        }
    }
}

/// Copies `n` elements from `src` to `dst` (non-overlapping), avoiding libc `memcpy` in the
/// size range where it is slow on the project's machine (see
/// [`KERNEL_COPY_LOOP_BYTES`](nrt_hal::tuning::KERNEL_COPY_LOOP_BYTES)).
///
/// # Safety
/// `src` readable and `dst` writable for `n` elements, the two ranges disjoint.
#[inline]
pub unsafe fn copy_elems<T: Copy>(src: *const T, dst: *mut T, n: usize) {
    let bytes = n * size_of::<T>();
    let (lo, hi) = nrt_hal::tuning::KERNEL_COPY_LOOP_BYTES;
    #[cfg(all(target_arch = "x86_64", target_feature = "avx"))]
    if bytes >= lo && bytes < hi {
        use core::arch::x86_64::*;
        let (s, d) = (src as *const u8, dst as *mut u8);
        let mut i = 0;
        // SAFETY: every access is inside the first `bytes` bytes of `src`/`dst`.
        unsafe {
            while i + 128 <= bytes {
                let v: [__m256i; 4] =
                    core::array::from_fn(|k| _mm256_loadu_si256(s.add(i + 32 * k) as *const _));
                for (k, v) in v.iter().enumerate() {
                    _mm256_storeu_si256(d.add(i + 32 * k) as *mut _, *v);
                }
                i += 128;
            }
            while i + 32 <= bytes {
                _mm256_storeu_si256(d.add(i) as *mut _, _mm256_loadu_si256(s.add(i) as *const _));
                i += 32;
            }
            core::ptr::copy_nonoverlapping(s.add(i), d.add(i), bytes - i);
        }
        return;
    }
    let _ = (lo, hi, bytes);
    // SAFETY: per the contract.
    unsafe { core::ptr::copy_nonoverlapping(src, dst, n) };
}

/// Copies `buf.len()` elements at `p` (element stride `s`) into `buf`.
///
/// # Safety
/// Every element read must be valid for reads.
#[inline(always)]
pub unsafe fn gather_into<T: Copy>(p: *const T, s: isize, buf: &mut [T]) {
    match s {
        // SAFETY: the caller guarantees the elements are readable; `buf` is a distinct
        // stack/workspace buffer, so the ranges cannot overlap.
        1 => unsafe { copy_elems(p, buf.as_mut_ptr(), buf.len()) },
        // SAFETY: as above.
        0 => buf.fill(unsafe { p.read() }),
        _ => {
            for (i, b) in buf.iter_mut().enumerate() {
                // SAFETY: as above.
                *b = unsafe { p.offset(i as isize * s).read() };
            }
        }
    }
}

/// Copies `buf` to `buf.len()` elements at `p` (element stride `s`).
///
/// # Safety
/// Every element written must be valid for writes and not referenced elsewhere.
#[inline(always)]
pub unsafe fn scatter_from<T: Copy>(buf: &[T], p: *mut T, s: isize) {
    if s == 1 {
        // SAFETY: the caller guarantees the destination is writable; `buf` is a distinct
        // buffer.
        unsafe { copy_elems(buf.as_ptr(), p, buf.len()) };
    } else {
        for (i, b) in buf.iter().enumerate() {
            // SAFETY: as above.
            unsafe { p.offset(i as isize * s).write(*b) };
        }
    }
}

/// A stack buffer of [`CHUNK`] elements.
struct Buf<T>([MaybeUninit<T>; CHUNK]);

impl<T: Copy> Buf<T> {
    #[inline(always)]
    fn new() -> Self {
        Buf([MaybeUninit::uninit(); CHUNK])
    }
    /// The first `n` elements as a slice, after `fill` initialized them.
    #[inline(always)]
    fn filled(&mut self, n: usize, fill: impl FnOnce(&mut [T])) -> &[T] {
        let s = &mut self.0[..n];
        // SAFETY: the kernels only instantiate `Buf` with plain-old-data element types (numbers
        // and `u8` booleans), for which every bit pattern, uninitialized memory aside, is a
        // valid value; `fill` writes all `n` elements before the slice is read (the gather
        // helpers always write every element).
        let s = unsafe { &mut *(s as *mut [MaybeUninit<T>] as *mut [T]) };
        fill(s);
        s
    }
    /// The first `n` elements as a mutable slice for a kernel to write.
    #[inline(always)]
    fn out(&mut self, n: usize) -> &mut [T] {
        let s = &mut self.0[..n];
        // SAFETY: as in `filled`; the kernel writes every element before `scatter_from` reads
        // them (the slice kernels write their whole output slice).
        unsafe { &mut *(s as *mut [MaybeUninit<T>] as *mut [T]) }
    }
}

/// Input operand of the elementwise drivers.
#[derive(Clone, Copy, Debug)]
pub struct In<T> {
    /// The view.
    pub view: View<T>,
    /// Whether unit-stride rows may be read in place (the operand does not overlap the
    /// output).
    pub direct: bool,
}

impl<T> In<T> {
    /// `ap` in `mem`, read in place unless it overlaps `out`.
    pub fn new(ap: &AccessPattern, out: &AccessPattern, mem: DeviceMemory) -> Self {
        In {
            view: View::new(ap, mem),
            direct: !overlaps(ap, out),
        }
    }
}

/// Reads a chunk of an input: in place when allowed, else through `buf`.
///
/// # Safety
/// The `n` elements at `p` with stride `s` must be readable and, when read in place, not be
/// written while the returned slice lives.
#[inline(always)]
unsafe fn chunk_in<T: Copy>(
    p: *const T,
    s: isize,
    n: usize,
    direct: bool,
    buf: &mut Buf<T>,
) -> &[T] {
    if s == 1 && direct {
        // SAFETY: per the contract above.
        unsafe { core::slice::from_raw_parts(p, n) }
    } else {
        // SAFETY: per the contract above.
        buf.filled(n, |b| unsafe { gather_into(p, s, b) })
    }
}

/// Runs `kernel(in_chunk, out_chunk)` over `out = f(a)` elementwise.
///
/// # Safety
/// The views must describe readable (inputs) and writable (output) memory of one shape, and
/// `direct` may be set only for an input that does not overlap the output.
pub unsafe fn map1<A: Copy, O: Copy>(a: In<A>, out: View<O>, kernel: impl Fn(&[A], &mut [O])) {
    let w = walk(out.shape, [a.view.stride, out.stride]);
    let n = w.len();
    let [sa, so] = w.inner();
    let whole = sa == 1 && a.direct && so == 1;
    let (mut ab, mut ob) = (Buf::<A>::new(), Buf::<O>::new());
    w.rows(|[oa, oo]| {
        let (pa, po) = (a.view.ptr.wrapping_offset(oa), out.ptr.wrapping_offset(oo));
        let mut i = 0;
        while i < n {
            let m = if whole { n } else { CHUNK.min(n - i) };
            let ii = i as isize;
            // SAFETY: in bounds by the caller's contract; the input chunk is either a copy or
            // does not overlap the output.
            let av = unsafe { chunk_in(pa.wrapping_offset(ii * sa), sa, m, a.direct, &mut ab) };
            if so == 1 {
                // SAFETY: unit-stride output row in bounds; no input slice aliases it.
                let ov = unsafe { core::slice::from_raw_parts_mut(po.wrapping_offset(ii), m) };
                kernel(av, ov);
            } else {
                let ov = ob.out(m);
                kernel(av, ov);
                // SAFETY: output elements in bounds.
                unsafe { scatter_from(ov, po.wrapping_offset(ii * so), so) };
            }
            i += m;
        }
    });
}

/// Runs `kernel(a_chunk, b_chunk, out_chunk)` over `out = f(a, b)` elementwise.
///
/// # Safety
/// As [`map1`].
pub unsafe fn map2<A: Copy, B: Copy, O: Copy>(
    a: In<A>,
    b: In<B>,
    out: View<O>,
    kernel: impl Fn(&[A], &[B], &mut [O]),
) {
    let w = walk(out.shape, [a.view.stride, b.view.stride, out.stride]);
    let n = w.len();
    let [sa, sb, so] = w.inner();
    let whole = sa == 1 && a.direct && sb == 1 && b.direct && so == 1;
    let (mut ab, mut bb, mut ob) = (Buf::<A>::new(), Buf::<B>::new(), Buf::<O>::new());
    // An input read across its rows (a transposed operand: unit stride down the output's
    // columns, not along its rows) goes tile by tile, so that each of its cache lines is read
    // once: gathered row by row, every element was a different line (and with a power-of-two
    // row pitch, the same few L1 sets), 17× the time of a dense input.
    let across = |s: [isize; 4]| s[3] != 0 && s[3] != 1 && s[2] == 1;
    if so == 1 && w.shape[2] >= TILE_ROWS && !w.is_empty() {
        // (Only an input that does not overlap the output: the tiles would read an element
        // after the kernel wrote its alias.)
        if across(w.strides[1]) && b.direct {
            // SAFETY: forwarded contract.
            unsafe { map2_tiled(&w, a, b, out, &kernel) };
            return;
        }
        if across(w.strides[0]) && a.direct {
            // SAFETY: forwarded contract; the kernel sees its operands in their order.
            unsafe {
                map2_tiled(
                    &Walk {
                        shape: w.shape,
                        strides: [w.strides[1], w.strides[0], w.strides[2]],
                    },
                    b,
                    a,
                    out,
                    &|x: &[B], y: &[A], o: &mut [O]| kernel(y, x, o),
                )
            };
            return;
        }
    }
    w.rows(|[oa, ob_, oo]| {
        let pa = a.view.ptr.wrapping_offset(oa);
        let pb = b.view.ptr.wrapping_offset(ob_);
        let po = out.ptr.wrapping_offset(oo);
        let mut i = 0;
        while i < n {
            let m = if whole { n } else { CHUNK.min(n - i) };
            let ii = i as isize;
            // SAFETY: as in `map1`.
            let av = unsafe { chunk_in(pa.wrapping_offset(ii * sa), sa, m, a.direct, &mut ab) };
            // SAFETY: as in `map1`.
            let bv = unsafe { chunk_in(pb.wrapping_offset(ii * sb), sb, m, b.direct, &mut bb) };
            if so == 1 {
                // SAFETY: as in `map1`.
                let ov = unsafe { core::slice::from_raw_parts_mut(po.wrapping_offset(ii), m) };
                kernel(av, bv, ov);
            } else {
                let ov = ob.out(m);
                kernel(av, bv, ov);
                // SAFETY: as in `map1`.
                unsafe { scatter_from(ov, po.wrapping_offset(ii * so), so) };
            }
            i += m;
        }
    });
}

/// Rows per tile of [`map2`]'s transposed-input path.
const TILE_ROWS: usize = 16;
/// Columns per tile (`TILE_ROWS × TILE_COLS` elements fill one chunk buffer).
const TILE_COLS: usize = CHUNK / TILE_ROWS;

/// [`map2`] where `b` is read across its rows (`w.strides[1]`: unit stride along dimension 2,
/// not along the row): in tiles of [`TILE_ROWS`] output rows × [`TILE_COLS`] columns, `b`'s
/// tile gathered column by column (each column one contiguous run of `TILE_ROWS`), then the
/// kernel row by row.
///
/// # Safety
/// As [`map2`]; `w` is the walk of `a`, `b` and `out` in that order, output rows unit-stride.
unsafe fn map2_tiled<A: Copy, B: Copy, O: Copy>(
    w: &Walk<3>,
    a: In<A>,
    b: In<B>,
    out: View<O>,
    kernel: &impl Fn(&[A], &[B], &mut [O]),
) {
    let n = w.len();
    let [sa, sb, _] = w.inner();
    let (mut ab, mut tb) = (Buf::<A>::new(), Buf::<B>::new());
    let [s0, s1, s2] = [0, 1, 2].map(|d| [w.strides[0][d], w.strides[1][d], w.strides[2][d]]);
    for i0 in 0..w.shape[0] {
        for i1 in 0..w.shape[1] {
            let base = |k: usize| i0 as isize * s0[k] + i1 as isize * s1[k];
            let mut r0 = 0;
            while r0 < w.shape[2] {
                let rows = TILE_ROWS.min(w.shape[2] - r0);
                let mut c0 = 0;
                while c0 < n {
                    let cols = TILE_COLS.min(n - c0);
                    // b's tile: element (r, c) at base + (r0 + r)·1 + (c0 + c)·sb.
                    let pb = b
                        .view
                        .ptr
                        .wrapping_offset(base(1) + r0 as isize * s2[1] + c0 as isize * sb);
                    let tile = tb.filled(TILE_ROWS * TILE_COLS, |t| {
                        for c in 0..cols {
                            let col = pb.wrapping_offset(c as isize * sb);
                            for r in 0..rows {
                                // SAFETY: element (r0 + r, c0 + c) of b, inside it per the
                                // contract.
                                t[r * TILE_COLS + c] = unsafe { *col.wrapping_add(r) };
                            }
                        }
                    });
                    for r in 0..rows {
                        let row = (r0 + r) as isize;
                        let pa = a
                            .view
                            .ptr
                            .wrapping_offset(base(0) + row * s2[0] + c0 as isize * sa);
                        // SAFETY: as in `map2`: a's row chunk, read in place when allowed.
                        let av = unsafe { chunk_in(pa, sa, cols, a.direct, &mut ab) };
                        let po = out.ptr.wrapping_offset(base(2) + row * s2[2] + c0 as isize);
                        // SAFETY: `cols` unit-stride output elements of row `row`.
                        let ov = unsafe { core::slice::from_raw_parts_mut(po, cols) };
                        kernel(av, &tile[r * TILE_COLS..r * TILE_COLS + cols], ov);
                    }
                    c0 += cols;
                }
                r0 += rows;
            }
        }
    }
}

/// Runs `kernel(a_chunk, b_chunk, c_chunk, out_chunk)` over `out = f(a, b, c)` elementwise.
///
/// # Safety
/// As [`map1`].
pub unsafe fn map3<A: Copy, B: Copy, C: Copy, O: Copy>(
    a: In<A>,
    b: In<B>,
    c: In<C>,
    out: View<O>,
    kernel: impl Fn(&[A], &[B], &[C], &mut [O]),
) {
    let w = walk(
        out.shape,
        [a.view.stride, b.view.stride, c.view.stride, out.stride],
    );
    let n = w.len();
    let [sa, sb, sc, so] = w.inner();
    let (mut ab, mut bb, mut cb, mut ob) = (
        Buf::<A>::new(),
        Buf::<B>::new(),
        Buf::<C>::new(),
        Buf::<O>::new(),
    );
    w.rows(|[oa, ob_, oc, oo]| {
        let pa = a.view.ptr.wrapping_offset(oa);
        let pb = b.view.ptr.wrapping_offset(ob_);
        let pc = c.view.ptr.wrapping_offset(oc);
        let po = out.ptr.wrapping_offset(oo);
        let mut i = 0;
        while i < n {
            let m = CHUNK.min(n - i);
            let ii = i as isize;
            // SAFETY: as in `map1`.
            let av = unsafe { chunk_in(pa.wrapping_offset(ii * sa), sa, m, a.direct, &mut ab) };
            // SAFETY: as in `map1`.
            let bv = unsafe { chunk_in(pb.wrapping_offset(ii * sb), sb, m, b.direct, &mut bb) };
            // SAFETY: as in `map1`.
            let cv = unsafe { chunk_in(pc.wrapping_offset(ii * sc), sc, m, c.direct, &mut cb) };
            if so == 1 {
                // SAFETY: as in `map1`.
                let ov = unsafe { core::slice::from_raw_parts_mut(po.wrapping_offset(ii), m) };
                kernel(av, bv, cv, ov);
            } else {
                let ov = ob.out(m);
                kernel(av, bv, cv, ov);
                // SAFETY: as in `map1`.
                unsafe { scatter_from(ov, po.wrapping_offset(ii * so), so) };
            }
            i += m;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coalesces_dense_and_keeps_transposes() {
        let w = walk([2, 3, 4, 5], [[60, 20, 5, 1]]);
        assert_eq!(w.shape, [1, 1, 1, 120]);
        assert_eq!(w.strides[0][3], 1);
        // Transposed last two dims: no merge across them.
        let w = walk([1, 2, 4, 5], [[40, 20, 5, 1], [40, 20, 1, 4]]);
        assert_eq!(w.shape, [1, 2, 4, 5]);
        // Broadcast dim: merges with another broadcast dim only.
        let w = walk([1, 3, 4, 5], [[0, 0, 0, 1], [0, 20, 5, 1]]);
        assert_eq!(w.shape, [1, 1, 12, 5]);
        assert_eq!(w.strides[0][2], 0);
        // Size-1 dims are dropped whatever their stride.
        let w = walk([7, 1, 1, 3], [[98, 1000, 5, 33]]);
        assert_eq!(w.shape, [1, 1, 7, 3]);
    }

    #[test]
    fn copy_elems_copies_every_size() {
        let src: Vec<u32> = (0..3000).collect();
        for n in [0, 1, 7, 8, 31, 32, 33, 511, 512, 513, 600, 1000, 2047, 3000] {
            let mut dst = vec![u32::MAX; 3001];
            // SAFETY: distinct vectors, n ≤ both lengths.
            unsafe { copy_elems(src.as_ptr(), dst.as_mut_ptr(), n) };
            assert_eq!(&dst[..n], &src[..n]);
            assert_eq!(dst[n], u32::MAX, "no write past n");
        }
        let src: Vec<u8> = (0..5000).map(|i| i as u8).collect();
        for n in [2047, 2048, 2049, 4097, 5000] {
            let mut dst = vec![0u8; 5001];
            // SAFETY: as above.
            unsafe { copy_elems(src.as_ptr(), dst.as_mut_ptr(), n) };
            assert_eq!(&dst[..n], &src[..n]);
        }
    }

    #[test]
    fn overlap_detection() {
        let a = AccessPattern::dense(0, nrt_hal::DType::F32, &[4]);
        let mut b = a;
        b.addr = 16;
        assert!(!overlaps(&a, &b));
        b.addr = 12;
        assert!(overlaps(&a, &b));
    }
}
