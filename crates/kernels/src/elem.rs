//! Element types and conversions.
//!
//! The engines compute in fp32 (floats) or in the integer type itself; `bf16` and `f16` are
//! storage formats converted by hand here (round to nearest, ties to even; NaN stays NaN,
//! overflow becomes infinity). Conversions follow ONNX `Cast` / C casts:
//! - float → integer truncates toward zero (saturating at the type's range; NaN → 0);
//! - integer → integer wraps (two's complement truncation or extension);
//! - anything → bool is `x != 0` (NaN → true); bool → number is 0 or 1 (any non-zero byte
//!   is true);
//! - integer → f16/bf16 rounds through f32 (exact for |x| ≤ 2^24).
//!
//! A conversion goes through one intermediate type per pair: `f32` when either side is a
//! float or bool-from-float, `i64` between integers — so every pair is one of 24 monomorphized
//! loops rather than 144.

/// f32 → IEEE binary16 bits, round to nearest even (NaN → quiet NaN, overflow → ±inf).
///
/// Branch-free (every case computed, then selected), so a conversion loop vectorizes.
#[inline(always)]
pub fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = (bits >> 16) & 0x8000;
    let a = bits & 0x7fff_ffff;
    // ≥ 65536 (or inf/NaN): infinity, or a quiet NaN.
    let special = if a > 0x7f80_0000 { 0x7e00 } else { 0x7c00 };
    // Below 2^-14 the result is subnormal (or zero): adding 0.5 aligns the 10 mantissa bits at
    // the bottom of the float, and the FPU's own round-to-nearest-even does the rounding.
    let sub = (f32::from_bits(a) + 0.5)
        .to_bits()
        .wrapping_sub(0x3f00_0000);
    // Normal: rebias the exponent (127 → 15) and round the 13 dropped bits to nearest even; a
    // carry may run into the exponent, up to infinity exactly at 65520.
    let odd = (a >> 13) & 1;
    let norm = a.wrapping_add(0xc800_0fff).wrapping_add(odd) >> 13;
    let h = if a >= 0x4780_0000 {
        special
    } else if a < 0x3880_0000 {
        sub
    } else {
        norm
    };
    (h | sign) as u16
}

/// IEEE binary16 bits → f32 (exact). Branch-free, so a conversion loop vectorizes.
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    let h = h as u32;
    let sign = (h & 0x8000) << 16;
    let em = (h & 0x7fff) << 13; // exponent and mantissa in f32 position
    let exp = em & 0x0f80_0000;
    let normal = em + 0x3800_0000; // rebias 15 → 127
    let inf_nan = em + 0x7000_0000; // exponent 31 → 255
    // Zero/subnormal: m · 2^-24 computed exactly as (2^-14 + m·2^-24) − 2^-14.
    let sub = (f32::from_bits(em + 0x3880_0000) - f32::from_bits(0x3880_0000)).to_bits();
    let v = if exp == 0x0f80_0000 {
        inf_nan
    } else if exp == 0 {
        sub
    } else {
        normal
    };
    f32::from_bits(v | sign)
}

/// f32 → bfloat16 bits, round to nearest even (NaN stays NaN).
#[inline(always)]
pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((b >> 16) & 1);
    (b.wrapping_add(round) >> 16) as u16
}

/// bfloat16 bits → f32 (exact).
#[inline(always)]
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// A storage element type with conversions to and from the two intermediates.
pub trait Elem: Copy + Default + 'static {
    /// To f32 (floats exactly; integers rounding; bool 0/1).
    fn to_f32(self) -> f32;
    /// From f32 (floats rounding; integers truncating toward zero; bool `!= 0`).
    fn from_f32(v: f32) -> Self;
    /// To i64 (integers exactly — u64 as its two's complement bits; bool 0/1).
    fn to_i64(self) -> i64;
    /// From i64 (integers wrapping; bool `!= 0`).
    fn from_i64(v: i64) -> Self;
}

// `from_f32`: the wide integers by `as`. The narrow ones through a clamp, a NaN select and an
// unchecked i32 conversion: the same values as `as` (truncation toward zero, saturation,
// NaN → 0) in a form that vectorizes (`vcvttps2dq`); LLVM leaves `f32 as u8` (and a
// saturating `as i32`) scalar, a NaN test per element, and the f32 → u8 store of a
// dynamically quantized layer's input was its slowest pass (29 µs for 64×512).
macro_rules! int_elem {
    ($($t:ty: $width:ident),*) => {$(
        impl Elem for $t {
            #[inline(always)]
            fn to_f32(self) -> f32 { self as f32 }
            #[inline(always)]
            fn from_f32(v: f32) -> Self { int_elem!(@from_f32 $width, $t, v) }
            #[inline(always)]
            fn to_i64(self) -> i64 { self as i64 }
            #[inline(always)]
            fn from_i64(v: i64) -> Self { v as $t }
        }
    )*};
    (@from_f32 wide, $t:ty, $v:ident) => { $v as $t };
    (@from_f32 narrow, $t:ty, $v:ident) => {{
        let c = $v.clamp(<$t>::MIN as f32, <$t>::MAX as f32);
        let c = if c.is_nan() { 0.0 } else { c };
        // SAFETY: `c` is finite and within the type's range, so within i32's.
        unsafe { c.to_int_unchecked::<i32>() as $t }
    }};
}
int_elem!(i8: narrow, u8: narrow, i16: narrow, u16: narrow, i32: wide, u32: wide, i64: wide, u64: wide);

