//! `Activation`: `y = f(x·scale + bias)` for every [`ActFunc`].
//!
//! The function is chosen once per call: each [`ActFunc`] is a small `Fn(f32) -> f32`
//! (branch-free, [`crate::vmath`] for the transcendental ones) monomorphized into the
//! chunked elementwise drivers, so the per-element loop vectorizes. A dense, non-aliased
//! operand is processed as one slice; strided, broadcast and in-place operands go through
//! stack chunks (see [`crate::strided`]).
//!
//! NaN propagates through every function (`Relu(NaN) = NaN`, `Clip(NaN) = NaN`), as in ONNX.

use crate::DeviceMemory;
use crate::strided::{In, View, map1, map2};
use crate::vmath;
use nrt_isa::{AccessPattern, ActFunc};

/// The scalar parameters of an activation.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    /// Multiplies `x` before the bias.
    pub scale: f32,
    /// LeakyRelu / HardSigmoid / Elu slope; Clip minimum.
    pub alpha: f32,
    /// HardSigmoid offset; Clip maximum.
    pub beta: f32,
}

/// Runs `f` over `y = f(x·scale + bias)`.
///
/// # Safety
/// Operands inside `mem`, aligned.
unsafe fn run(
    input: &AccessPattern,
    output: &AccessPattern,
    bias: Option<&AccessPattern>,
    scale: f32,
    mem: DeviceMemory,
    f: impl Fn(f32) -> f32 + Copy,
) {
    let out = View::<f32>::new(output, mem);
    let x = In::<f32>::new(input, output, mem);
    // SAFETY: (every arm) the caller's contract; `In::new` flags operands overlapping the
    // output so the drivers buffer them.
    unsafe {
        match bias {
            None if scale == 1.0 => map1(x, out, |a, o| {
                for (o, a) in o.iter_mut().zip(a) {
                    *o = f(*a);
                }
            }),
            None => map1(x, out, |a, o| {
                for (o, a) in o.iter_mut().zip(a) {
                    *o = f(*a * scale);
                }
            }),
            Some(b) => map2(x, In::<f32>::new(b, output, mem), out, |a, b, o| {
                for ((o, a), b) in o.iter_mut().zip(a).zip(b) {
                    *o = f(a.mul_add(scale, *b));
                }
            }),
        }
    }
}

/// The scalar definition of each function (also what the tests check against, through an
/// f64 reference of their own).
#[inline(always)]
pub fn softplus(x: f32) -> f32 {
    // max(x, 0) + ln(1 + e^-|x|), with ln(1 + u) ≈ u − u²/2 for tiny u.
    let u = vmath::exp(-x.abs());
    let l = if u < 1e-4 {
        u * (1.0 - 0.5 * u)
    } else {
        vmath::ln(1.0 + u)
    };
    let v = if x > 0.0 { x } else { 0.0 } + l;
    if x.is_nan() { x } else { v }
}

