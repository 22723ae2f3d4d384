//! Test support: a host arena standing in for device memory, random layouts (permuted,
//! padded, negative and broadcast strides) and element access through access patterns.

#![allow(dead_code)]
// Reference code indexes dimensions explicitly: clearer than iterator chains here.
#![allow(clippy::needless_range_loop)]

pub mod reference;

use nrt_hal::DType;
use nrt_isa::AccessPattern;
use nrt_kernels::{DeviceMemory, KernelError, Workspace, execute};

/// A small deterministic RNG (xorshift64*), seeded by proptest.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15 | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 > 1.0 - p
    }
    /// Uniform f32 in [lo, hi).
    pub fn f32(&mut self, lo: f32, hi: f32) -> f32 {
        let u = (self.next() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * u
    }
}

/// Host memory standing in for the device's, 8-byte aligned.
pub struct Arena {
    words: Vec<u64>,
    next: u64,
}

impl Arena {
    pub fn new(bytes: usize) -> Self {
        Arena {
            words: vec![0; bytes.div_ceil(8)],
            next: 64,
        }
    }

    pub fn len(&self) -> u64 {
        self.words.len() as u64 * 8
    }

    pub fn bytes(&mut self) -> &mut [u8] {
        let n = self.words.len() * 8;
        // SAFETY: u64 storage viewed as bytes.
        unsafe { core::slice::from_raw_parts_mut(self.words.as_mut_ptr() as *mut u8, n) }
    }

    pub fn mem(&mut self) -> DeviceMemory {
        let len = self.len();
        // SAFETY: the arena outlives every use within a test.
        unsafe { DeviceMemory::new(self.words.as_mut_ptr() as *mut u8, len) }
    }

    /// Reserves `bytes` (8-aligned) and returns the address.
    pub fn alloc(&mut self, bytes: u64) -> u64 {
        let a = self.next;
        self.next = (self.next + bytes).div_ceil(8) * 8 + 8;
        assert!(self.next <= self.len(), "arena too small");
        a
    }

    /// Places an access pattern with the given strides so its whole extent is inside.
    pub fn place(&mut self, dtype: DType, shape: [u32; 4], stride: [i32; 4]) -> AccessPattern {
        let mut ap = AccessPattern {
            addr: 0,
            dtype,
            shape,
            stride,
        };
        let (lo, hi) = ap.byte_extent();
        let base = self.alloc((hi - lo).max(0) as u64 + 8);
        ap.addr = (base as i128 - lo) as u64;
        ap
    }

    /// A dense tensor.
    pub fn dense(&mut self, dtype: DType, shape: [u32; 4]) -> AccessPattern {
        self.place(dtype, shape, nrt_isa::dense_strides(&shape))
    }

