//! Vectorizable f32 elementary functions.
//!
//! `std`'s `f32::exp` and friends are accurate but call scalar libm, so a loop over them runs
//! one element at a time. These are branch-free polynomial approximations (Cephes-style range
//! reduction and minimax coefficients) written as scalar code that LLVM vectorizes across a
//! loop: selects instead of branches, integer exponent tricks through `to_bits`/`from_bits`.
//! Accuracy against an f64 reference (see the tests): `exp`, `log` ≤ 2 ulp; `tanh`, `erf`,
//! `sigmoid`, `expm1` ≤ ~1e-6 relative (absolute 1e-7 where the value crosses 0 for `erf`).
//! Special values follow IEEE: NaN propagates, `exp(-inf) = 0`, `log(0) = -inf`,
//! `log(x < 0) = NaN`.

const LN2_HI: f32 = 0.693_359_4; // 0.693359375: exactly representable, few mantissa bits
const LN2_LO: f32 = -2.121_944_4e-4;
const LOG2E: f32 = core::f32::consts::LOG2_E;

/// Largest x with finite `exp(x)`.
const EXP_HI: f32 = 88.722_84;
/// Below this `exp(x)` is 0 in this implementation (the f32 subnormal range is flushed).
const EXP_LO: f32 = -87.336_55;

/// `e^x`.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    // max/min, not clamp: a NaN x must become a finite xc for the integer tricks below.
    #[allow(clippy::manual_clamp)]
    let xc = x.max(EXP_LO).min(EXP_HI);
    // n = round(x·log2 e) and its integer value through the 1.5·2^23 trick (adding it rounds
    // to nearest even and leaves the integer in the low mantissa bits): a float → int `as`
    // cast would saturate per lane and not vectorize.
    const MAGIC: f32 = 12_582_912.0;
    let t = xc.mul_add(LOG2E, MAGIC);
    let ni = t.to_bits() as i32 - MAGIC.to_bits() as i32;
    let n = t - MAGIC;
    let r = n.mul_add(-LN2_HI, xc);
    let r = n.mul_add(-LN2_LO, r);
    let mut p = 1.987_569_1e-4f32;
    p = p.mul_add(r, 1.398_2e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 1.666_666_5e-1);
    p = p.mul_add(r, 5e-1);
    let y = p.mul_add(r * r, r) + 1.0;
    // 2^n by building the exponent; n ∈ [-126, 128]: split so both factors are normal.
    let h = ni >> 1;
    let s1 = f32::from_bits(((h + 127) as u32) << 23);
    let s2 = f32::from_bits(((ni - h + 127) as u32) << 23);
    let v = y * s1 * s2;
    let v = if x > EXP_HI { f32::INFINITY } else { v };
    let v = if x < EXP_LO { 0.0 } else { v };
    if x.is_nan() { x } else { v }
}

/// [`exp`] on 16 lanes with AVX-512F intrinsics: the same operations in the same order
/// (every `mul_add` a fused `vfmadd`), so each lane is bit-identical to [`exp`] of it. LLVM
/// vectorizes the scalar form only to 256-bit vectors.
///
/// # Safety
/// The CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn exp_avx512(x: core::arch::x86_64::__m512) -> core::arch::x86_64::__m512 {
    use core::arch::x86_64::*;
    const MAGIC: f32 = 12_582_912.0;
    {
        // max(x, LO) gives LO for a NaN x (the second operand), as `f32::max` does.
        let xc = _mm512_min_ps(
            _mm512_max_ps(x, _mm512_set1_ps(EXP_LO)),
            _mm512_set1_ps(EXP_HI),
        );
        let t = _mm512_fmadd_ps(xc, _mm512_set1_ps(LOG2E), _mm512_set1_ps(MAGIC));
        let ni = _mm512_sub_epi32(
            _mm512_castps_si512(t),
            _mm512_set1_epi32(MAGIC.to_bits() as i32),
        );
        let n = _mm512_sub_ps(t, _mm512_set1_ps(MAGIC));
        let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_HI), xc);
        let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_LO), r);
        let mut p = _mm512_set1_ps(1.987_569_1e-4);
        for c in [
            1.398_2e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            1.666_666_5e-1,
            5e-1,
        ] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        let y = _mm512_add_ps(
            _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r),
            _mm512_set1_ps(1.0),
        );
        let h = _mm512_srai_epi32::<1>(ni);
        let bias = _mm512_set1_epi32(127);
        let s1 = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(h, bias)));
        let s2 = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(
            _mm512_sub_epi32(ni, h),
            bias,
        )));
        let v = _mm512_mul_ps(_mm512_mul_ps(y, s1), s2);
        let over = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, _mm512_set1_ps(EXP_HI));
        let v = _mm512_mask_blend_ps(over, v, _mm512_set1_ps(f32::INFINITY));
        let under = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(EXP_LO));
        let v = _mm512_mask_blend_ps(under, v, _mm512_setzero_ps());
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
        _mm512_mask_blend_ps(nan, v, x)
    }
}

