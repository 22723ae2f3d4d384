//! Operations whose output extent depends on the data: `NonZero`, `Unique`,
//! `NonMaxSuppression` (NCM 1.4).
//!
//! The device has static shapes, so each such output is an operand of its static upper
//! bound. The kernel writes the actual result packed first (the row-major elements of the
//! actual shape, as if the tensor had that shape), zero-fills the rest of the bound
//! (deterministic: stale data of an earlier execution never shows), and writes the actual
//! shape as i64 into the instruction's `shape` operand. The runtime's users (`nrt run`,
//! `nrt conformance`, the Python package) trim each output to its companion shape.
//!
//! Scratch (sort orders, group tables, selected boxes) lives in the [`Workspace`]; every
//! loop bound comes from the operands' shapes, which the decoder checked; a selection count
//! never exceeds the bound operand it is written to.

use crate::Execute;
use crate::strided::View;
use crate::{DeviceMemory, KernelError, Workspace};
use core::cmp::Ordering;
use nrt_hal::DType;
use nrt_isa::op;
use nrt_isa::{AccessPattern, ShapeTemplate, nms_flags};

/// Pointer of the `p`-th element (row-major over the view's shape) of a view.
#[inline]
fn flat<T>(v: &View<T>, p: usize) -> *mut T {
    let [_, s1, s2, s3] = v.shape;
    let i3 = p % s3.max(1);
    let q = p / s3.max(1);
    let i2 = q % s2.max(1);
    let q = q / s2.max(1);
    let i1 = q % s1.max(1);
    let i0 = q / s1.max(1);
    v.at([i0, i1, i2, i3])
}

/// Writes `v` at flat position `p` of `out` (row-major over its shape).
///
/// # Safety
/// `p` below the view's element count; the view inside device memory.
#[inline]
unsafe fn put<T>(out: &View<T>, p: usize, v: T) {
    // SAFETY: per the caller's contract.
    unsafe { flat(out, p).write(v) }
}

/// Zero-fills `out` from flat position `from` to its end.
///
/// # Safety
/// The view inside device memory.
unsafe fn zero_from<T: Default>(out: &View<T>, from: usize) {
    for p in from..out.elements() {
        // SAFETY: p < elements.
        unsafe { put(out, p, T::default()) }
    }
}

/// Writes the `shape` operand (`[1, 1, 1, n]` of i64).
///
/// # Safety
/// `dims.len()` equals the operand's last dimension; the operand inside device memory.
unsafe fn write_shape(shape: &AccessPattern, dims: &[u64], mem: DeviceMemory) {
    let v = View::<i64>::new(shape, mem);
    for (k, &d) in dims.iter().enumerate() {
        // SAFETY: k < n.
        unsafe { v.at([0, 0, 0, k]).write(d as i64) }
    }
}

//===------------------------------------------------------------------------------------===//
// NonZero
//===------------------------------------------------------------------------------------===//

/// Executes `Op::NonZero`.
///
/// # Safety
/// Operands inside `mem`, aligned to their element size, shapes and types as the decoder
/// checks.
pub unsafe fn non_zero(
    input: &AccessPattern,
    output: &AccessPattern,
    shape: &AccessPattern,
    mem: DeviceMemory,
) -> Result<(), KernelError> {
    // Nonzero: any bit set but a float's sign bit (so -0.0 is zero, NaN is not).
    // SAFETY: per the caller's contract.
    unsafe {
        match input.dtype {
            DType::F32 => nz::<u32>(input, output, shape, 0x7fff_ffff, mem),
            DType::F64 => nz::<u64>(input, output, shape, !(1u64 << 63), mem),
            DType::F16 | DType::Bf16 => nz::<u16>(input, output, shape, 0x7fff, mem),
            DType::I64 | DType::U64 => nz::<u64>(input, output, shape, !0, mem),
            DType::I32 | DType::U32 => nz::<u32>(input, output, shape, !0, mem),
            DType::I16 | DType::U16 => nz::<u16>(input, output, shape, !0, mem),
            DType::I8 | DType::U8 | DType::Bool => nz::<u8>(input, output, shape, !0, mem),
        }
    }
    Ok(())
}

