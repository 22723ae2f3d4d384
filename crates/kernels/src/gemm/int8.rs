//! The int8 tile kernels of `MatMulInteger` ([`crate::qmatmul`]): `MR × NR` tiles of i32 sums
//! of u8 × i8 products over packed words of 4 bytes — portable, AVX-512 VNNI (`vpdpbusd`) and
//! AVX2 (`vpmaddwd`).

/// Rows of a tile (with two 16-lane accumulators each: 16 of the 32 vector registers).
pub(crate) const MR: usize = 8;
/// Columns of a tile (two 16-lane vectors).
pub(crate) const NR: usize = 32;

/// `Σ_t a_byte[t] (u8) · b_byte[t] (i8)` over the 4 bytes of two words.
#[inline(always)]
fn dot4(a: i32, b: i32) -> i32 {
    let (a, b) = (a.to_le_bytes(), b.to_le_bytes());
    (0..4).map(|t| a[t] as i32 * b[t] as i8 as i32).sum()
}

/// One `MR × NR` tile on the portable path.
pub(crate) fn tile_portable(
    a: &[&[i32]; MR],
    b: &[i32],
    np: usize,
    k4: usize,
    acc: &mut [[i32; NR]; MR],
) {
    for w in 0..k4 {
        let brow = &b[w * np..][..NR];
        for r in 0..MR {
            let aw = a[r][w];
            for (x, &bw) in acc[r].iter_mut().zip(brow) {
                *x = x.wrapping_add(dot4(aw, bw));
            }
        }
    }
}

/// Packs one unit-stride row of A (`k` bytes from `src`, re-biased by `flip`) into `row`'s
/// words, zero padded to whole words, and returns the sum of its re-biased bytes: 64 bytes a
/// step (`vpsadbw` sums them), the tail under a mask.
///
/// # Safety
/// `src` readable for `k` bytes; `row` holds `⌈k/4⌉` words; the CPU has AVX-512 F and BW.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn pack_a_row_avx512(src: *const u8, k: usize, flip: u8, row: &mut [i32]) -> i32 {
    use std::arch::x86_64::*;
    assert!(row.len() >= k.div_ceil(4));
    let dst = row.as_mut_ptr() as *mut u8;
    let flipv = _mm512_set1_epi8(flip as i8);
    let zero = _mm512_setzero_si512();
    let mut sums = zero;
    let mut i = 0;
    while i < k {
        let m: __mmask64 = if k - i >= 64 {
            !0
        } else {
            (1u64 << (k - i)) - 1
        };
        // SAFETY: bytes i.. of `src` under the mask lie below k; `row` holds ⌈k/4⌉·4 ≥ k
        // bytes (asserted).
        unsafe {
            let v = _mm512_maskz_mov_epi8(
                m,
                _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, src.add(i) as *const i8), flipv),
            );
            sums = _mm512_add_epi64(sums, _mm512_sad_epu8(v, zero));
            _mm512_mask_storeu_epi8(dst.add(i) as *mut i8, m, v);
        }
        i += 64;
    }
    for b in k..4 * k.div_ceil(4) {
        // SAFETY: inside the row's ⌈k/4⌉ words (asserted).
        unsafe { dst.add(b).write(0) };
    }
    _mm512_reduce_add_epi64(sums) as i32
}

