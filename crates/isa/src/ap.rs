//! Access patterns: how an instruction addresses a tensor in device memory.

use crate::error::{DecodeError, Reason};
use nrt_hal::{DType, DevAddr};

/// Maximum rank of an access pattern. Higher-rank tensors are handled by the compiler, which
/// merges contiguous dimensions and loops over the rest.
pub const MAX_DIMS: usize = 4;

/// Encoded size of an [`AccessPattern`].
pub const AP_SIZE: usize = 48;

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
}