/// # Safety
/// As [`non_zero`], `T` an unsigned integer of the input's element size.
unsafe fn nz<T>(
    input: &AccessPattern,
    output: &AccessPattern,
    shape: &AccessPattern,
    mask: T,
    mem: DeviceMemory,
) where
    T: Copy + PartialEq + Default + core::ops::BitAnd<Output = T>,
{
    let vi = View::<T>::new(input, mem);
    let vo = View::<i64>::new(output, mem);
    let rank = vo.shape[2];
    let zero = T::default();
    let is_nz = |i: [usize; 4]| {
        // SAFETY: every index passed is inside the input's shape.
        let v = unsafe { vi.at(i).read() };
        v & mask != zero
    };
    let each = |f: &mut dyn FnMut([usize; 4])| {
        for a in 0..vi.shape[0] {
            for b in 0..vi.shape[1] {
                for c in 0..vi.shape[2] {
                    for d in 0..vi.shape[3] {
                        let i = [a, b, c, d];
                        if is_nz(i) {
                            f(i);
                        }
                    }
                }
            }
        }
    };
    let mut count = 0usize;
    each(&mut |_| count += 1);
    let mut k = 0usize;
    each(&mut |i| {
        for r in 0..rank {
            // SAFETY: r·count + k < rank·count ≤ rank·N, the output's elements.
            unsafe { put(&vo, r * count + k, i[4 - rank + r] as i64) }
        }
        k += 1;
    });
    // SAFETY: the output view is in bounds; the shape operand holds 2 values.
    unsafe {
        zero_from(&vo, rank * count);
        write_shape(shape, &[rank as u64, count as u64], mem);
    }
}

//===------------------------------------------------------------------------------------===//
// Unique
//===------------------------------------------------------------------------------------===//

/// The operands of `Op::Unique`.
#[derive(Debug)]
pub struct UniqueArgs<'a> {
    pub input: &'a AccessPattern,
    pub y: &'a AccessPattern,
    pub indices: &'a AccessPattern,
    pub inverse: &'a AccessPattern,
    pub counts: &'a AccessPattern,
    pub shape: &'a AccessPattern,
    pub dims: &'a ShapeTemplate,
    pub sorted: bool,
}

/// Executes `Op::Unique`.
///
/// # Safety
/// Operands inside `mem`, aligned to their element size, shapes and types as the decoder
/// checks.
pub unsafe fn unique(
    a: &UniqueArgs<'_>,
    mem: DeviceMemory,
    ws: &mut Workspace,
) -> Result<(), KernelError> {
    // SAFETY: per the caller's contract.
    unsafe {
        match a.input.dtype {
            DType::F32 => uniq::<f32>(a, mem, ws)?,
            DType::I32 => uniq::<i32>(a, mem, ws)?,
            DType::I64 => uniq::<i64>(a, mem, ws)?,
            DType::I16 => uniq::<i16>(a, mem, ws)?,
            DType::I8 => uniq::<i8>(a, mem, ws)?,
            DType::U64 => uniq::<u64>(a, mem, ws)?,
            DType::U32 => uniq::<u32>(a, mem, ws)?,
            DType::U16 => uniq::<u16>(a, mem, ws)?,
            DType::U8 => uniq::<u8>(a, mem, ws)?,
            _ => return Err(KernelError::Unsupported("Unique element type")),
        }
    }
    Ok(())
}

/// Ascending order with NaN above everything and equal to itself (numpy's `unique`).
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
/// As [`unique`], `T` the input's element type.
unsafe fn uniq<T: Copy + PartialOrd + Default>(
    a: &UniqueArgs<'_>,
    mem: DeviceMemory,
    ws: &mut Workspace,
) -> Result<(), KernelError> {
    let vi = View::<T>::new(a.input, mem);
    let vy = View::<T>::new(a.y, mem);
    let vidx = View::<i64>::new(a.indices, mem);
    let vinv = View::<i64>::new(a.inverse, mem);
    let vcnt = View::<i64>::new(a.counts, mem);
    let [_, outer, n, inner] = vi.shape;
    // Scratch: the sorted order of the slices, each slice's group, each group's first
    // occurrence and count, and (unsorted) the groups by first occurrence and their rank.
    let words = ws.words(n.saturating_mul(6))?;
    let (order, rest) = words.split_at_mut(n);
    let (group, rest) = rest.split_at_mut(n);
    let (first, rest) = rest.split_at_mut(n);
    let (count, rest) = rest.split_at_mut(n);
    let (perm, rank) = rest.split_at_mut(n);
    let at = |j: u64, o: usize, i: usize| {
        // SAFETY: j < n, o < outer, i < inner: inside the input.
        unsafe { vi.at([0, o, j as usize, i]).read() }
    };
    let cmp_slices = |x: u64, y: u64| {
        for o in 0..outer {
            for i in 0..inner {
                let c = ascending(&at(x, o, i), &at(y, o, i));
                if c != Ordering::Equal {
                    return c;
                }
            }
        }
        Ordering::Equal
    };
    for (j, o) in order.iter_mut().enumerate() {
        *o = j as u64;
    }
    order.sort_unstable_by(|&x, &y| cmp_slices(x, y).then(x.cmp(&y)));
    // Groups of equal slices, in ascending order; the first of each is its lowest index.
    let mut groups = 0usize;
    for k in 0..n {
        let j = order[k];
        if k == 0 || cmp_slices(order[k - 1], j) != Ordering::Equal {
            first[groups] = j;
            count[groups] = 0;
            groups += 1;
        }
        group[j as usize] = (groups - 1) as u64;
        count[groups - 1] += 1;
    }
    // Output position of each group.
    for (g, p) in perm[..groups].iter_mut().enumerate() {
        *p = g as u64;
    }
    if !a.sorted {
        perm[..groups].sort_unstable_by_key(|&g| first[g as usize]);
    }
    for (r, &g) in perm[..groups].iter().enumerate() {
        rank[g as usize] = r as u64;
    }
    // SAFETY: every position below is inside its operand: u < groups ≤ n, j < n, and the
    // packed `y` position (o·U + u)·inner + i < outer·n·inner.
    unsafe {
        for (u, &g) in perm[..groups].iter().enumerate() {
            let src = first[g as usize];
            for o in 0..outer {
                for i in 0..inner {
                    put(&vy, (o * groups + u) * inner + i, at(src, o, i));
                }
            }
            put(&vidx, u, src as i64);
            put(&vcnt, u, count[g as usize] as i64);
        }
        for j in 0..n {
            put(&vinv, j, rank[group[j] as usize] as i64);
        }
        zero_from(&vy, outer * groups * inner);
        zero_from(&vidx, groups);
        zero_from(&vcnt, groups);
        let d = a.dims;
        let mut dims = [0u64; 8];
        for (k, x) in dims.iter_mut().enumerate().take(d.rank as usize) {
            *x = if k == d.axis as usize {
                groups as u64
            } else {
                d.dims[k] as u64
            };
        }
        write_shape(a.shape, &dims[..d.rank as usize], mem);
    }
    Ok(())
}

