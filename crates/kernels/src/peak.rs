//! The machine's arithmetic limit, measured with register-only loops (no memory traffic):
//! what `nrt bench --gemm` divides each GEMM row by. Machines differ between sessions (and
//! under co-tenants), so the limit is measured in the same run as the rows it scales.
//!
//! Each loop keeps 12 independent accumulator chains in vector registers (more than FMA
//! latency × throughput on current x86 cores) and counts a multiply-add as 2 FLOP.

use std::time::{Duration, Instant};

/// Which instruction's limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peak {
    /// f32 fused multiply-add (`vfmadd231ps`; 512-bit with AVX-512F, else 256-bit).
    F32Fma,
    /// bf16 pair dot product into f32 (`vdpbf16ps`, AVX-512 BF16): 32 multiply-adds each.
    Bf16Dot,
    /// bf16 tile multiply into f32 tiles (`tdpbf16ps`, Intel AMX): 8,192 multiply-adds each
    /// (the bf16 packed GEMM's instruction where the process may use AMX).
    Bf16Tile,
    /// u8 × i8 tile multiply into i32 tiles (`tdpbusd`, Intel AMX): 16,384 multiply-adds
    /// each (the int8 GEMM's instruction where the process may use AMX).
    I8Tile,
    /// u8 × i8 quadruple dot product into i32 (`vpdpbusd`, AVX-512 VNNI): 64 multiply-adds
    /// each (the int8 GEMM's instruction; its "FLOP" are integer operations, GOPS). Without
    /// VNNI, with AVX2: an i16 pair dot product and its accumulation (`vpmaddwd` + `vpaddd`,
    /// 16 multiply-adds a pair), what the int8 GEMM's AVX2 tiles run on bytes widened to i16.
    I8Dot,
}

/// A measuring loop: FLOP per iteration, and the loop over `n` iterations.
type Loop = (f64, fn(u64) -> f32);

/// Best GFLOP/s of `batches` timed batches of about `per_batch` each, `None` where the CPU
/// lacks the instruction.
pub fn measure(which: Peak, per_batch: Duration, batches: u32) -> Option<f64> {
    let (flops_per_iter, run): Loop = select(which)?;
    // Calibrate the iteration count to the batch time.
    let mut iters = 1u64 << 12;
    loop {
        let t = Instant::now();
        std::hint::black_box(run(iters));
        if t.elapsed() >= per_batch / 4 || iters >= 1 << 34 {
            break;
        }
        iters *= 2;
    }
    let mut best = 0f64;
    for _ in 0..batches.max(1) {
        let t = Instant::now();
        std::hint::black_box(run(std::hint::black_box(iters)));
        let ns = t.elapsed().as_nanos().max(1) as f64;
        best = best.max(flops_per_iter * iters as f64 / ns);
    }
    Some(best)
}

