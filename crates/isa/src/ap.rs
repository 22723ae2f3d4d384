//! Access patterns: how an instruction addresses a tensor in device memory.

use crate::error::{DecodeError, Reason};
use nrt_hal::{DType, DevAddr};

/// Maximum rank of an access pattern. Higher-rank tensors are handled by the compiler, which
/// merges contiguous dimensions and loops over the rest.
pub const MAX_DIMS: usize = 4;

/// Encoded size of an [`AccessPattern`].
pub const AP_SIZE: usize = 48;

/// Bytes touched as rows: `lo + r·period + [0, width)` for `r` in `0..rows`, relative to an
/// access pattern's address (`period` is 0 when `rows` is 1). `i128` like
/// [`AccessPattern::byte_extent`]: exact for every representable view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteRows {
    /// First byte of the first row.
    pub lo: i128,
    /// Number of rows (≥ 1).
    pub rows: i128,
    /// Bytes from one row's start to the next.
    pub period: i128,
    /// Bytes per row.
    pub width: i128,
}

impl ByteRows {
    /// One contiguous range `[lo, hi)`.
    pub fn range(lo: i128, hi: i128) -> ByteRows {
        ByteRows {
            lo,
            rows: 1,
            period: 0,
            width: hi - lo,
        }
    }

    /// `[lowest, end)` of the rows.
    pub fn extent(&self) -> (i128, i128) {
        (
            self.lo,
            self.lo + (self.rows - 1) * self.period + self.width,
        )
    }

    /// The same rows `by` bytes further.
    pub fn shifted(self, by: i128) -> ByteRows {
        ByteRows {
            lo: self.lo + by,
            ..self
        }
    }

    /// Whether the two sets of rows may share a byte. Exact for rows of the same period
    /// (or one single row no wider than the other's period); otherwise whether the extents
    /// overlap.
    pub fn may_overlap(&self, o: &ByteRows) -> bool {
        let (a, b) = (self.extent(), o.extent());
        if self.width <= 0 || o.width <= 0 || a.0 >= b.1 || b.0 >= a.1 {
            return false;
        }
        let period = match (self.rows, o.rows) {
            (1, 1) => return true,
            (1, _) if self.width <= o.period => o.period,
            (_, 1) if o.width <= self.period => self.period,
            _ if self.period == o.period => self.period,
            _ => return true,
        };
        if period <= 0 {
            return true;
        }
        // Row r of self meets row q of o iff d − self.width < (r − q)·period < d + o.width
        // with d = o.lo − self.lo; k = r − q ranges over (−o.rows, self.rows).
        let d = o.lo - self.lo;
        let k_lo = (d - self.width).div_euclid(period) + 1;
        let k_hi = (d + o.width - 1).div_euclid(period);
        k_lo.max(1 - o.rows) <= k_hi.min(self.rows - 1)
    }
}

/// A strided view of device memory: a base address, an element type, a 4-D shape and element
/// strides per dimension. A stride of 0 broadcasts that dimension; a negative stride walks it
/// backwards (the base is then the address of element `[0,0,0,0]`, not the lowest address).
///
/// Lower-rank tensors use leading dimensions of size 1.
///
/// | offset | size | field |
/// |---:|---:|---|
/// | 0 | 8 | `addr` — device PA of element `[0,0,0,0]` (the field relocations patch) |
/// | 8 | 1 | `dtype` — [`DType`] code |
/// | 9 | 7 | reserved, 0 |
/// | 16 | 16 | `shape[4]` — `u32` sizes |
/// | 32 | 16 | `stride[4]` — `i32` element strides |
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AccessPattern {
    /// Device physical address of element `[0,0,0,0]`.
    pub addr: DevAddr,
    /// Element type.
    pub dtype: DType,
    /// Sizes of the four dimensions.
    pub shape: [u32; MAX_DIMS],
    /// Element strides of the four dimensions.
    pub stride: [i32; MAX_DIMS],
}