//===------------------------------------------------------------------------------------===//
// NonMaxSuppression
//===------------------------------------------------------------------------------------===//

/// The operands of `Op::NonMaxSuppression`.
#[derive(Debug)]
pub struct NmsArgs<'a> {
    pub boxes: &'a AccessPattern,
    pub scores: &'a AccessPattern,
    pub max_out: Option<&'a AccessPattern>,
    pub iou: Option<&'a AccessPattern>,
    pub score_threshold: Option<&'a AccessPattern>,
    pub selected: &'a AccessPattern,
    pub shape: &'a AccessPattern,
    pub flags: u32,
    pub max_out_const: u32,
    pub iou_const: f32,
    pub score_const: f32,
}

/// A box as `[x_min, x_max, y_min, y_max]`.
type Extent = [f32; 4];

fn extent(b: [f32; 4], center: bool) -> Extent {
    if center {
        let (hw, hh) = (b[2] / 2.0, b[3] / 2.0);
        [b[0] - hw, b[0] + hw, b[1] - hh, b[1] + hh]
    } else {
        let (x0, x1) = (b[1].min(b[3]), b[1].max(b[3]));
        let (y0, y1) = (b[0].min(b[2]), b[0].max(b[2]));
        [x0, x1, y0, y1]
    }
}

/// Whether `a` and `b` overlap by more than `threshold` (IoU), as the ONNX reference
/// computes it in f32.
fn suppresses(a: &Extent, b: &Extent, threshold: f32) -> bool {
    let (ix0, ix1) = (a[0].max(b[0]), a[1].min(b[1]));
    if ix1 <= ix0 {
        return false;
    }
    let (iy0, iy1) = (a[2].max(b[2]), a[3].min(b[3]));
    if iy1 <= iy0 {
        return false;
    }
    let inter = (ix1 - ix0) * (iy1 - iy0);
    if inter <= 0.0 {
        return false;
    }
    let area_a = (a[1] - a[0]) * (a[3] - a[2]);
    let area_b = (b[1] - b[0]) * (b[3] - b[2]);
    let union = area_a + area_b - inter;
    if area_a <= 0.0 || area_b <= 0.0 || union <= 0.0 {
        return false;
    }
    inter / union > threshold
}

