//! View algebra: a value's location is a strided [`View`]; views become access patterns
//! ([`mk_ap`]) after their dimensions are merged and looped ([`simplify`]).

use crate::error::{CompileError, ErrorKind, Result};
use crate::eval::dense_strides;
use crate::tensor::{HostTensor, f32_to_f16};
use nrt_hal::DType;
use nrt_isa::AccessPattern;

/// Plan-entry ids from here up name temporaries until the planner places them.
pub(crate) const TEMP_BASE: u32 = 1 << 20;

pub(crate) type Simplified = (Vec<usize>, Vec<Vec<i64>>, Vec<Vec<i64>>);

/// A strided view of a tensor: virtual address of element 0, element strides.
#[derive(Clone, Debug)]
pub(crate) struct View {
    pub(crate) addr: u64,
    pub(crate) dtype: DType,
    pub(crate) shape: Vec<usize>,
    pub(crate) strides: Vec<i64>,
}

impl View {
    /// The access pattern of this view (rank ≤ 4).
    pub(crate) fn ap(&self) -> Result<AccessPattern> {
        mk_ap(self.addr, self.dtype, &self.shape, &self.strides)
    }

    pub(crate) fn dense(addr: u64, dtype: DType, shape: &[usize]) -> View {
        View {
            addr,
            dtype,
            shape: shape.to_vec(),
            strides: dense_strides(shape),
        }
    }

    pub(crate) fn elems(&self, n: i64) -> u64 {
        (self.addr as i64 + n * self.dtype.size() as i64) as u64
    }

    /// Right-aligned broadcast to `shape`. Leading dimensions of this view past `shape`'s
    /// rank are dropped (they must be 1: a `[1]` constant broadcast to a scalar's `[]`).
    pub(crate) fn broadcast(&self, shape: &[usize]) -> View {
        let off = shape.len().saturating_sub(self.shape.len());
        let dropped = self.shape.len().saturating_sub(shape.len());
        debug_assert!(self.shape[..dropped].iter().all(|&d| d == 1));
        let strides = (0..shape.len())
            .map(|i| {
                if i < off || self.shape[i - off + dropped] == 1 {
                    0
                } else {
                    self.strides[i - off + dropped]
                }
            })
            .collect();
        View {
            addr: self.addr,
            dtype: self.dtype,
            shape: shape.to_vec(),
            strides,
        }
    }

    pub(crate) fn permute(&self, perm: &[usize]) -> View {
        View {
            addr: self.addr,
            dtype: self.dtype,
            shape: perm.iter().map(|&p| self.shape[p]).collect(),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
        }
    }

    /// Whether the view is dense row-major (dimensions of size 1 aside).
    pub(crate) fn is_dense(&self) -> bool {
        let d = dense_strides(&self.shape);
        (0..self.shape.len()).all(|i| self.shape[i] <= 1 || self.strides[i] == d[i])
    }

    /// The same elements in row-major order as `shape`, without copying, when the strides
    /// allow it (dimensions that merge or split must be contiguous with each other).
    pub(crate) fn reshape(&self, shape: &[usize]) -> Option<View> {
        let total: usize = self.shape.iter().product();
        if shape.iter().product::<usize>() != total {
            return None;
        }
        if total == 0 || self.is_dense() {
            return Some(View::dense(self.addr, self.dtype, shape));
        }
        // Old dims without the 1s, then groups of old and new dims of equal products.
        let old: Vec<(usize, i64)> = (0..self.shape.len())
            .filter(|&i| self.shape[i] != 1)
            .map(|i| (self.shape[i], self.strides[i]))
            .collect();
        let mut strides = vec![0i64; shape.len()];
        let (mut oi, mut ni) = (0usize, 0usize);
        while ni < shape.len() || oi < old.len() {
            // Size-1 new dims take any stride.
            if ni < shape.len() && shape[ni] == 1 {
                strides[ni] = 0;
                ni += 1;
                continue;
            }
            if oi >= old.len() || ni >= shape.len() {
                return None;
            }
            let (o0, n0) = (oi, ni);
            let (mut po, mut pn) = (old[oi].0, shape[ni]);
            oi += 1;
            ni += 1;
            while po != pn {
                if po < pn {
                    po *= old.get(oi)?.0;
                    oi += 1;
                } else {
                    pn *= *shape.get(ni)?;
                    ni += 1;
                }
            }
            // The old dims of the group must be contiguous with each other.
            for k in o0..oi - 1 {
                if old[k].1 != old[k + 1].1 * old[k + 1].0 as i64 {
                    return None;
                }
            }
            let mut st = old[oi - 1].1;
            for k in (n0..ni).rev() {
                strides[k] = st;
                st *= shape[k] as i64;
            }
        }
        Some(View {
            addr: self.addr,
            dtype: self.dtype,
            shape: shape.to_vec(),
            strides,
        })
    }