/// The `vpdpbusd` steps of the first `R` rows of one `MR × NR` tile into the accumulators
/// `$c` (`[[__m512i; 2]; R]`): per k-quadruple two loads of B, R broadcast words of A and 2·R
/// products. A macro, so that both tiles below compile it inside their own `target_feature`
/// function.
#[cfg(target_arch = "x86_64")]
macro_rules! vnni_steps {
    ($a:expr, $b:expr, $np:expr, $k4:expr, $c:ident, $rows:expr) => {{
        let (a, b, np, k4): (&[&[i32]; MR], &[i32], usize, usize) = ($a, $b, $np, $k4);
        // The bounds once, here: the loop below reads through raw pointers, so each step is
        // two loads of B, MR broadcast loads of A and 2·MR `vpdpbusd` — no per-row slice
        // bounds checks (they doubled the instructions per step and held the loop to half
        // the instruction's throughput).
        assert!(a.iter().all(|r| r.len() >= k4) && (k4 == 0 || b.len() >= (k4 - 1) * np + NR));
        let ap: [*const i32; MR] = core::array::from_fn(|r| a[r].as_ptr());
        let bp = b.as_ptr();
        for w in 0..k4 {
            // SAFETY: row w of B holds NR = 32 words from `w·np` (asserted above): two
            // unaligned 64-byte loads.
            let (b0, b1) = unsafe {
                (
                    _mm512_loadu_si512(bp.add(w * np) as *const _),
                    _mm512_loadu_si512(bp.add(w * np + 16) as *const _),
                )
            };
            for r in 0..$rows {
                // SAFETY: each row of A holds k4 words (asserted above).
                let av = _mm512_set1_epi32(unsafe { ap[r].add(w).read() });
                $c[r][0] = _mm512_dpbusd_epi32($c[r][0], av, b0);
                $c[r][1] = _mm512_dpbusd_epi32($c[r][1], av, b1);
            }
        }
    }};
}

/// What [`tile_vnni_store`] needs to finish its tile from registers: the formula of
/// `C[i, j] = raw − zb'[j]·(rowsum[i] − K·za'[i]) − za'[i]·colsum[j]` (wrapping, as
/// `Corrections::row` in [`crate::qmatmul`]), its terms laid out per batch.
#[cfg(target_arch = "x86_64")]
pub(crate) struct TileStore {
    /// Rows of the tile inside C (`≤ MR`).
    pub(crate) rows: usize,
    /// Columns of the tile inside C (`≤ NR`).
    pub(crate) cols: usize,
    /// `zb'` of the tile's columns (`cols` readable).
    pub(crate) zb: *const i32,
    /// The column sums of B' (`cols` readable).
    pub(crate) colsum: *const i32,
    /// The scale at the tile's first column (null: C is i32).
    pub(crate) scale: *const f32,
    /// The scale has one value per column (else one for the tensor).
    pub(crate) per_column: bool,
    /// `rowsum − K·za'` of the tile's rows (`rows` readable).
    pub(crate) row_term: *const i32,
    /// `za'` of the tile's rows (`rows` readable).
    pub(crate) za: *const i32,
    /// C's element `(i, j0)` of each row (rows past `rows` repeat the last).
    pub(crate) dst: [*mut u8; MR],
}

/// The first `R` rows of one `MR × NR` tile with `vpdpbusd` (`R ≥ st.rows`: a product with
/// fewer rows than a tile, a GEMV, computes only those), corrected, converted, scaled and
/// stored from the registers (a unit-stride C): per 16 columns two multiply-subtracts, then a
/// masked store (i32) or a conversion, a multiply and a masked store (f32).
///
/// # Safety
/// The CPU has AVX-512 F, BW, VL and VNNI; `a` and `b` as for [`tile_vnni`]; `st`'s pointers
/// cover what its comments say and its rows and columns of C lie inside device memory
/// (unit-stride rows); `st.rows ≤ R ≤ MR`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn tile_vnni_store<const R: usize>(
    a: &[&[i32]; MR],
    b: &[i32],
    np: usize,
    k4: usize,
    st: &TileStore,
) {
    use std::arch::x86_64::*;
    const { assert!(R <= MR) };
    let z = _mm512_setzero_si512();
    let mut c = [[z; 2]; R];
    vnni_steps!(a, b, np, k4, c, R);
    let masks = [
        crate::lanes_below(st.cols),
        crate::lanes_below(st.cols.saturating_sub(16)),
    ];
    // SAFETY: the column terms and the scale are read under the column masks, the row terms
    // for rows below `rows`, and C's rows written under the masks — all inside what the
    // contract says `st` covers.
    unsafe {
        let zb = [
            _mm512_maskz_loadu_epi32(masks[0], st.zb),
            _mm512_maskz_loadu_epi32(masks[1], st.zb.wrapping_add(16)),
        ];
        let colsum = [
            _mm512_maskz_loadu_epi32(masks[0], st.colsum),
            _mm512_maskz_loadu_epi32(masks[1], st.colsum.wrapping_add(16)),
        ];
        let scale = if st.scale.is_null() {
            [_mm512_setzero_ps(); 2]
        } else if st.per_column {
            [
                _mm512_maskz_loadu_ps(masks[0], st.scale),
                _mm512_maskz_loadu_ps(masks[1], st.scale.wrapping_add(16)),
            ]
        } else {
            [_mm512_set1_ps(*st.scale); 2]
        };
        for (r, sums) in c.iter().enumerate().take(st.rows) {
            let rt = _mm512_set1_epi32(*st.row_term.add(r));
            let za = _mm512_set1_epi32(*st.za.add(r));
            for (h, &mask) in masks.iter().enumerate() {
                if mask == 0 {
                    break;
                }
                let v = _mm512_sub_epi32(sums[h], _mm512_mullo_epi32(zb[h], rt));
                let v = _mm512_sub_epi32(v, _mm512_mullo_epi32(za, colsum[h]));
                if st.scale.is_null() {
                    let dst = (st.dst[r] as *mut i32).wrapping_add(16 * h);
                    _mm512_mask_storeu_epi32(dst, mask, v);
                } else {
                    let dst = (st.dst[r] as *mut f32).wrapping_add(16 * h);
                    let f = _mm512_mul_ps(_mm512_cvtepi32_ps(v), scale[h]);
                    _mm512_mask_storeu_ps(dst, mask, f);
                }
            }
        }
    }
}