    /// A random layout of `shape`: dimensions nested in a random order, gaps, reversed
    /// dimensions, and (if `broadcast`) stride-0 dimensions.
    pub fn random(
        &mut self,
        rng: &mut Rng,
        dtype: DType,
        shape: [u32; 4],
        broadcast: bool,
    ) -> AccessPattern {
        // A third of the time dense: the kernels' fast paths need dense operands, which the
        // random choices below rarely produce for several operands at once.
        if rng.chance(0.33) {
            return self.dense(dtype, shape);
        }
        let mut order = [0usize, 1, 2, 3];
        if rng.chance(0.5) {
            for i in (1..4).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                order.swap(i, j);
            }
        }
        let mut stride = [0i32; 4];
        let mut acc: i64 = if rng.chance(0.2) { 2 } else { 1 };
        for &d in order.iter().rev() {
            stride[d] = acc as i32;
            let gap = if rng.chance(0.2) { 1 } else { 0 };
            acc *= shape[d].max(1) as i64 + gap;
        }
        for d in 0..4 {
            if rng.chance(0.15) {
                stride[d] = -stride[d];
            }
            if broadcast && rng.chance(0.2) {
                stride[d] = 0;
            }
        }
        self.place(dtype, shape, stride)
    }

    fn addr_of(&self, ap: &AccessPattern, idx: [usize; 4]) -> usize {
        let mut off = 0i64;
        for d in 0..4 {
            off += idx[d] as i64 * ap.stride[d] as i64;
        }
        (ap.addr as i64 + off * ap.dtype.size() as i64) as usize
    }

    pub fn get_raw(&mut self, ap: &AccessPattern, idx: [usize; 4]) -> u64 {
        let a = self.addr_of(ap, idx);
        let n = ap.dtype.size();
        let b = &self.bytes()[a..a + n];
        let mut v = [0u8; 8];
        v[..n].copy_from_slice(b);
        u64::from_le_bytes(v)
    }

    pub fn set_raw(&mut self, ap: &AccessPattern, idx: [usize; 4], bits: u64) {
        let a = self.addr_of(ap, idx);
        let n = ap.dtype.size();
        self.bytes()[a..a + n].copy_from_slice(&bits.to_le_bytes()[..n]);
    }

    pub fn get_f32(&mut self, ap: &AccessPattern, idx: [usize; 4]) -> f32 {
        f32::from_bits(self.get_raw(ap, idx) as u32)
    }

    pub fn set_f32(&mut self, ap: &AccessPattern, idx: [usize; 4], v: f32) {
        self.set_raw(ap, idx, v.to_bits() as u64)
    }

    /// Fills every element of `ap` (broadcast elements once each) with `f()`.
    pub fn fill_with(&mut self, ap: &AccessPattern, mut f: impl FnMut() -> u64) {
        for idx in indices(ap.shape) {
            let v = f();
            self.set_raw(ap, idx, v);
        }
    }

    pub fn fill_f32(&mut self, ap: &AccessPattern, rng: &mut Rng, lo: f32, hi: f32) {
        self.fill_with(ap, || rng.f32(lo, hi).to_bits() as u64);
    }

    /// All elements of `ap` in row-major index order.
    pub fn read_f32(&mut self, ap: &AccessPattern) -> Vec<f32> {
        indices(ap.shape).map(|i| self.get_f32(ap, i)).collect()
    }

    pub fn read_raw(&mut self, ap: &AccessPattern) -> Vec<u64> {
        indices(ap.shape).map(|i| self.get_raw(ap, i)).collect()
    }

    pub fn run(&mut self, op: &nrt_isa::Op, ws: &mut Workspace) -> Result<(), KernelError> {
        let mem = self.mem();
        // SAFETY: every operand was placed inside the arena, aligned.
        unsafe { execute(op, mem, ws) }
    }
}

/// Every index of `shape` in row-major order.
pub fn indices(shape: [u32; 4]) -> impl Iterator<Item = [usize; 4]> {
    let s = shape.map(|d| d as usize);
    let total: usize = s.iter().product();
    (0..total).map(move |mut k| {
        let mut idx = [0usize; 4];
        for d in (0..4).rev() {
            idx[d] = k % s[d];
            k /= s[d];
        }
        idx
    })
}

/// Whether `got` is within `atol + rtol·|want|` of `want` (NaN matches NaN, infinities
/// match exactly).
pub fn close(got: f32, want: f64, rtol: f64, atol: f64) -> bool {
    if want.is_nan() {
        return got.is_nan();
    }
    if want.is_infinite() {
        return got as f64 == want;
    }
    ((got as f64) - want).abs() <= atol + rtol * want.abs()
}

pub fn assert_close(got: &[f32], want: &[f64], rtol: f64, atol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            close(*g, *w, rtol, atol),
            "{what}: element {i}: got {g}, want {w}"
        );
    }
}

/// A random shape with `dims` non-trivial trailing dimensions of size 1..=max (sometimes 0
/// when `zero`).
pub fn random_shape(rng: &mut Rng, max: [u32; 4], zero: bool) -> [u32; 4] {
    let mut s = [1u32; 4];
    for d in 0..4 {
        s[d] = 1 + rng.below(max[d] as u64) as u32;
    }
    if zero && rng.chance(0.05) {
        s[rng.below(4) as usize] = 0;
    }
    s
}

/// erf in f64: series for |x| < 3, continued fraction beyond.
pub fn erf64(x: f64) -> f64 {
    let a = x.abs();
    let v = if a < 3.0 {
        let mut term = a;
        let mut sum = a;
        let mut n = 0.0;
        loop {
            n += 1.0;
            term *= -a * a / n;
            let t = term / (2.0 * n + 1.0);
            sum += t;
            if t.abs() <= 1e-17 * sum.abs() {
                break;
            }
        }
        sum * 2.0 / core::f64::consts::PI.sqrt()
    } else {
        let mut f = a;
        for k in (1..60).rev() {
            f = a + (k as f64 / 2.0) / f;
        }
        1.0 - (-a * a).exp() / core::f64::consts::PI.sqrt() / f
    };
    v.copysign(x)
}