impl Elem for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self as i64
    }
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        v as f32
    }
}

impl Elem for f64 {
    // Storage only (ONNX `double`): the engines compute in f32.
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v as f64
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self as i64
    }
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        v as f64
    }
}

/// bfloat16 storage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(transparent)]
pub struct Bf16(pub u16);

/// IEEE binary16 storage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(transparent)]
pub struct F16(pub u16);

/// Boolean storage: one byte, non-zero is true.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(transparent)]
pub struct Bool(pub u8);

impl Elem for Bf16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16_to_f32(self.0)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        Bf16(f32_to_bf16(v))
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self.to_f32() as i64
    }
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        Self::from_f32(v as f32)
    }
}

impl Elem for F16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16_to_f32(self.0)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        F16(f32_to_f16(v))
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self.to_f32() as i64
    }
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        Self::from_f32(v as f32)
    }
}

impl Elem for Bool {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        (self.0 != 0) as u8 as f32
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        // NaN != 0 is true, as in C and numpy.
        Bool((v != 0.0) as u8)
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        (self.0 != 0) as i64
    }
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        Bool((v != 0) as u8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The f16 value of `h` computed independently in f64.
    fn f16_value(h: u16) -> f64 {
        let s = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
        let e = ((h >> 10) & 0x1f) as i32;
        let m = (h & 0x3ff) as f64;
        match e {
            0 => s * m * 2f64.powi(-24),
            0x1f if m == 0.0 => s * f64::INFINITY,
            0x1f => f64::NAN,
            _ => s * (1.0 + m / 1024.0) * 2f64.powi(e - 15),
        }
    }

    #[test]
    fn f16_to_f32_is_exact_for_every_value() {
        for h in 0..=u16::MAX {
            let got = f16_to_f32(h) as f64;
            let want = f16_value(h);
            if want.is_nan() {
                assert!(got.is_nan(), "{h:#x}");
            } else {
                assert_eq!(got, want, "{h:#x}");
                assert_eq!(got.is_sign_negative(), want.is_sign_negative(), "{h:#x}");
            }
        }
    }

    /// Reference f32 → f16: nearest of all candidates by exact f64 distance, ties to even.
    fn ref_f32_to_f16(x: f32) -> u16 {
        if x.is_nan() {
            return 0x7e00;
        }
        let v = x as f64;
        let sign = if x.is_sign_negative() { 0x8000 } else { 0 };
        let a = v.abs();
        if a >= 65520.0 {
            return sign | 0x7c00;
        }
        // Binary search the largest magnitude ≤ a among finite positive f16s (monotone bits).
        let (mut lo, mut hi) = (0u16, 0x7bffu16);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if f16_value(mid) <= a {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        let below = lo;
        let above = lo + 1;
        let (db, da) = (a - f16_value(below), f16_value(above) - a);
        let pick = if db < da || (db == da && below & 1 == 0) {
            below
        } else {
            above
        };
        sign | pick
    }

    #[test]
    fn f32_to_f16_rounds_to_nearest_even() {
        // Every f16 value, its neighbours and the midpoints between consecutive values.
        let mut xs = Vec::new();
        for h in 0..0x7c00u16 {
            let v = f16_value(h);
            let next = f16_value(h + 1);
            let mid = (v + next) / 2.0;
            for x in [v, mid, next] {
                let f = x as f32;
                xs.extend([f, f32::from_bits(f.to_bits() + 1), -f]);
                if f.to_bits() > 0 {
                    xs.push(f32::from_bits(f.to_bits() - 1));
                }
            }
        }
        // And a deterministic pseudo-random sample of all bit patterns.
        let mut s = 0x1234_5678_u32;
        for _ in 0..200_000 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            xs.push(f32::from_bits(s));
        }
        xs.extend([
            f32::INFINITY,
            f32::NEG_INFINITY,
            65504.0,
            65519.99,
            65520.0,
            1e10,
        ]);
        for x in xs {
            let got = f32_to_f16(x);
            if x.is_nan() {
                assert!(f16_value(got).is_nan(), "{x:e}");
                continue;
            }
            assert_eq!(got, ref_f32_to_f16(x), "{x:e} ({:#x})", x.to_bits());
        }
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even (1.0) wins.
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        // 1 + 3·2^-8 ties between odd and even: rounds up to even.
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
        assert_eq!(f32_to_bf16(f32::MAX), 0x7f80); // rounds to inf
        for h in 0..=u16::MAX {
            let f = bf16_to_f32(h);
            if !f.is_nan() {
                assert_eq!(f32_to_bf16(f), h);
            }
        }
    }

    #[test]
    fn casts_follow_c_and_onnx() {
        assert_eq!(i32::from_f32(-2.7), -2);
        assert_eq!(u8::from_f32(3.9), 3);
        assert_eq!(Bool::from_f32(f32::NAN), Bool(1));
        assert_eq!(Bool::from_f32(-0.0), Bool(0));
        assert_eq!(Bool(7).to_f32(), 1.0);
        assert_eq!(u8::from_i64(300), 44);
        assert_eq!(i8::from_i64(200), -56);
        assert_eq!(u64::MAX.to_i64(), -1);
        assert_eq!(u64::from_i64(-1), u64::MAX);
    }
}
