//! The types the GEMM variants share: the strided f32 matrix [`Mat`], the packed B layouts
//! ([`Packed`], [`PackedBf16`]), the in-register tile epilogue ([`TileEpilogue`]) and the
//! AVX-512 bf16 row rounding (`avx512::round_row`) that the bf16 products apply to A.

/// A strided f32 matrix: pointer, row stride and column stride in elements.
#[derive(Clone, Copy, Debug)]
pub struct Mat {
    /// Element `[0, 0]`.
    pub ptr: *mut f32,
    /// Row stride.
    pub rs: isize,
    /// Column stride.
    pub cs: isize,
}

/// What the packed GEMM applies to each finished tile of C in registers, before storing it
/// (the common case of the MatMul and Conv epilogues): `C = relu?(alpha·A·B [+ C] + bias +
/// row_bias)`.
#[derive(Clone, Copy, Debug)]
pub struct TileEpilogue {
    /// Per-column bias: `bias[j]` is added to column `j` of every row (null: none).
    pub bias: *const f32,
    /// Per-row bias: `row_bias[i]` is added to every column of row `i` (null: none) — a
    /// convolution's per-output-channel bias, whose output channels are the rows.
    pub row_bias: *const f32,
    /// Then `Relu` (`x < 0 ? 0 : x`, NaN kept).
    pub relu: bool,
}

impl TileEpilogue {
    /// Nothing.
    pub const NONE: TileEpilogue = TileEpilogue {
        bias: core::ptr::null(),
        row_bias: core::ptr::null(),
        relu: false,
    };
}

/// A packed B in device memory.
#[derive(Clone, Copy, Debug)]
pub struct Packed {
    /// The first panel.
    pub ptr: *const f32,
    /// Panel width (16, 32 or 64: [`nrt_isa::matmul_flags::PANEL_WIDTHS`]); also the row stride inside a panel.
    pub nr: usize,
    /// Distance between panels, in floats (`k · nr` when densely packed).
    pub panel_stride: isize,
}

/// A packed bf16 B (`--auto-cast matmult` weights): panels of `nr` columns whose rows are
/// pairs of K (`B[2t, j]`, `B[2t+1, j]` side by side: one 32-bit word per column), the last
/// panel zero-padded past N and K zero-padded to even — the f32 panel layout with `K/2`
/// rows of 32-bit words, which is how the kernels walk it.
#[derive(Clone, Copy, Debug)]
pub struct PackedBf16 {
    /// The first panel.
    pub ptr: *const u16,
    /// Panel width in columns (16, 32 or 64).
    pub nr: usize,
    /// Distance between panels, in bf16 elements (`ceil(k/2) · 2 · nr` when dense).
    pub panel_stride: isize,
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use crate::elem::f32_to_bf16;
    use core::arch::x86_64::*;

    /// Rounds `k` f32 (stride `s`) to bf16 into `out`, 32 at a time when contiguous.
    ///
    /// # Safety
    /// `x` readable for `k` elements; AVX-512 F/BF16 present.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(crate) unsafe fn round_row(x: *const f32, s: isize, out: &mut [u16]) {
        let k = out.len();
        let mut p = 0;
        if s == 1 {
            while p + 32 <= k {
                // SAFETY: 32 contiguous readable floats; 64 writable bytes of `out`.
                unsafe {
                    let lo = _mm512_loadu_ps(x.add(p));
                    let hi = _mm512_loadu_ps(x.add(p + 16));
                    let v = _mm512_cvtne2ps_pbh(hi, lo);
                    _mm512_storeu_si512(
                        out.as_mut_ptr().add(p) as *mut __m512i,
                        core::mem::transmute::<__m512bh, __m512i>(v),
                    );
                }
                p += 32;
            }
        }
        for (q, o) in out.iter_mut().enumerate().skip(p) {
            // SAFETY: readable per the contract.
            *o = f32_to_bf16(unsafe { *x.offset(q as isize * s) });
        }
    }
}
