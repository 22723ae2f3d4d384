//! `Binary`, `TensorScalar` and `Select`: elementwise arithmetic, comparison, logic and
//! selection with broadcasting by stride 0.
//!
//! The operation and element type are matched once per call; each pair monomorphizes a
//! slice loop (`o[i] = f(a[i], b[i])`) run by the chunked drivers of [`crate::strided`].
//! Semantics:
//! - f32 follows IEEE; `max`/`min` propagate NaN (numpy `maximum`/`minimum`, ONNX `Max`);
//!   `pow` is `powf`, with fast paths for a broadcast exponent of 1, 2, 0.5 and -1;
//! - i32/i64 wrap on overflow; division truncates toward zero and `x / 0` is 0 (no trap:
//!   ONNX leaves it undefined); `pow` multiplies repeatedly (by squaring), and a negative
//!   exponent gives the truncated `1 / a^|b|` (so 0 unless |a| = 1);
//! - comparisons write bool (0/1 bytes); `and`/`or` treat any non-zero byte as true;
//! - bitwise operations and shifts take i32/i64 as their bits; shifts are logical and an
//!   amount outside `0..width` gives 0.

use crate::strided::{In, View, map1, map2, map3};
use crate::{DeviceMemory, KernelError};
use crate::{Execute, Workspace};
use nrt_hal::DType;
use nrt_isa::op;
use nrt_isa::{AccessPattern, BinaryOp};

/// Numeric element types of the DVE.
pub trait Num: Copy + PartialOrd + 'static {
    /// `a + b`.
    fn add(a: Self, b: Self) -> Self;
    /// `a − b`.
    fn sub(a: Self, b: Self) -> Self;
    /// `a · b`.
    fn mul(a: Self, b: Self) -> Self;
    /// `a / b`.
    fn div(a: Self, b: Self) -> Self;
    /// `a^b`.
    fn pow(a: Self, b: Self) -> Self;
    /// NaN-propagating max.
    #[inline(always)]
    fn max(a: Self, b: Self) -> Self {
        #[allow(clippy::eq_op)]
        if a > b || a != a { a } else { b }
    }
    /// NaN-propagating min.
    #[inline(always)]
    fn min(a: Self, b: Self) -> Self {
        #[allow(clippy::eq_op)]
        if a < b || a != a { a } else { b }
    }
}

impl Num for f32 {
    #[inline(always)]
    fn add(a: f32, b: f32) -> f32 {
        a + b
    }
    #[inline(always)]
    fn sub(a: f32, b: f32) -> f32 {
        a - b
    }
    #[inline(always)]
    fn mul(a: f32, b: f32) -> f32 {
        a * b
    }
    #[inline(always)]
    fn div(a: f32, b: f32) -> f32 {
        a / b
    }
    #[inline(always)]
    fn pow(a: f32, b: f32) -> f32 {
        a.powf(b)
    }
}

macro_rules! int_num {
    ($($t:ty),*) => {$(
        impl Num for $t {
            #[inline(always)]
            fn add(a: $t, b: $t) -> $t { a.wrapping_add(b) }
            #[inline(always)]
            fn sub(a: $t, b: $t) -> $t { a.wrapping_sub(b) }
            #[inline(always)]
            fn mul(a: $t, b: $t) -> $t { a.wrapping_mul(b) }
            #[inline(always)]
            fn div(a: $t, b: $t) -> $t { if b == 0 { 0 } else { a.wrapping_div(b) } }
            #[inline(always)]
            fn pow(a: $t, b: $t) -> $t {
                if b < 0 {
                    return match a { 1 => 1, -1 => if b & 1 == 0 { 1 } else { -1 }, _ => 0 };
                }
                let (mut base, mut e, mut r) = (a, b, 1 as $t);
                while e > 0 {
                    if e & 1 == 1 { r = r.wrapping_mul(base); }
                    base = base.wrapping_mul(base);
                    e >>= 1;
                }
                r
            }
        }
    )*};
}
int_num!(i32, i64);