#[cfg(target_arch = "x86_64")]
fn select(which: Peak) -> Option<Loop> {
    use crate::cpu;
    match which {
        Peak::F32Fma if cpu::avx512f() => Some((12.0 * 16.0 * 2.0, |n| {
            // SAFETY: AVX-512F detected just above.
            unsafe { x86::fma512(n) }
        })),
        Peak::F32Fma if cpu::avx2_fma() => Some((12.0 * 8.0 * 2.0, |n| {
            // SAFETY: AVX2 and FMA detected just above.
            unsafe { x86::fma256(n) }
        })),
        Peak::I8Dot if cpu::avx512vnni() => Some((12.0 * 64.0 * 2.0, |n| {
            // SAFETY: AVX-512F and AVX-512 VNNI detected just above.
            unsafe { x86::dpbusd(n) }
        })),
        Peak::I8Dot if cpu::avx2_fma() => Some((12.0 * 16.0 * 2.0, |n| {
            // SAFETY: AVX2 detected just above.
            unsafe { x86::madd256(n) }
        })),
        Peak::Bf16Tile if crate::gemm::amx::bf16_available() => {
            Some((4.0 * 16.0 * 16.0 * 32.0 * 2.0, |n| {
                // SAFETY: the tile unit is usable (checked just above).
                unsafe { crate::gemm::amx::tile_loop_bf16(n) }
            }))
        }
        Peak::I8Tile if crate::gemm::amx::int8_available() => {
            Some((4.0 * 16.0 * 16.0 * 64.0 * 2.0, |n| {
                // SAFETY: the tile unit is usable (checked just above).
                unsafe { crate::gemm::amx::tile_loop_u8i8(n) }
            }))
        }
        Peak::Bf16Dot if cpu::avx512bf16() => {
            Some((12.0 * 32.0 * 2.0, |n| {
                // SAFETY: AVX-512F and AVX-512 BF16 detected just above.
                unsafe { x86::dpbf16(n) }
            }))
        }
        _ => None,
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn select(_which: Peak) -> Option<Loop> {
    None
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::arch::x86_64::*;

    macro_rules! chains {
        ($zero:expr, $step:ident, $sum:expr, $n:expr) => {{
            let (mut a0, mut a1, mut a2, mut a3, mut a4, mut a5) =
                ($zero, $zero, $zero, $zero, $zero, $zero);
            let (mut a6, mut a7, mut a8, mut a9, mut a10, mut a11) =
                ($zero, $zero, $zero, $zero, $zero, $zero);
            for _ in 0..$n {
                // 12 independent chains: each instruction depends only on its own previous
                // result, so the loop runs at the units' throughput.
                a0 = $step!(a0);
                a1 = $step!(a1);
                a2 = $step!(a2);
                a3 = $step!(a3);
                a4 = $step!(a4);
                a5 = $step!(a5);
                a6 = $step!(a6);
                a7 = $step!(a7);
                a8 = $step!(a8);
                a9 = $step!(a9);
                a10 = $step!(a10);
                a11 = $step!(a11);
            }
            [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11]
                .iter()
                .fold(0f32, |s, &a| s + $sum(a))
        }};
    }

    /// `n` iterations of 12 512-bit FMAs.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn fma512(n: u64) -> f32 {
        let x = _mm512_set1_ps(std::hint::black_box(0.999_999));
        let y = _mm512_set1_ps(std::hint::black_box(1e-7));
        macro_rules! step {
            ($a:expr) => {
                _mm512_fmadd_ps($a, x, y)
            };
        }
        chains!(_mm512_set1_ps(1.0), step, _mm512_reduce_add_ps, n)
    }

    /// `n` iterations of 12 256-bit FMAs.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn fma256(n: u64) -> f32 {
        let x = _mm256_set1_ps(std::hint::black_box(0.999_999));
        let y = _mm256_set1_ps(std::hint::black_box(1e-7));
        let sum = |v: __m256| {
            let mut o = [0f32; 8];
            // SAFETY: 8 writable floats.
            unsafe { _mm256_storeu_ps(o.as_mut_ptr(), v) };
            o.iter().sum::<f32>()
        };
        macro_rules! step {
            ($a:expr) => {
                _mm256_fmadd_ps($a, x, y)
            };
        }
        chains!(_mm256_set1_ps(1.0), step, sum, n)
    }

    /// `n` iterations of 12 `vpmaddwd` + `vpaddd` pairs (256-bit).
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn madd256(n: u64) -> f32 {
        let x = _mm256_set1_epi16(std::hint::black_box(1));
        let sum = |v: __m256i| {
            let mut o = [0i32; 8];
            // SAFETY: 8 writable i32.
            unsafe { _mm256_storeu_si256(o.as_mut_ptr() as *mut __m256i, v) };
            o.iter().map(|&x| x as f32).sum::<f32>()
        };
        // The product reads the chain's own value (a loop-invariant `madd(x, x)` would be
        // hoisted out of the loop): each step depends on its previous result, as the FMA
        // chains do.
        macro_rules! step {
            ($a:expr) => {
                _mm256_add_epi32($a, _mm256_madd_epi16($a, x))
            };
        }
        chains!(_mm256_set1_epi32(1), step, sum, n)
    }

    /// `n` iterations of 12 `vdpbf16ps`.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn dpbf16(n: u64) -> f32 {
        let v = _mm512_set1_ps(std::hint::black_box(1e-3));
        let x = _mm512_cvtne2ps_pbh(v, v);
        macro_rules! step {
            ($a:expr) => {
                _mm512_dpbf16_ps($a, x, x)
            };
        }
        chains!(_mm512_setzero_ps(), step, _mm512_reduce_add_ps, n)
    }

    /// `n` iterations of 12 `vpdpbusd`.
    #[target_feature(enable = "avx512f,avx512vnni")]
    pub(super) unsafe fn dpbusd(n: u64) -> f32 {
        let x = _mm512_set1_epi8(std::hint::black_box(1));
        macro_rules! step {
            ($a:expr) => {
                _mm512_dpbusd_epi32($a, x, x)
            };
        }
        let sum = |v: __m512i| _mm512_reduce_add_epi32(v) as f32;
        chains!(_mm512_setzero_si512(), step, sum, n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_f32_limit_is_measured_and_plausible() {
        // Any x86-64-v3 machine has FMA; a few GFLOP/s at least even when shared.
        let g = measure(Peak::F32Fma, Duration::from_millis(20), 2).expect("FMA present");
        assert!(g > 1.0 && g < 10_000.0, "{g} GFLOP/s");
        for p in [Peak::Bf16Dot, Peak::Bf16Tile, Peak::I8Dot, Peak::I8Tile] {
            if let Some(b) = measure(p, Duration::from_millis(20), 2) {
                assert!(b > 1.0 && b < 40_000.0, "{p:?}: {b} G/s");
            }
        }
    }
}
