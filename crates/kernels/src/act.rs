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
use crate::{Execute, KernelError, Workspace};
use nrt_isa::op;
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

/// √(2/π), GeluTanh's constant.
const K_GELU: f32 = 0.797_884_6;

/// Expands `$go!(f)` with `f: Fn(f32) -> f32 + Copy` the scalar definition of `$func`
/// (parameters `$alpha`, `$beta`): one monomorphized loop per function, shared by
/// [`activation`] and the MatMul epilogue.
macro_rules! with_func {
    ($func:expr, $alpha:expr, $beta:expr, $go:ident) => {{
        #[allow(unused_variables)]
        let (alpha, beta): (f32, f32) = ($alpha, $beta);
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
    if crate::cpu::avx512f() {
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
    use core::arch::x86_64::*;
    // The exponential's functions on 16-lane vectors ([`vmath::exp_avx512`]: LLVM
    // vectorizes the scalar forms to 256-bit vectors only), lane for lane the same
    // operations as their scalar definitions in `with_func!`, so bit-identical to them; the
    // tail (under 16) and every other function take the scalar form.
    macro_rules! lanes16 {
        ($f:expr) => {{
            let f = $f;
            let whole = xs.len() / 16 * 16;
            for ch in xs[..whole].chunks_exact_mut(16) {
                // SAFETY: AVX-512F per the contract; the load and store cover the chunk.
                unsafe { _mm512_storeu_ps(ch.as_mut_ptr(), f(_mm512_loadu_ps(ch.as_ptr()))) };
            }
            apply_in_place_here(func, alpha, beta, &mut xs[whole..]);
        }};
    }
    match func {
        ActFunc::Exp => lanes16!(|x| {
            // SAFETY: AVX-512F per the contract; register-only operations.
            unsafe { vmath::exp_avx512(x) }
        }),
        ActFunc::Sigmoid => lanes16!(|x: __m512| {
            // SAFETY: as above. 1 / (1 + e^{−x}), the negation a sign flip as in the scalar
            // form.
            unsafe {
                let neg = _mm512_castsi512_ps(_mm512_xor_si512(
                    _mm512_castps_si512(x),
                    _mm512_set1_epi32(i32::MIN),
                ));
                let one = _mm512_set1_ps(1.0);
                _mm512_div_ps(one, _mm512_add_ps(one, vmath::exp_avx512(neg)))
            }
        }),
        ActFunc::GeluTanh => lanes16!(|x: __m512| {
            // SAFETY: as above.
            unsafe {
                let x3 = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.044_715), x), x);
                let inner = _mm512_mul_ps(_mm512_set1_ps(K_GELU), _mm512_fmadd_ps(x3, x, x));
                let e = vmath::exp_avx512(_mm512_mul_ps(_mm512_set1_ps(-2.0), inner));
                _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0), e))
            }
        }),
        _ => apply_in_place_here(func, alpha, beta, xs),
    }
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
    if bias.is_none()
        && scale == 1.0
        && matches!(func, ActFunc::Exp | ActFunc::Sigmoid | ActFunc::GeluTanh)
    {
        // The functions [`apply_in_place`] runs on 16-lane vectors: copied, then in place
        // (the same values as the scalar loop below, bit for bit).
        let out = View::<f32>::new(output, mem);
        let x = In::<f32>::new(input, output, mem);
        // SAFETY: the caller's contract; `In::new` flags an input overlapping the output so
        // the driver buffers it.
        unsafe {
            map1(x, out, |a, o| {
                o.copy_from_slice(a);
                apply_in_place(func, alpha, beta, o);
            })
        };
        return;
    }
    macro_rules! go {
        ($f:expr) => {
            // SAFETY: the caller's contract.
            unsafe { run(input, output, bias, scale, mem, $f) }
        };
    }
    with_func!(func, alpha, beta, go);
}

impl Execute for op::Activation {
    unsafe fn execute(&self, mem: DeviceMemory, _ws: &mut Workspace) -> Result<(), KernelError> {
        // The caller guarantees every operand in bounds and aligned ([`crate::execute`]).
        let op::Activation {
            input,
            output,
            bias,
            func,
            scale,
            alpha,
            beta,
        } = self;

        let p = Params {
            scale: *scale,
            alpha: *alpha,
            beta: *beta,
        };
        // SAFETY: see above.
        unsafe { activation(input, output, bias.as_ref(), *func, p, mem) };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The epilogue's 16-lane functions are bit-identical to their scalar definitions, over
    /// both ranges' ends, special values and a tail shorter than a vector.
    #[test]
    fn vector_epilogue_functions_are_the_scalar_ones() {
        let mut xs: Vec<f32> = vec![
            f32::NEG_INFINITY,
            f32::INFINITY,
            f32::NAN,
            0.0,
            -0.0,
            1e-40,
            -1e-40,
            f32::MAX,
            f32::MIN,
            -90.0,
            90.0,
        ];
        xs.extend((0..10_000).map(|i| -120.0 + i as f32 * 0.0241));
        xs.truncate(xs.len() / 16 * 16 + 7);
        for func in [
            ActFunc::Exp,
            ActFunc::Sigmoid,
            ActFunc::GeluTanh,
            ActFunc::Tanh,
        ] {
            let mut got = xs.clone();
            apply_in_place(func, 0.0, 0.0, &mut got);
            let mut want = xs.clone();
            apply_in_place_here(func, 0.0, 0.0, &mut want);
            for ((x, g), w) in xs.iter().zip(&got).zip(&want) {
                assert!(
                    g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                    "{func:?}({x}): {g} vs {w}"
                );
            }
        }
    }
}