/// Expands `$go!(f)` with `f: Fn(f32) -> f32 + Copy` the scalar definition of `$func`
/// (parameters `$alpha`, `$beta`): one monomorphized loop per function, shared by
/// [`activation`] and the MatMul epilogue.
macro_rules! with_func {
    ($func:expr, $alpha:expr, $beta:expr, $go:ident) => {{
        #[allow(unused_variables)]
        let (alpha, beta): (f32, f32) = ($alpha, $beta);
        const K_GELU: f32 = 0.797_884_6; // √(2/π)
        match $func {
            ActFunc::Identity => $go!(|x| x),
            ActFunc::Relu => $go!(|x: f32| if x < 0.0 { 0.0 } else { x }),
            ActFunc::LeakyRelu => $go!(move |x: f32| if x < 0.0 { alpha * x } else { x }),
            ActFunc::Sigmoid => $go!(vmath::sigmoid),
            ActFunc::HardSigmoid => $go!(move |x: f32| alpha.mul_add(x, beta).clamp(0.0, 1.0)),
            ActFunc::Tanh => $go!(vmath::tanh),
            ActFunc::GeluErf => {
                $go!(|x: f32| {
                    0.5 * x * (1.0 + vmath::erf(x * core::f32::consts::FRAC_1_SQRT_2))
                })
            }
            // ½·x·(1 + tanh u) = x·σ(2u) = x / (1 + e^{−2u}): one exp and one division
            // (tanh computes both of its branches in a vector loop: a polynomial and an exp
            // with a division): 1.20 → 0.84 ns/element (`cargo bench -- act`). e^{−2u} saturating
            // to ∞ gives ±0, as tanh's −1 did; a NaN x stays NaN.
            ActFunc::GeluTanh => $go!(|x: f32| {
                let inner = K_GELU * (0.044_715 * x * x).mul_add(x, x);
                x / (1.0 + vmath::exp(-2.0 * inner))
            }),
            ActFunc::Erf => $go!(vmath::erf),
            ActFunc::Exp => $go!(vmath::exp),
            ActFunc::Log => $go!(vmath::ln),
            ActFunc::Sqrt => $go!(f32::sqrt),
            ActFunc::Rsqrt => $go!(|x: f32| 1.0 / x.sqrt()),
            ActFunc::Reciprocal => $go!(|x: f32| 1.0 / x),
            ActFunc::Clip => $go!(move |x: f32| {
                let v = if x < alpha { alpha } else { x };
                if v > beta { beta } else { v }
            }),
            ActFunc::Abs => $go!(f32::abs),
            ActFunc::Neg => $go!(|x: f32| -x),
            ActFunc::Elu => $go!(move |x: f32| if x < 0.0 { alpha * vmath::expm1(x) } else { x }),
            ActFunc::Softplus => $go!(softplus),
            ActFunc::Floor => $go!(f32::floor),
            ActFunc::Ceil => $go!(f32::ceil),
            ActFunc::Square => $go!(|x: f32| x * x),
            ActFunc::Tan => $go!(f32::tan),
            ActFunc::Asin => $go!(f32::asin),
            ActFunc::Acos => $go!(f32::acos),
            ActFunc::Atan => $go!(f32::atan),
            ActFunc::Sinh => $go!(f32::sinh),
            ActFunc::Cosh => $go!(f32::cosh),
            // Through f64: std's f32 inverse hyperbolics lose ~20 ulp near |x| = 1.
            ActFunc::Asinh => $go!(|x: f32| f64::from(x).asinh() as f32),
            ActFunc::Acosh => $go!(|x: f32| f64::from(x).acosh() as f32),
            ActFunc::Atanh => $go!(|x: f32| f64::from(x).atanh() as f32),
            ActFunc::Round => $go!(f32::round_ties_even),
        }
    }};
}

/// `x = f(x)` in place over a contiguous slice, for the MatMul and Conv epilogues. Built
/// twice and picked at run time: with AVX-512F enabled the functions' range checks and NaN
/// selects are mask-register blends, not two-µop `vblendvps` (see `norm::softmax`).
pub fn apply_in_place(func: ActFunc, alpha: f32, beta: f32, xs: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F detected just above.
        return unsafe { apply_in_place_avx512(func, alpha, beta, xs) };
    }
    apply_in_place_here(func, alpha, beta, xs);
}

/// [`apply_in_place`] compiled with AVX-512F enabled.
///
/// # Safety
/// The CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn apply_in_place_avx512(func: ActFunc, alpha: f32, beta: f32, xs: &mut [f32]) {
    apply_in_place_here(func, alpha, beta, xs);
}

#[inline(always)]
fn apply_in_place_here(func: ActFunc, alpha: f32, beta: f32, xs: &mut [f32]) {
    macro_rules! go {
        ($f:expr) => {{
            let f = $f;
            for x in xs.iter_mut() {
                *x = f(*x);
            }
        }};
    }
    if func == ActFunc::Identity {
        return;
    }
    with_func!(func, alpha, beta, go);
}

/// Executes `Op::Activation`.
///
/// # Safety
/// Operands inside `mem`, aligned to 4 bytes.
pub unsafe fn activation(
    input: &AccessPattern,
    output: &AccessPattern,
    bias: Option<&AccessPattern>,
    func: ActFunc,
    p: Params,
    mem: DeviceMemory,
) {
    if output.elements() == 0 {
        return;
    }
    let Params { scale, alpha, beta } = p;
    macro_rules! go {
        ($f:expr) => {
            // SAFETY: the caller's contract.
            unsafe { run(input, output, bias, scale, mem, $f) }
        };
    }
    with_func!(func, alpha, beta, go);
}