impl AccessPattern {
    /// A dense row-major view of `shape` at `addr` (shape padded with leading 1s).
    pub fn dense(addr: DevAddr, dtype: DType, shape: &[u32]) -> AccessPattern {
        assert!(shape.len() <= MAX_DIMS, "rank {} > {MAX_DIMS}", shape.len());
        let mut s = [1u32; MAX_DIMS];
        s[MAX_DIMS - shape.len()..].copy_from_slice(shape);
        AccessPattern {
            addr,
            dtype,
            shape: s,
            stride: dense_strides(&s),
        }
    }

    /// Number of elements.
    pub fn elements(&self) -> u64 {
        self.shape.iter().map(|&d| d as u64).product()
    }

    /// Whether two of the view's indices may land on one element: a dimension of size > 1
    /// with stride 0, or strides that interleave. Conservative: sorted by `|stride|`, each
    /// dimension's stride must reach past all that the smaller ones span
    /// (`|s_d| ≥ 1 + Σ (n_i − 1)·|s_i|` over the dimensions before it), which every compiled
    /// layout — dense, transposed, sliced, padded, broadcast-free — satisfies; an exotic
    /// interleaving that happens not to collide counts as repeating. Exact (`u128`) on
    /// decoded, untrusted shapes and strides.
    pub fn repeats_elements(&self) -> bool {
        if self.shape.contains(&0) {
            return false;
        }
        let mut dims = [(0u128, 0u128); MAX_DIMS];
        let mut n = 0;
        for d in 0..MAX_DIMS {
            if self.shape[d] > 1 {
                dims[n] = (self.stride[d].unsigned_abs() as u128, self.shape[d] as u128);
                n += 1;
            }
        }
        dims[..n].sort_unstable();
        let mut span = 1u128;
        for &(stride, size) in &dims[..n] {
            if stride < span {
                return true;
            }
            span += (size - 1) * stride;
        }
        false
    }

    /// Whether the view is dense row-major (every element once, in order).
    pub fn is_dense(&self) -> bool {
        let d = dense_strides(&self.shape);
        (0..MAX_DIMS).all(|i| self.shape[i] <= 1 || self.stride[i] == d[i])
    }

    /// The byte range the view touches, relative to `addr`: `(lowest, end)` with `end`
    /// exclusive. `(0, 0)` for an empty view.
    ///
    /// Exact for every representable view: the shape and stride fields come from untrusted
    /// files, and `(2^32 − 1) · 2^31 · 4 dims · 8-byte elements` needs 68 bits, so the
    /// arithmetic is done in `i128`, where it cannot overflow. A caller compares the result
    /// against what the address may reach (also in `i128`) and never narrows it first.
    pub fn byte_extent(&self) -> (i128, i128) {
        if self.shape.contains(&0) {
            return (0, 0);
        }
        let (mut lo, mut hi) = (0i128, 0i128);
        for i in 0..MAX_DIMS {
            let span = (self.shape[i] as i128 - 1) * self.stride[i] as i128;
            if span < 0 {
                lo += span;
            } else {
                hi += span;
            }
        }
        let es = self.dtype.size() as i128;
        (lo * es, (hi + 1) * es)
    }

    /// The bytes the view touches, relative to `addr`, as evenly spaced rows
    /// ([`ByteRows`]): the dimension with the largest stride gives the rows, the others the
    /// width of each. A superset of the touched bytes (within a row every byte between the
    /// first and the last touched one counts), never a subset; tighter than
    /// [`byte_extent`](Self::byte_extent) for a block of columns: the two halves of a
    /// matrix split by columns touch disjoint rows of bytes although their extents overlap.
    /// A view with a negative stride is one row, its extent.
    pub fn byte_rows(&self) -> ByteRows {
        let (lo, hi) = self.byte_extent();
        let one_row = ByteRows {
            lo,
            rows: 1,
            period: 0,
            width: hi - lo,
        };
        if lo == hi || self.stride.iter().any(|&s| s < 0) {
            return one_row;
        }
        let Some(o) = (0..MAX_DIMS)
            .filter(|&i| self.shape[i] > 1 && self.stride[i] > 0)
            .max_by_key(|&i| self.stride[i])
        else {
            return one_row;
        };
        let es = self.dtype.size() as i128;
        let inner: i128 = (0..MAX_DIMS)
            .filter(|&i| i != o)
            .map(|i| (self.shape[i] as i128 - 1) * self.stride[i] as i128)
            .sum();
        ByteRows {
            lo: 0,
            rows: self.shape[o] as i128,
            period: self.stride[o] as i128 * es,
            width: (inner + 1) * es,
        }
    }