    /// Elements `start, start+step, …` (`len` of them) along `axis`.
    pub(crate) fn slice(&self, axis: usize, start: i64, len: usize, step: i64) -> View {
        let mut v = self.clone();
        v.addr = self.elems(start * self.strides[axis]);
        v.shape[axis] = len;
        v.strides[axis] = self.strides[axis] * step;
        v
    }
}

pub(crate) fn too_large(what: &str) -> CompileError {
    CompileError::new(
        ErrorKind::TooLarge,
        format!("{what} exceeds what an access pattern can address"),
    )
}

/// An access pattern from up to 4 dims (right-aligned).
/// [`mk_ap`] over a dense (row-major, contiguous) `shape`.
pub(crate) fn dense_ap(addr: u64, dtype: DType, shape: &[usize]) -> Result<AccessPattern> {
    let mut strides = vec![1i64; shape.len()];
    for i in (1..shape.len()).rev() {
        strides[i - 1] = strides[i] * shape[i] as i64;
    }
    mk_ap(addr, dtype, shape, &strides)
}

pub(crate) fn mk_ap(
    addr: u64,
    dtype: DType,
    shape: &[usize],
    strides: &[i64],
) -> Result<AccessPattern> {
    if shape.len() > 4 {
        return Err(CompileError::new(
            ErrorKind::Internal,
            "access pattern of rank > 4",
        ));
    }
    let mut s = [1u32; 4];
    let mut st = [0i32; 4];
    let off = 4 - shape.len();
    for i in 0..shape.len() {
        s[off + i] = u32::try_from(shape[i]).map_err(|_| too_large("a dimension"))?;
        st[off + i] = i32::try_from(strides[i]).map_err(|_| too_large("a stride"))?;
    }
    Ok(AccessPattern {
        addr,
        dtype,
        shape: s,
        stride: st,
    })
}

pub(crate) fn simplify(shape: &[usize], strides: &[Vec<i64>], max: usize) -> Simplified {
    let nv = strides.len();
    if shape.contains(&0) {
        return (Vec::new(), vec![Vec::new(); nv], Vec::new());
    }
    let mut dims: Vec<(usize, Vec<i64>)> = Vec::new();
    for i in 0..shape.len() {
        if shape[i] == 1 {
            continue;
        }
        let st: Vec<i64> = strides.iter().map(|s| s[i]).collect();
        if let Some(last) = dims.last_mut()
            && (0..nv).all(|v| last.1[v] == st[v] * shape[i] as i64)
        {
            last.0 *= shape[i];
            last.1 = st;
            continue;
        }
        dims.push((shape[i], st));
    }
    let split = dims.len().saturating_sub(max);
    let (outer, inner) = dims.split_at(split);
    let mut offsets = vec![vec![0i64; nv]];
    for (size, st) in outer {
        let mut next = Vec::with_capacity(offsets.len() * size);
        for o in &offsets {
            for k in 0..*size as i64 {
                next.push((0..nv).map(|v| o[v] + k * st[v]).collect());
            }
        }
        offsets = next;
    }
    let shape_out = inner.iter().map(|d| d.0).collect();
    let strides_out = (0..nv)
        .map(|v| inner.iter().map(|d| d.1[v]).collect())
        .collect();
    (shape_out, strides_out, offsets)
}

pub(crate) fn fill_bits(dtype: DType, value: f64) -> u64 {
    let t = HostTensor::from_f64s(dtype, vec![1], std::iter::once(value));
    let b = t.to_bytes();
    let mut w = [0u8; 8];
    w[..b.len()].copy_from_slice(&b);
    if dtype == DType::F16 {
        return f32_to_f16(value as f32) as u64;
    }
    u64::from_le_bytes(w)
}