/// Executes `Op::NonMaxSuppression`.
///
/// # Safety
/// Operands inside `mem`, aligned to their element size, shapes and types as the decoder
/// checks.
pub unsafe fn non_max_suppression(
    a: &NmsArgs<'_>,
    mem: DeviceMemory,
    ws: &mut Workspace,
) -> Result<(), KernelError> {
    let vb = View::<f32>::new(a.boxes, mem);
    let vs = View::<f32>::new(a.scores, mem);
    let vsel = View::<i64>::new(a.selected, mem);
    let [_, batches, boxes, _] = vb.shape;
    let classes = vs.shape[2];
    let bound = vsel.shape[2];
    // The scalars: operands read now, else the immediates.
    let max_out = match a.max_out {
        // SAFETY: each present operand is one element inside device memory.
        Some(ap) => unsafe { View::<i64>::new(ap, mem).ptr.read() }.max(0) as u64,
        None => a.max_out_const as u64,
    };
    let iou = match a.iou {
        // SAFETY: as above.
        Some(ap) => unsafe { View::<f32>::new(ap, mem).ptr.read() },
        None => a.iou_const,
    };
    let score_threshold = match a.score_threshold {
        // SAFETY: as above.
        Some(ap) => Some(unsafe { View::<f32>::new(ap, mem).ptr.read() }),
        None if a.flags & nms_flags::SCORE_CONST != 0 => Some(a.score_const),
        None => None,
    };
    let center = a.flags & nms_flags::CENTER_POINT_BOX != 0;
    // Scratch: the candidates of a class (box index, by descending score) and the extents
    // of the boxes selected in it.
    let (ext, cand) = ws.f32_and_words(boxes.saturating_mul(4), boxes)?;
    let mut written = 0usize;
    'all: for b in 0..batches {
        let score = |c: usize, j: u64| {
            // SAFETY: b < batches, c < classes, j < boxes: inside the scores.
            unsafe { vs.at([0, b, c, j as usize]).read() }
        };
        let bx = |j: u64| {
            let mut v = [0f32; 4];
            for (k, x) in v.iter_mut().enumerate() {
                // SAFETY: b < batches, j < boxes, k < 4: inside the boxes.
                *x = unsafe { vb.at([0, b, j as usize, k]).read() };
            }
            v
        };
        for c in 0..classes {
            let mut n = 0usize;
            for j in 0..boxes as u64 {
                if score_threshold.is_none_or(|t| score(c, j) > t) {
                    cand[n] = j;
                    n += 1;
                }
            }
            // Descending score (NaN above every number), equal scores by ascending index.
            cand[..n]
                .sort_unstable_by(|&x, &y| ascending(&score(c, y), &score(c, x)).then(x.cmp(&y)));
            let mut kept = 0usize;
            for &j in &cand[..n] {
                if kept as u64 >= max_out {
                    break;
                }
                let e = extent(bx(j), center);
                let clash = (0..kept).any(|k| {
                    let s = [ext[4 * k], ext[4 * k + 1], ext[4 * k + 2], ext[4 * k + 3]];
                    suppresses(&e, &s, iou)
                });
                if clash {
                    continue;
                }
                if written == bound {
                    break 'all;
                }
                ext[4 * kept..4 * kept + 4].copy_from_slice(&e);
                kept += 1;
                for (k, v) in [b as i64, c as i64, j as i64].into_iter().enumerate() {
                    // SAFETY: written < bound: inside the selected operand.
                    unsafe { vsel.at([0, 0, written, k]).write(v) }
                }
                written += 1;
            }
        }
    }
    // SAFETY: the operands are in bounds; the shape operand holds 2 values.
    unsafe {
        zero_from(&vsel, 3 * written);
        write_shape(a.shape, &[written as u64, 3], mem);
    }
    Ok(())
}

impl Execute for op::NonZero {
    unsafe fn execute(&self, mem: DeviceMemory, _ws: &mut Workspace) -> Result<(), KernelError> {
        // The caller guarantees every operand in bounds and aligned ([`crate::execute`]).
        let op::NonZero {
            input,
            output,
            shape,
        } = self;

        // SAFETY: see above.
        unsafe { non_zero(input, output, shape, mem) }
    }
}

impl Execute for op::Unique {
    unsafe fn execute(&self, mem: DeviceMemory, ws: &mut Workspace) -> Result<(), KernelError> {
        // The caller guarantees every operand in bounds and aligned ([`crate::execute`]).
        let op::Unique {
            input,
            y,
            indices,
            inverse,
            counts,
            shape,
            dims,
            sorted,
        } = self;

        let args = UniqueArgs {
            input,
            y,
            indices,
            inverse,
            counts,
            shape,
            dims,
            sorted: *sorted,
        };
        // SAFETY: see above.
        unsafe { unique(&args, mem, ws) }
    }
}

impl Execute for op::NonMaxSuppression {
    unsafe fn execute(&self, mem: DeviceMemory, ws: &mut Workspace) -> Result<(), KernelError> {
        // The caller guarantees every operand in bounds and aligned ([`crate::execute`]).
        let op::NonMaxSuppression {
            boxes,
            scores,
            max_out,
            iou,
            score_threshold,
            selected,
            shape,
            flags,
            max_out_const,
            iou_const,
            score_const,
        } = self;

        let args = NmsArgs {
            boxes,
            scores,
            max_out: max_out.as_ref(),
            iou: iou.as_ref(),
            score_threshold: score_threshold.as_ref(),
            selected,
            shape,
            flags: *flags,
            max_out_const: *max_out_const,
            iou_const: *iou_const,
            score_const: *score_const,
        };
        // SAFETY: see above.
        unsafe { non_max_suppression(&args, mem, ws) }
    }
}