    /// Whether the view, placed `off` bytes further, may share a byte with `other` placed
    /// `other_off` bytes further — row by row: each view is cut into rows along its
    /// innermost dimension (the one with the smallest stride), every byte from a row's first
    /// touched byte to its last counts as touched, and the two sorted lists of rows are
    /// compared. Exact up to that (interleaved columns count as overlapping); a view with
    /// more than `max_rows` rows is answered by [`ByteRows::may_overlap`], which also rejects
    /// most disjoint pairs cheaply first. Tells apart the column halves of every head of a
    /// batched `[heads, rows, cols]` product, which one level of rows cannot.
    pub fn may_overlap(
        &self,
        off: i128,
        other: &AccessPattern,
        other_off: i128,
        max_rows: usize,
    ) -> bool {
        let (ra, rb) = (
            self.byte_rows().shifted(off),
            other.byte_rows().shifted(other_off),
        );
        if !ra.may_overlap(&rb) {
            return false;
        }
        let (Some(mut a), Some(mut b)) = (
            self.row_list(off, max_rows),
            other.row_list(other_off, max_rows),
        ) else {
            return true;
        };
        a.sort_unstable();
        b.sort_unstable();
        // Merge sweep over half-open intervals, each list sorted by start; rows of one view
        // may overlap each other, so advance the one that ends first.
        let (mut i, mut j) = (0, 0);
        while i < a.len() && j < b.len() {
            let (x, y) = (a[i], b[j]);
            if x.0 < y.1 && y.0 < x.1 {
                return true;
            }
            if x.1 <= y.1 {
                i += 1;
            } else {
                j += 1;
            }
        }
        false
    }

    /// The rows of the view as byte intervals `[lo, hi)` (unsorted), `off` bytes further;
    /// `None` if there are more than `max_rows` or the view is empty.
    fn row_list(&self, off: i128, max_rows: usize) -> Option<Vec<(i128, i128)>> {
        if self.shape.contains(&0) {
            return None;
        }
        let es = self.dtype.size() as i128;
        let inner = (0..MAX_DIMS)
            .filter(|&i| self.shape[i] > 1 && self.stride[i] != 0)
            .min_by_key(|&i| (self.stride[i] as i64).unsigned_abs());
        let (width, start) = match inner {
            Some(i) => {
                let span = (self.shape[i] as i128 - 1) * self.stride[i] as i128;
                (span.abs() * es + es, span.min(0) * es)
            }
            None => (es, 0),
        };
        let mut count: usize = 1;
        for d in 0..MAX_DIMS {
            if Some(d) != inner && self.stride[d] != 0 {
                count = count.checked_mul(self.shape[d] as usize)?;
            }
        }
        if count > max_rows {
            return None;
        }
        let mut rows = Vec::with_capacity(count);
        rows.push((off + start, off + start + width));
        for d in 0..MAX_DIMS {
            if Some(d) == inner || self.stride[d] == 0 || self.shape[d] == 1 {
                continue;
            }
            let step = self.stride[d] as i128 * es;
            let n = rows.len();
            for k in 1..self.shape[d] as i128 {
                for r in 0..n {
                    let (lo, hi) = rows[r];
                    rows.push((lo + k * step, hi + k * step));
                }
            }
        }
        Some(rows)
    }

    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.addr.to_le_bytes());
        out.push(self.dtype.code());
        out.extend_from_slice(&[0u8; 7]);
        for d in self.shape {
            out.extend_from_slice(&d.to_le_bytes());
        }
        for s in self.stride {
            out.extend_from_slice(&s.to_le_bytes());
        }
    }

    pub(crate) fn decode(b: &[u8], field: &'static str) -> Result<AccessPattern, DecodeError> {
        debug_assert!(b.len() >= AP_SIZE);
        let addr = u64::from_le_bytes(b[0..8].try_into().expect("8 bytes"));
        let dtype = DType::from_code(b[8])
            .ok_or(DecodeError::field(field, Reason::BadDType(b[8])).at(8))?;
        if b[9..16].iter().any(|&x| x != 0) {
            return Err(DecodeError::field(field, Reason::ReservedNonZero).at(9));
        }
        let mut shape = [0u32; MAX_DIMS];
        let mut stride = [0i32; MAX_DIMS];
        for i in 0..MAX_DIMS {
            shape[i] = u32::from_le_bytes(b[16 + 4 * i..20 + 4 * i].try_into().expect("4 bytes"));
            stride[i] = i32::from_le_bytes(b[32 + 4 * i..36 + 4 * i].try_into().expect("4 bytes"));
        }
        let ap = AccessPattern {
            addr,
            dtype,
            shape,
            stride,
        };
        // The element count is bounded (the kernels iterate it); the byte extent may still be
        // far larger than any memory (huge strides), which `byte_extent` reports exactly.
        let elements = shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64));
        if elements.is_none_or(|e| e > MAX_ELEMENTS) {
            return Err(DecodeError::field(field, Reason::TooManyElements).at(16));
        }
        // Where the view lands (in bounds, not below address 0) is checked against what
        // the address means: the container checks each operand against its relocation's
        // plan entry (an unrelocated field is 0, so a negative-stride view legitimately
        // "starts below 0" there), the device against its memory when it loads the block.
        Ok(ap)
    }
}