/// `out = f(a, b)` elementwise.
///
/// # Safety
/// Operands inside `mem`, aligned to their element size.
unsafe fn zip<T: Copy, O: Copy>(
    a: &AccessPattern,
    b: &AccessPattern,
    out: &AccessPattern,
    mem: DeviceMemory,
    f: impl Fn(T, T) -> O + Copy,
) {
    // SAFETY: the caller's contract; overlapping inputs are flagged for buffering.
    unsafe {
        map2(
            In::<T>::new(a, out, mem),
            In::<T>::new(b, out, mem),
            View::<O>::new(out, mem),
            |a, b, o| {
                for ((o, a), b) in o.iter_mut().zip(a).zip(b) {
                    *o = f(*a, *b);
                }
            },
        )
    }
}

/// `out = f(a)` elementwise.
///
/// # Safety
/// As [`zip`].
unsafe fn each<T: Copy, O: Copy>(
    a: &AccessPattern,
    out: &AccessPattern,
    mem: DeviceMemory,
    f: impl Fn(T) -> O + Copy,
) {
    // SAFETY: the caller's contract.
    unsafe {
        map1(
            In::<T>::new(a, out, mem),
            View::<O>::new(out, mem),
            |a, o| {
                for (o, a) in o.iter_mut().zip(a) {
                    *o = f(*a);
                }
            },
        )
    }
}

/// The value of `ap` if it is one element broadcast everywhere (every stride 0 or size 1).
///
/// # Safety
/// `ap` inside `mem`, aligned.
unsafe fn broadcast_scalar<T: Copy>(ap: &AccessPattern, mem: DeviceMemory) -> Option<T> {
    let scalar = (0..4).all(|d| ap.shape[d] <= 1 || ap.stride[d] == 0);
    // SAFETY: element [0,0,0,0] lies inside the operand (the caller's contract).
    (scalar && ap.elements() > 0).then(|| unsafe { (mem.ptr(ap.addr) as *const T).read() })
}

/// # Safety
/// As [`zip`].
unsafe fn numeric<T: Num>(
    a: &AccessPattern,
    b: &AccessPattern,
    out: &AccessPattern,
    op: BinaryOp,
    mem: DeviceMemory,
) -> Result<(), KernelError> {
    // SAFETY: (every arm) the caller's contract.
    unsafe {
        match op {
            BinaryOp::Add => zip(a, b, out, mem, T::add),
            BinaryOp::Sub => zip(a, b, out, mem, T::sub),
            BinaryOp::Mul => zip(a, b, out, mem, T::mul),
            BinaryOp::Div => zip(a, b, out, mem, T::div),
            BinaryOp::Max => zip(a, b, out, mem, T::max),
            BinaryOp::Min => zip(a, b, out, mem, T::min),
            BinaryOp::Pow => zip(a, b, out, mem, T::pow),
            BinaryOp::Equal => zip(a, b, out, mem, |x: T, y: T| (x == y) as u8),
            BinaryOp::Less => zip(a, b, out, mem, |x: T, y: T| (x < y) as u8),
            BinaryOp::Greater => zip(a, b, out, mem, |x: T, y: T| (x > y) as u8),
            BinaryOp::And | BinaryOp::Or => {
                return Err(KernelError::Unsupported("logical op on numbers"));
            }
            BinaryOp::BitAnd
            | BinaryOp::BitOr
            | BinaryOp::BitXor
            | BinaryOp::ShiftLeft
            | BinaryOp::ShiftRight => {
                return Err(KernelError::Unsupported("bitwise op on floats"));
            }
        }
    }
    Ok(())
}

/// Executes `Op::Binary`.
///
/// # Safety
/// Operands inside `mem`, aligned to their element size.
pub unsafe fn binary(
    a: &AccessPattern,
    b: &AccessPattern,
    out: &AccessPattern,
    op: BinaryOp,
    mem: DeviceMemory,
) -> Result<(), KernelError> {
    if out.elements() == 0 {
        return Ok(());
    }
    // SAFETY: (every arm) the caller's contract.
    unsafe {
        if op.is_logical() {
            match op {
                BinaryOp::And => zip(a, b, out, mem, |x: u8, y: u8| (x != 0 && y != 0) as u8),
                _ => zip(a, b, out, mem, |x: u8, y: u8| (x != 0 || y != 0) as u8),
            }
            return Ok(());
        }
        if op.is_bitwise() {
            return match a.dtype {
                DType::I32 => {
                    bitwise::<i32, u32>(a, b, out, op, mem);
                    Ok(())
                }
                DType::I64 => {
                    bitwise::<i64, u64>(a, b, out, op, mem);
                    Ok(())
                }
                _ => Err(KernelError::Unsupported("bitwise element type")),
            };
        }
        match a.dtype {
            DType::F32 => {
                if op == BinaryOp::Pow
                    && let Some(e) = broadcast_scalar::<f32>(b, mem)
                {
                    return {
                        pow_scalar_exponent(a, out, e, mem);
                        Ok(())
                    };
                }
                numeric::<f32>(a, b, out, op, mem)
            }
            DType::I32 => numeric::<i32>(a, b, out, op, mem),
            DType::I64 => numeric::<i64>(a, b, out, op, mem),
            _ => Err(KernelError::Unsupported("binary element type")),
        }
    }
}