/// `e^x − 1`, accurate near 0.
#[inline(always)]
pub fn expm1(x: f32) -> f32 {
    // Taylor series on |x| < 0.25 (truncation < 3e-9 relative), exp(x) − 1 elsewhere.
    let mut p = 1.0f32 / 40320.0;
    p = p.mul_add(x, 1.0 / 5040.0);
    p = p.mul_add(x, 1.0 / 720.0);
    p = p.mul_add(x, 1.0 / 120.0);
    p = p.mul_add(x, 1.0 / 24.0);
    p = p.mul_add(x, 1.0 / 6.0);
    p = p.mul_add(x, 0.5);
    let small = p.mul_add(x * x, x);
    let big = exp(x) - 1.0;
    if x.abs() < 0.25 { small } else { big }
}

/// Natural logarithm.
#[inline(always)]
pub fn ln(x: f32) -> f32 {
    // Subnormals: scale into the normal range first.
    let sub = x < f32::MIN_POSITIVE;
    let xs = if sub { x * 8_388_608.0 } else { x }; // 2^23
    let bits = xs.to_bits();
    let mut e = ((bits >> 23) & 0xff) as i32 - 126;
    // Mantissa in [0.5, 1).
    let mut m = f32::from_bits((bits & 0x007f_ffff) | 0x3f00_0000);
    let lo = m < core::f32::consts::FRAC_1_SQRT_2;
    e -= lo as i32;
    m = if lo { m + m - 1.0 } else { m - 1.0 };
    let ef = e as f32 - if sub { 23.0 } else { 0.0 };
    let z = m * m;
    let mut y = 7.037_683_6e-2f32;
    y = y.mul_add(m, -1.151_461e-1);
    y = y.mul_add(m, 1.167_699_9e-1);
    y = y.mul_add(m, -1.242_014_1e-1);
    y = y.mul_add(m, 1.424_932_3e-1);
    y = y.mul_add(m, -1.666_805_8e-1);
    y = y.mul_add(m, 2.000_071_4e-1);
    y = y.mul_add(m, -2.499_999_4e-1);
    y = y.mul_add(m, 3.333_333e-1);
    let mut r = y * m * z;
    r = ef.mul_add(LN2_LO, r);
    r = (-0.5f32).mul_add(z, r);
    let mut v = m + r;
    v = ef.mul_add(LN2_HI, v);
    let v = if x == f32::INFINITY { x } else { v };
    let v = if x == 0.0 { f32::NEG_INFINITY } else { v };
    if x < 0.0 || x.is_nan() { f32::NAN } else { v }
}