/// Largest number of elements one access pattern may address (2^40: 4 TiB of fp32, far above
/// any device's memory). It bounds the element count, not the byte extent: strides can still
/// spread a view over ~2^68 bytes, which is why [`AccessPattern::byte_extent`] is `i128`.
pub const MAX_ELEMENTS: u64 = 1 << 40;

/// Most elements a *read* view that repeats elements
/// ([`AccessPattern::repeats_elements`]: a broadcast, stride 0) may address when the
/// instruction writes fewer (2^32). A broadcast read as large as the output it feeds is
/// always allowed; past both, the kernels would iterate elements with no memory behind them
/// (a reduction over a stride-0 axis of 2^40: minutes of work from a 4-byte operand).
pub const MAX_REPEATED_READ_ELEMENTS: u64 = 1 << 32;

/// Row-major element strides of `shape`.
pub fn dense_strides(shape: &[u32; MAX_DIMS]) -> [i32; MAX_DIMS] {
    let mut s = [0i32; MAX_DIMS];
    let mut acc: i64 = 1;
    for i in (0..MAX_DIMS).rev() {
        s[i] = acc.min(i32::MAX as i64) as i32;
        // Saturating: `is_dense` calls this on decoded (untrusted) shapes; 2^32 per dim
        // would overflow `i64` by the fourth dimension.
        acc = acc.saturating_mul(shape[i].max(1) as i64);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_and_extent() {
        let ap = AccessPattern::dense(0x1000, DType::F32, &[2, 3]);
        assert_eq!(ap.shape, [1, 1, 2, 3]);
        assert_eq!(ap.stride, [6, 6, 3, 1]);
        assert!(ap.is_dense());
        assert_eq!(ap.byte_extent(), (0, 24));
        assert_eq!(ap.elements(), 6);
    }

    #[test]
    fn negative_and_broadcast_strides() {
        let ap = AccessPattern {
            addr: 100,
            dtype: DType::F32,
            shape: [1, 1, 4, 3],
            stride: [0, 0, 0, -1],
        };
        assert_eq!(ap.byte_extent(), (-8, 4));
        assert!(!ap.is_dense());
    }

    /// D1: `(2^31 − 1) · i32::MAX · 4` bytes overflowed `i64` and wrapped to a small or
    /// negative extent that passed every bounds check.
    /// `repeats_elements` is sound — a view it passes never puts two indices on one element
    /// (checked by enumerating every index of small views with strides in −4..=4) — and
    /// passes dense, transposed, sliced and reversed views; stride-0 broadcasts repeat.
    #[test]
    fn a_view_that_does_not_repeat_elements_has_distinct_addresses() {
        let mut passed = 0;
        for shape in [[1, 2, 3, 2], [2, 2, 2, 2], [1, 3, 1, 4], [1, 1, 5, 3]] {
            for code in 0..9u32.pow(4) {
                let mut stride = [0i32; 4];
                let mut c = code;
                for s in &mut stride {
                    *s = (c % 9) as i32 - 4;
                    c /= 9;
                }
                let ap = AccessPattern {
                    addr: 0,
                    dtype: DType::F32,
                    shape,
                    stride,
                };
                if ap.repeats_elements() {
                    continue;
                }
                passed += 1;
                let mut seen = std::collections::HashSet::new();
                for i in 0..shape[0] as i64 {
                    for j in 0..shape[1] as i64 {
                        for k in 0..shape[2] as i64 {
                            for l in 0..shape[3] as i64 {
                                let at = [i, j, k, l]
                                    .iter()
                                    .zip(stride)
                                    .map(|(x, s)| x * s as i64)
                                    .sum::<i64>();
                                assert!(seen.insert(at), "{shape:?} {stride:?} repeats");
                            }
                        }
                    }
                }
            }
        }
        assert!(passed > 100, "only {passed} views passed");
        let dense = AccessPattern::dense(0, DType::F32, &[2, 3, 4, 5]);
        assert!(!dense.repeats_elements());
        let transposed = AccessPattern {
            stride: [60, 20, 1, 5],
            shape: [2, 3, 5, 4],
            ..dense
        };
        assert!(!transposed.repeats_elements());
        let sliced = AccessPattern {
            stride: [120, 40, 10, 1],
            ..dense
        };
        assert!(!sliced.repeats_elements());
        let reversed = AccessPattern {
            stride: [60, 20, 5, -1],
            ..dense
        };
        assert!(!reversed.repeats_elements());
        let broadcast = AccessPattern {
            stride: [0, 0, 0, 1],
            ..dense
        };
        assert!(broadcast.repeats_elements());
        let huge = AccessPattern {
            shape: [u32::MAX; 4],
            stride: [i32::MAX, i32::MIN, 1, 0],
            ..dense
        };
        assert!(huge.repeats_elements());
    }

    #[test]
    fn d1_byte_extent_of_huge_strides_is_exact() {
        let ap = AccessPattern {
            addr: 0,
            dtype: DType::F32,
            shape: [1, 1, 1, 1 << 31],
            stride: [0, 0, 0, i32::MAX],
        };
        let span = ((1i128 << 31) - 1) * i32::MAX as i128;
        assert_eq!(ap.byte_extent(), (0, (span + 1) * 4));
        assert!(ap.byte_extent().1 > i64::MAX as i128);
        // Every dimension at its most negative and most positive stride: still exact.
        let ap = AccessPattern {
            addr: 0,
            dtype: DType::I64,
            shape: [u32::MAX; 4],
            stride: [i32::MIN, i32::MAX, i32::MIN, i32::MAX],
        };
        let d = u32::MAX as i128 - 1;
        assert_eq!(
            ap.byte_extent(),
            (
                2 * d * i32::MIN as i128 * 8,
                (2 * d * i32::MAX as i128 + 1) * 8
            )
        );
    }

    /// Every byte an access pattern touches, relative to its address (small views only).
    fn touched(ap: &AccessPattern) -> std::collections::BTreeSet<i128> {
        let es = ap.dtype.size() as i128;
        let mut out = std::collections::BTreeSet::new();
        for a in 0..ap.shape[0] as i128 {
            for b in 0..ap.shape[1] as i128 {
                for c in 0..ap.shape[2] as i128 {
                    for d in 0..ap.shape[3] as i128 {
                        let e = a * ap.stride[0] as i128
                            + b * ap.stride[1] as i128
                            + c * ap.stride[2] as i128
                            + d * ap.stride[3] as i128;
                        out.extend((0..es).map(|x| e * es + x));
                    }
                }
            }
        }
        out
    }

    /// `byte_rows` holds every touched byte, and `may_overlap` never says "disjoint" of two
    /// views that share a byte — and does say it of a matrix's column halves (what lets the
    /// two cores of a split MatMul write their halves in parallel).
    #[test]
    fn byte_rows_cover_and_overlap_is_sound() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u32| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as u32
        };
        let mut disjoint_found = 0;
        for _ in 0..4000 {
            let mut ap = || {
                let mut shape = [1u32; MAX_DIMS];
                let mut stride = [0i32; MAX_DIMS];
                for i in 1..MAX_DIMS {
                    shape[i] = 1 + next(4);
                    stride[i] = next(13) as i32 - if next(8) == 0 { 6 } else { 0 };
                }
                let dtype = [DType::F32, DType::U8, DType::Bf16][next(3) as usize];
                (
                    AccessPattern {
                        addr: 0,
                        dtype,
                        shape,
                        stride,
                    },
                    next(40) as i128,
                )
            };
            let ((a, oa), (b, ob)) = (ap(), ap());
            let (ra, rb) = (a.byte_rows().shifted(oa), b.byte_rows().shifted(ob));
            let ta: std::collections::BTreeSet<i128> = touched(&a).iter().map(|x| x + oa).collect();
            let tb: std::collections::BTreeSet<i128> = touched(&b).iter().map(|x| x + ob).collect();
            for (t, r) in [(&ta, &ra), (&tb, &rb)] {
                for &x in t {
                    let k = if r.period == 0 {
                        0
                    } else {
                        (x - r.lo).div_euclid(r.period)
                    };
                    let k = k.clamp(0, r.rows - 1);
                    let inside = (0..r.rows).any(|q| {
                        let s = r.lo + q * r.period;
                        s <= x && x < s + r.width
                    });
                    assert!(inside, "{x} outside {r:?} (row {k}) of {a:?}/{b:?}");
                }
            }
            let share = ta.intersection(&tb).next().is_some();
            let may = ra.may_overlap(&rb);
            assert!(
                !share || may,
                "{a:?}+{oa} and {b:?}+{ob} share bytes; rows {ra:?} {rb:?}"
            );
            for max_rows in [0, 4, 64] {
                assert!(
                    !share || a.may_overlap(oa, &b, ob, max_rows),
                    "{a:?}+{oa} and {b:?}+{ob} share bytes; row lists say no ({max_rows})"
                );
            }
            let (ea, eb) = (ra.extent(), rb.extent());
            if !may && ea.0 < eb.1 && eb.0 < ea.1 {
                disjoint_found += 1;
            }
        }
        assert!(
            disjoint_found > 0,
            "no interleaved disjoint pair was generated"
        );
        // The column halves of a [64, 512] f32 matrix.
        let half = |col: u64| AccessPattern {
            addr: col * 4,
            dtype: DType::F32,
            shape: [1, 1, 64, 256],
            stride: [0, 0, 512, 1],
        };
        let (l, r) = (half(0).byte_rows(), half(256).byte_rows().shifted(1024));
        assert!(!l.may_overlap(&r) && !r.may_overlap(&l));
        assert!(l.may_overlap(&half(255).byte_rows().shifted(1020)));
        // The column halves of every head of a batched [4, 128, 128] product: one level of
        // rows (the heads) cannot tell them apart, the row lists can.
        let head_half = |col: u64| AccessPattern {
            addr: col * 4,
            dtype: DType::F32,
            shape: [1, 4, 128, 64],
            stride: [0, 128 * 128, 128, 1],
        };
        let (h0, h1) = (head_half(0), head_half(64));
        assert!(h0.byte_rows().may_overlap(&h1.byte_rows().shifted(256)));
        assert!(!h0.may_overlap(0, &h1, 256, 4096));
        assert!(
            h0.may_overlap(0, &h1, 256, 100),
            "too many rows: the cheap answer"
        );
        assert!(h0.may_overlap(0, &h0, 0, 4096));
        // A whole row of the matrix meets both halves.
        let row = ByteRows::range(2048 * 5, 2048 * 6);
        assert!(row.may_overlap(&l) && row.may_overlap(&r) && l.may_overlap(&row));
    }
}