/// Integers of the DVE as their bits (`U` the unsigned type of `S`'s width).
trait Bits<U>: Copy {
    fn to_bits(self) -> U;
    fn from_bits(u: U) -> Self;
    /// The shift amount `self`, when it is in `0..width`.
    fn shift(self) -> Option<u32>;
}

macro_rules! bits {
    ($($s:ty => $u:ty),*) => {$(
        impl Bits<$u> for $s {
            #[inline(always)]
            fn to_bits(self) -> $u { self as $u }
            #[inline(always)]
            fn from_bits(u: $u) -> $s { u as $s }
            #[inline(always)]
            fn shift(self) -> Option<u32> {
                (0..<$u>::BITS as $s).contains(&self).then_some(self as u32)
            }
        }
    )*};
}
bits!(i32 => u32, i64 => u64);

/// Bitwise operations and shifts on the bits of `S` (shifts are logical; an amount that is
/// negative or at least the width gives 0).
///
/// # Safety
/// As [`zip`].
unsafe fn bitwise<S, U>(
    a: &AccessPattern,
    b: &AccessPattern,
    out: &AccessPattern,
    op: BinaryOp,
    mem: DeviceMemory,
) where
    S: Bits<U>,
    U: Copy
        + core::ops::BitAnd<Output = U>
        + core::ops::BitOr<Output = U>
        + core::ops::BitXor<Output = U>
        + core::ops::Shl<u32, Output = U>
        + core::ops::Shr<u32, Output = U>
        + Default,
{
    // SAFETY: (every arm) the caller's contract.
    unsafe {
        match op {
            BinaryOp::BitAnd => zip(a, b, out, mem, |x: S, y: S| {
                S::from_bits(x.to_bits() & y.to_bits())
            }),
            BinaryOp::BitOr => zip(a, b, out, mem, |x: S, y: S| {
                S::from_bits(x.to_bits() | y.to_bits())
            }),
            BinaryOp::BitXor => zip(a, b, out, mem, |x: S, y: S| {
                S::from_bits(x.to_bits() ^ y.to_bits())
            }),
            BinaryOp::ShiftLeft => zip(a, b, out, mem, |x: S, y: S| {
                S::from_bits(y.shift().map_or(U::default(), |k| x.to_bits() << k))
            }),
            _ => zip(a, b, out, mem, |x: S, y: S| {
                S::from_bits(y.shift().map_or(U::default(), |k| x.to_bits() >> k))
            }),
        }
    }
}

/// `out = a^e` for one exponent.
///
/// # Safety
/// As [`zip`].
unsafe fn pow_scalar_exponent(a: &AccessPattern, out: &AccessPattern, e: f32, mem: DeviceMemory) {
    // SAFETY: (every arm) the caller's contract.
    unsafe {
        if e == 2.0 {
            each(a, out, mem, |x: f32| x * x)
        } else if e == 1.0 {
            each(a, out, mem, |x: f32| x)
        } else if e == 0.5 {
            // powf(-0, 0.5) = +0 and powf(-inf, 0.5) = +inf, unlike sqrt.
            each(a, out, mem, |x: f32| {
                if x == f32::NEG_INFINITY {
                    f32::INFINITY
                } else {
                    (x + 0.0).sqrt()
                }
            })
        } else if e == -1.0 {
            each(a, out, mem, |x: f32| 1.0 / x)
        } else {
            each(a, out, mem, move |x: f32| x.powf(e))
        }
    }
}