/// One `MR × NR` tile with `vpdpbusd`.
///
/// # Safety
/// The CPU has AVX-512F and AVX-512 VNNI; `a` rows hold `k4` words; `b` holds `k4` rows of
/// `np` words with `NR` readable from the start of each.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vnni")]
pub(crate) unsafe fn tile_vnni(
    a: &[&[i32]; MR],
    b: &[i32],
    np: usize,
    k4: usize,
    acc: &mut [[i32; NR]; MR],
) {
    use std::arch::x86_64::*;
    let z = _mm512_setzero_si512();
    let mut c = [[z; 2]; MR];
    vnni_steps!(a, b, np, k4, c, MR);
    for r in 0..MR {
        // SAFETY: each accumulator row holds NR = 32 i32: two unaligned 64-byte stores.
        unsafe {
            _mm512_storeu_si512(acc[r].as_mut_ptr() as *mut _, c[r][0]);
            _mm512_storeu_si512(acc[r].as_mut_ptr().add(16) as *mut _, c[r][1]);
        }
    }
}

/// A's packed words (4 u8 each, `[b0 b1 b2 b3]`) as the AVX2 tiles read them: per word two,
/// the i16 pairs `(b0, b2)` then `(b1, b3)`, so that a tile broadcasts them as they are.
pub(crate) fn split_a_words(words: &[i32], split: &mut [i32]) {
    for (&w, pair) in words.iter().zip(split.chunks_exact_mut(2)) {
        let w = w as u32;
        pair[0] = (w & 0x00ff_00ff) as i32;
        pair[1] = ((w >> 8) & 0x00ff_00ff) as i32;
    }
}

/// Rows of A per AVX2 block: 4 rows × 16 columns take 8 accumulators, B's widened halves 4
/// and A's two broadcast pairs 2 — 14 of AVX2's 16 vector registers.
#[cfg(target_arch = "x86_64")]
const AVX2_ROWS: usize = 4;