/// Hyperbolic tangent.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    let a = x.abs();
    // |x| < 0.625: odd polynomial (Cephes tanhf).
    let z = x * x;
    let mut p = -5.704_988_7e-3f32;
    p = p.mul_add(z, 2.063_909e-2);
    p = p.mul_add(z, -5.373_971_6e-2);
    p = p.mul_add(z, 1.333_144_2e-1);
    p = p.mul_add(z, -3.333_328e-1);
    let small = (p * z).mul_add(x, x);
    // Otherwise 1 − 2/(e^{2|x|} + 1) with the sign of x (saturates to 1 for large |x|).
    let e = exp(2.0 * a.min(10.0));
    let big = (1.0 - 2.0 / (e + 1.0)).copysign(x);
    let v = if a < 0.625 { small } else { big };
    if x.is_nan() { x } else { v }
}

/// Logistic sigmoid `1/(1 + e^-x)`.
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// Error function.
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let a = x.abs();
    // |x| < 1: x·P(x²) (Taylor to x^21 would do; this is the Cephes erff minimax).
    let z = x * x;
    let mut p = 7.853_861_4e-5f32;
    p = p.mul_add(z, -8.010_193_6e-4);
    p = p.mul_add(z, 5.188_327_7e-3);
    p = p.mul_add(z, -2.685_381_2e-2);
    p = p.mul_add(z, 1.128_358_5e-1);
    p = p.mul_add(z, -3.761_262_6e-1);
    p = p.mul_add(z, core::f32::consts::FRAC_2_SQRT_PI);
    let small = x * p;
    // |x| ≥ 1: 1 − erfc(|x|), erfc(a) = e^{-a²}·P(1/a)/a (Cephes erfcf, two ranges).
    let ac = a.clamp(1.0, 4.5);
    let q = 1.0 / ac;
    let y = q * q;
    let mut pl = 2.326_82e-2f32; // 1 ≤ a < 2
    pl = pl.mul_add(y, -1.387_039_4e-1);
    pl = pl.mul_add(y, 3.687_424_7e-1);
    pl = pl.mul_add(y, -5.824_733e-1);
    pl = pl.mul_add(y, 6.210_004_6e-1);
    pl = pl.mul_add(y, -4.944_515_2e-1);
    pl = pl.mul_add(y, 3.404_88e-1);
    pl = pl.mul_add(y, -2.741_127e-1);
    pl = pl.mul_add(y, 5.638_259_4e-1);
    let mut ph = -1.047_766_4e1f32; // a ≥ 2
    ph = ph.mul_add(y, 1.297_72e1);
    ph = ph.mul_add(y, -7.495_518_7);
    ph = ph.mul_add(y, 2.921_019);
    ph = ph.mul_add(y, -1.015_265_3);
    ph = ph.mul_add(y, 4.218_463_4e-1);
    ph = ph.mul_add(y, -2.820_767_4e-1);
    ph = ph.mul_add(y, 5.641_895e-1);
    let pp = if ac < 2.0 { pl } else { ph };
    let erfc = exp(-ac * ac) * q * pp;
    let big = (1.0 - erfc).copysign(x);
    let v = if a < 1.0 { small } else { big };
    let v = if a >= 4.5 { 1.0f32.copysign(x) } else { v };
    if x.is_nan() { x } else { v }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// erf in f64: series for |x| < 3, continued fraction for erfc beyond.
    fn erf64(x: f64) -> f64 {
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
            // erfc(a) = e^{-a²}/√π · 1/(a + 1/2/(a + 1/(a + 3/2/(a + …)))).
            let mut f = a;
            for k in (1..60).rev() {
                f = a + (k as f64 / 2.0) / f;
            }
            1.0 - (-a * a).exp() / core::f64::consts::PI.sqrt() / f
        };
        v.copysign(x)
    }

    fn check(name: &str, f: fn(f32) -> f32, r: fn(f64) -> f64, lo: f32, hi: f32, rel: f64) {
        let n = 200_000;
        let mut worst = (0.0f64, 0.0f32);
        for i in 0..=n {
            let x = lo + (hi - lo) * (i as f32 / n as f32);
            let got = f(x) as f64;
            let want = r(x as f64);
            let err = (got - want).abs() / want.abs().max(1e-30);
            let err = if want.abs() < 1e-30 {
                (got - want).abs()
            } else {
                err
            };
            if err > worst.0 {
                worst = (err, x);
            }
        }
        assert!(
            worst.0 <= rel,
            "{name}: rel err {:e} at x = {}",
            worst.0,
            worst.1
        );
    }

    #[test]
    fn exp_accuracy() {
        check("exp", exp, f64::exp, -87.0, 88.7, 3e-7);
        check("exp small", exp, f64::exp, -1.0, 1.0, 2e-7);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(89.0), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(exp(0.0), 1.0);
    }

    /// The 16-lane exponential is bit-identical to the scalar one, special values included
    /// (below the flush bound the scalar form gives an exact 0, not the bound's e^x).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn exp_avx512_is_the_scalar_exp() {
        use core::arch::x86_64::*;
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return;
        }
        let mut xs: Vec<f32> = vec![
            f32::NEG_INFINITY,
            f32::INFINITY,
            f32::NAN,
            -f32::NAN,
            0.0,
            -0.0,
            f32::MIN_POSITIVE,
            -1e-40,
            EXP_LO,
            EXP_LO - 1e-3,
            -100.0,
            -160.0,
            EXP_HI,
            88.8,
            f32::MAX,
            f32::MIN,
        ];
        xs.extend((0..20_000).map(|i| -180.0 + i as f32 * 0.0137));
        xs.resize(xs.len().next_multiple_of(16), 1.5);
        for ch in xs.chunks_exact(16) {
            let mut got = [0.0f32; 16];
            // SAFETY: AVX-512F detected above; 16-lane loads and stores of 16-element arrays.
            unsafe {
                let v = exp_avx512(_mm512_loadu_ps(ch.as_ptr()));
                _mm512_storeu_ps(got.as_mut_ptr(), v);
            }
            for (x, g) in ch.iter().zip(got) {
                let want = exp(*x);
                assert!(
                    g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                    "exp({x}): {g} vs {want}"
                );
            }
        }
    }

    #[test]
    fn expm1_accuracy() {
        check("expm1", expm1, f64::exp_m1, -5.0, 5.0, 3e-7);
        check("expm1 tiny", expm1, f64::exp_m1, -1e-3, 1e-3, 2e-7);
    }

    #[test]
    fn log_accuracy() {
        check("ln", ln, f64::ln, 1e-6, 1e6, 3e-7);
        check("ln near 1", ln, f64::ln, 0.9, 1.1, 3e-7);
        let sub = f32::from_bits(1000);
        assert!(((ln(sub) as f64 - (sub as f64).ln()) / (sub as f64).ln()).abs() < 1e-7);
        assert_eq!(ln(0.0), f32::NEG_INFINITY);
        assert_eq!(ln(f32::INFINITY), f32::INFINITY);
        assert!(ln(-1.0).is_nan());
        assert!(ln(f32::NAN).is_nan());
        assert_eq!(ln(1.0), 0.0);
    }

    #[test]
    fn tanh_accuracy() {
        check("tanh", tanh, f64::tanh, -12.0, 12.0, 1e-6);
        check("tanh small", tanh, f64::tanh, -0.7, 0.7, 3e-7);
        assert_eq!(tanh(100.0), 1.0);
        assert_eq!(tanh(-100.0), -1.0);
        assert!(tanh(f32::NAN).is_nan());
    }

    #[test]
    fn sigmoid_accuracy() {
        check(
            "sigmoid",
            sigmoid,
            |x| 1.0 / (1.0 + (-x).exp()),
            -80.0,
            30.0,
            1e-6,
        );
    }

    #[test]
    fn erf_accuracy() {
        check("erf", erf, erf64, -6.0, 6.0, 1e-6);
        check("erf small", erf, erf64, -1e-3, 1e-3, 1e-6);
        assert!(erf(f32::NAN).is_nan());
        assert_eq!(erf(f32::INFINITY), 1.0);
        assert_eq!(erf(0.0), 0.0);
    }
}