/// Executes `Op::TensorScalar` (`out = a ∘ s`, or `s ∘ a` when `reverse`).
///
/// # Safety
/// Operands inside `mem`, aligned to 4 bytes.
pub unsafe fn tensor_scalar(
    a: &AccessPattern,
    out: &AccessPattern,
    op: BinaryOp,
    s: f32,
    reverse: bool,
    mem: DeviceMemory,
) -> Result<(), KernelError> {
    if out.elements() == 0 {
        return Ok(());
    }
    type F = f32;
    macro_rules! go {
        ($f:expr) => {
            // SAFETY: the caller's contract.
            unsafe {
                if reverse {
                    each(a, out, mem, move |x: f32| $f(s, x))
                } else {
                    each(a, out, mem, move |x: f32| $f(x, s))
                }
            }
        };
    }
    match op {
        BinaryOp::Add => go!(F::add),
        BinaryOp::Sub => go!(F::sub),
        BinaryOp::Mul => go!(F::mul),
        BinaryOp::Div => go!(F::div),
        BinaryOp::Max => go!(F::max),
        BinaryOp::Min => go!(F::min),
        BinaryOp::Pow if !reverse => {
            // SAFETY: the caller's contract.
            unsafe { pow_scalar_exponent(a, out, s, mem) }
        }
        BinaryOp::Pow => go!(F::pow),
        _ => return Err(KernelError::Unsupported("tensor-scalar op")),
    }
    Ok(())
}

/// Executes `Op::Select` (`out = cond ? a : b`), any element type.
///
/// # Safety
/// Operands inside `mem`, aligned to their element size.
pub unsafe fn select(
    cond: &AccessPattern,
    a: &AccessPattern,
    b: &AccessPattern,
    out: &AccessPattern,
    mem: DeviceMemory,
) {
    if out.elements() == 0 {
        return;
    }
    /// # Safety
    /// As `select`, with `T` of the operands' width.
    unsafe fn sel<T: Copy>(
        cond: &AccessPattern,
        a: &AccessPattern,
        b: &AccessPattern,
        out: &AccessPattern,
        mem: DeviceMemory,
    ) {
        // SAFETY: the caller's contract.
        unsafe {
            map3(
                In::<u8>::new(cond, out, mem),
                In::<T>::new(a, out, mem),
                In::<T>::new(b, out, mem),
                View::<T>::new(out, mem),
                |c, a, b, o| {
                    for (((o, c), a), b) in o.iter_mut().zip(c).zip(a).zip(b) {
                        *o = if *c != 0 { *a } else { *b };
                    }
                },
            )
        }
    }
    // SAFETY: the caller's contract.
    unsafe {
        match out.dtype.size() {
            1 => sel::<u8>(cond, a, b, out, mem),
            2 => sel::<u16>(cond, a, b, out, mem),
            4 => sel::<u32>(cond, a, b, out, mem),
            _ => sel::<u64>(cond, a, b, out, mem),
        }
    }
}

impl Execute for op::Binary {
    unsafe fn execute(&self, mem: DeviceMemory, _ws: &mut Workspace) -> Result<(), KernelError> {
        // The caller guarantees every operand in bounds and aligned ([`crate::execute`]).
        let op::Binary { a, b, out, op } = self;

        // SAFETY: see above.
        unsafe { binary(a, b, out, *op, mem) }
    }
}

impl Execute for op::TensorScalar {
    unsafe fn execute(&self, mem: DeviceMemory, _ws: &mut Workspace) -> Result<(), KernelError> {
        // The caller guarantees every operand in bounds and aligned ([`crate::execute`]).
        let op::TensorScalar {
            a,
            out,
            op,
            scalar,
            reverse,
        } = self;

        // SAFETY: see above.
        unsafe { tensor_scalar(a, out, *op, *scalar, *reverse, mem) }
    }
}

impl Execute for op::Select {
    unsafe fn execute(&self, mem: DeviceMemory, _ws: &mut Workspace) -> Result<(), KernelError> {
        // The caller guarantees every operand in bounds and aligned ([`crate::execute`]).
        let op::Select { cond, a, b, out } = self;

        // SAFETY: see above.
        unsafe { select(cond, a, b, out, mem) };
        Ok(())
    }
}