/// The first `rows` rows of one `MR × NR` tile with AVX2 (rows past them are left zero):
/// blocks of up to [`AVX2_ROWS`] rows × 16 columns, each a pass over K.
///
/// `vpmaddubsw` (u8 × i8 pairs into i16) would saturate at 2·255·128, so each word is widened
/// instead: B's bytes `[b0 b1 b2 b3]` become the i16 pairs `(b0, b2)` (shifted up and
/// arithmetically back) and `(b1, b3)` (shifted down) in registers, A's come split already
/// ([`split_a_words`]: `(a0, a2)`, `(a1, a3)`, zero-extended), and two `vpmaddwd` give the
/// word's four products as exact i32 sums.
///
/// # Safety
/// The CPU has AVX2; `a` rows hold `2·k4` split words; `b` holds `k4` rows of `np` words with
/// `NR` readable from the start of each; `rows ≤ MR`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn tile_avx2(
    a: &[&[i32]; MR],
    rows: usize,
    b: &[i32],
    np: usize,
    k4: usize,
    acc: &mut [[i32; NR]; MR],
) {
    // The bounds once, here: the blocks read through raw pointers.
    assert!(
        rows <= MR
            && a.iter().all(|r| r.len() >= 2 * k4)
            && (k4 == 0 || b.len() >= (k4 - 1) * np + NR)
    );
    let ap: [*const i32; MR] = core::array::from_fn(|r| a[r].as_ptr());
    let mut r0 = 0;
    while r0 < rows {
        let left = rows - r0;
        for h in [0, 16] {
            // SAFETY: AVX2 per the contract; rows r0.. of A hold 2·k4 words; B's rows hold
            // h + 16 ≤ NR words from `h` (asserted above).
            unsafe {
                let bp = b.as_ptr().add(h);
                match left {
                    1 => avx2_block::<1>(&ap[r0..], bp, np, k4, &mut acc[r0..], h),
                    2 => avx2_block::<2>(&ap[r0..], bp, np, k4, &mut acc[r0..], h),
                    3 => avx2_block::<3>(&ap[r0..], bp, np, k4, &mut acc[r0..], h),
                    _ => avx2_block::<AVX2_ROWS>(&ap[r0..], bp, np, k4, &mut acc[r0..], h),
                }
            }
        }
        r0 += AVX2_ROWS.min(left);
    }
}

/// `R` rows of A against 16 columns of B (from `b`), over all of K, into `acc[..R][h..h + 16]`.
///
/// # Safety
/// The CPU has AVX2; `a` has `≥ R` rows of `2·k4` split words; B's `k4` rows (`np` words
/// apart) hold 16 words from `b`; `acc` has `≥ R` rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn avx2_block<const R: usize>(
    a: &[*const i32],
    b: *const i32,
    np: usize,
    k4: usize,
    acc: &mut [[i32; NR]],
    h: usize,
) {
    use std::arch::x86_64::*;
    let mut c = [[_mm256_setzero_si256(); 2]; R];
    let a: [*const i32; R] = core::array::from_fn(|r| a[r]);
    for w in 0..k4 {
        // SAFETY: row w of B holds 16 words from `b + w·np`; each row of A holds 2·k4 words
        // (the contract).
        unsafe {
            let row = b.add(w * np);
            let bw = [
                _mm256_loadu_si256(row as *const __m256i),
                _mm256_loadu_si256(row.add(8) as *const __m256i),
            ];
            let b_even = [
                _mm256_srai_epi16::<8>(_mm256_slli_epi16::<8>(bw[0])),
                _mm256_srai_epi16::<8>(_mm256_slli_epi16::<8>(bw[1])),
            ];
            let b_odd = [_mm256_srai_epi16::<8>(bw[0]), _mm256_srai_epi16::<8>(bw[1])];
            for r in 0..R {
                let a_even = _mm256_set1_epi32(a[r].add(2 * w).read());
                let a_odd = _mm256_set1_epi32(a[r].add(2 * w + 1).read());
                for x in 0..2 {
                    let s = _mm256_add_epi32(
                        _mm256_madd_epi16(a_even, b_even[x]),
                        _mm256_madd_epi16(a_odd, b_odd[x]),
                    );
                    c[r][x] = _mm256_add_epi32(c[r][x], s);
                }
            }
        }
    }
    for (r, sums) in c.iter().enumerate() {
        for (x, &v) in sums.iter().enumerate() {
            // SAFETY: row r of `acc` holds NR ≥ h + 16 i32 (h ∈ {0, 16}).
            unsafe { _mm256_storeu_si256(acc[r].as_mut_ptr().add(h + 8 * x) as *mut __m256i, v) };
        }
    }
}
