//! The x86-64 microkernels of the packed GEMM ([`super::packed`]): AVX-512F tiles and GEMV,
//! bf16 (`vdpbf16ps`) tiles, AVX2 + FMA tiles and GEMV.

// Register tiles index rows and vectors explicitly: clearer than iterator chains here.
#![allow(clippy::needless_range_loop)]

use super::tile::{Job, Tile, drive, finish, gemv_tile, store_partial};
use core::arch::x86_64::*;
use nrt_hal::tuning::{GEMM_PACKED_PREFETCH_ROWS, GEMV_MAX_ROWS};

// The packed GEMV's dispatches (`gemv_rows!`, `run_avx2`) have arms for 1 to 4 rows.
const _: () = assert!(GEMV_MAX_ROWS == 4);

/// Runs [`gemv512`] for `j.m` (1 to [`GEMV_MAX_ROWS`]) rows and `j.b.nr` (16, 32 or 64)
/// columns per panel, with `U` steps of K in flight chosen for at least 8 accumulator
/// chains.
macro_rules! gemv_rows {
    ($j:expr, $bcast:expr, $fma:expr) => {{
        let j: &Job = $j;
        let (b, f) = ($bcast, $fma);
        // SAFETY: forwarded contract; `j.m` rows, panels of `j.b.nr` = 16·W columns.
        unsafe {
            match (j.b.nr, j.m) {
                (16, 1) => gemv512::<1, 1, 8>(j, b, f),
                (16, 2) => gemv512::<2, 1, 4>(j, b, f),
                (16, 3) => gemv512::<3, 1, 4>(j, b, f),
                (16, _) => gemv512::<4, 1, 2>(j, b, f),
                (32, 1) => gemv512::<1, 2, 4>(j, b, f),
                (32, 2) => gemv512::<2, 2, 2>(j, b, f),
                (32, 3) => gemv512::<3, 2, 2>(j, b, f),
                (32, _) => gemv512::<4, 2, 1>(j, b, f),
                (_, 1) => gemv512::<1, 4, 2>(j, b, f),
                (_, 2) => gemv512::<2, 4, 1>(j, b, f),
                (_, 3) => gemv512::<3, 4, 1>(j, b, f),
                (_, _) => gemv512::<4, 4, 1>(j, b, f),
            }
        }
    }};
}

/// AVX-512 microkernel: `R` rows × `W` vectors of 16 columns.
///
/// # Safety
/// The tile's operands valid (see [`super::packed::gemm_packed`]); AVX-512F present.
#[inline(always)]
unsafe fn tile512<const R: usize, const W: usize>(t: &Tile) {
    // SAFETY: every load reads rows < R of A at p < kc, or B's panel rows p < kc at
    // columns < 16·W (inside the panel: the width divides it); stores as `store_partial`
    // or the first `cols` = 16·W columns of the R rows of C.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); W]; R];
        let rows: [*const f32; R] = core::array::from_fn(|r| t.a.offset(r as isize * t.lda));
        let mut bp = t.b;
        let ahead = GEMM_PACKED_PREFETCH_ROWS as isize * t.ldb;
        for p in 0..t.kc {
            // The panel's rows a few steps ahead, into L1: a layer's weights stream from
            // L3 on the first row block (an MLP's layers do not all fit L2), faster than
            // the hardware prefetcher runs ahead. A prefetch never faults, so the rows
            // past the panel's end cost nothing but the line.
            _mm_prefetch::<_MM_HINT_T0>(bp.wrapping_offset(ahead) as *const i8);
            if W > 1 {
                _mm_prefetch::<_MM_HINT_T0>(bp.wrapping_offset(ahead + 16) as *const i8);
            }
            let bv: [__m512; W] = core::array::from_fn(|w| _mm512_loadu_ps(bp.add(16 * w)));
            for r in 0..R {
                let av = _mm512_set1_ps(*rows[r].add(p));
                for w in 0..W {
                    acc[r][w] = _mm512_fmadd_ps(av, bv[w], acc[r][w]);
                }
            }
            bp = bp.offset(t.ldb);
        }
        store512::<R, W>(t, acc);
    }
}

/// One step of K for row `r` of the assembly tile: broadcast `A[r, p]` (row `r` addressed
/// from the base of rows 0, 5 or 10 plus `{0, 1, 2, 3, 4}·lda`) and two FMAs into the
/// row's accumulators `zmm(2r)`, `zmm(2r+1)` against B's two vectors in `zmm28`/`zmm29`.
macro_rules! fma_row {
    (0) => {
        concat!(
            "vbroadcastss zmm30, dword ptr [{a0}]\n",
            "vfmadd231ps zmm0, zmm30, zmm28\n",
            "vfmadd231ps zmm1, zmm30, zmm29"
        )
    };
    (1) => {
        concat!(
            "vbroadcastss zmm31, dword ptr [{a0}+{l}]\n",
            "vfmadd231ps zmm2, zmm31, zmm28\n",
            "vfmadd231ps zmm3, zmm31, zmm29"
        )
    };
    (2) => {
        concat!(
            "vbroadcastss zmm30, dword ptr [{a0}+2*{l}]\n",
            "vfmadd231ps zmm4, zmm30, zmm28\n",
            "vfmadd231ps zmm5, zmm30, zmm29"
        )
    };
    (3) => {
        concat!(
            "vbroadcastss zmm31, dword ptr [{a0}+{l3}]\n",
            "vfmadd231ps zmm6, zmm31, zmm28\n",
            "vfmadd231ps zmm7, zmm31, zmm29"
        )
    };
    (4) => {
        concat!(
            "vbroadcastss zmm30, dword ptr [{a0}+4*{l}]\n",
            "vfmadd231ps zmm8, zmm30, zmm28\n",
            "vfmadd231ps zmm9, zmm30, zmm29"
        )
    };
    (5) => {
        concat!(
            "vbroadcastss zmm31, dword ptr [{a5}]\n",
            "vfmadd231ps zmm10, zmm31, zmm28\n",
            "vfmadd231ps zmm11, zmm31, zmm29"
        )
    };
    (6) => {
        concat!(
            "vbroadcastss zmm30, dword ptr [{a5}+{l}]\n",
            "vfmadd231ps zmm12, zmm30, zmm28\n",
            "vfmadd231ps zmm13, zmm30, zmm29"
        )
    };
    (7) => {
        concat!(
            "vbroadcastss zmm31, dword ptr [{a5}+2*{l}]\n",
            "vfmadd231ps zmm14, zmm31, zmm28\n",
            "vfmadd231ps zmm15, zmm31, zmm29"
        )
    };
    (8) => {
        concat!(
            "vbroadcastss zmm30, dword ptr [{a5}+{l3}]\n",
            "vfmadd231ps zmm16, zmm30, zmm28\n",
            "vfmadd231ps zmm17, zmm30, zmm29"
        )
    };
    (9) => {
        concat!(
            "vbroadcastss zmm31, dword ptr [{a5}+4*{l}]\n",
            "vfmadd231ps zmm18, zmm31, zmm28\n",
            "vfmadd231ps zmm19, zmm31, zmm29"
        )
    };
    (10) => {
        concat!(
            "vbroadcastss zmm30, dword ptr [{a10}]\n",
            "vfmadd231ps zmm20, zmm30, zmm28\n",
            "vfmadd231ps zmm21, zmm30, zmm29"
        )
    };
    (11) => {
        concat!(
            "vbroadcastss zmm31, dword ptr [{a10}+{l}]\n",
            "vfmadd231ps zmm22, zmm31, zmm28\n",
            "vfmadd231ps zmm23, zmm31, zmm29"
        )
    };
    (12) => {
        concat!(
            "vbroadcastss zmm30, dword ptr [{a10}+2*{l}]\n",
            "vfmadd231ps zmm24, zmm30, zmm28\n",
            "vfmadd231ps zmm25, zmm30, zmm29"
        )
    };
    (13) => {
        concat!(
            "vbroadcastss zmm31, dword ptr [{a10}+{l3}]\n",
            "vfmadd231ps zmm26, zmm31, zmm28\n",
            "vfmadd231ps zmm27, zmm31, zmm29"
        )
    };
}

/// Zeroes row `r`'s two accumulators.
macro_rules! zero_row {
    (0) => {
        "vxorps zmm0, zmm0, zmm0\nvxorps zmm1, zmm1, zmm1"
    };
    (1) => {
        "vxorps zmm2, zmm2, zmm2\nvxorps zmm3, zmm3, zmm3"
    };
    (2) => {
        "vxorps zmm4, zmm4, zmm4\nvxorps zmm5, zmm5, zmm5"
    };
    (3) => {
        "vxorps zmm6, zmm6, zmm6\nvxorps zmm7, zmm7, zmm7"
    };
    (4) => {
        "vxorps zmm8, zmm8, zmm8\nvxorps zmm9, zmm9, zmm9"
    };
    (5) => {
        "vxorps zmm10, zmm10, zmm10\nvxorps zmm11, zmm11, zmm11"
    };
    (6) => {
        "vxorps zmm12, zmm12, zmm12\nvxorps zmm13, zmm13, zmm13"
    };
    (7) => {
        "vxorps zmm14, zmm14, zmm14\nvxorps zmm15, zmm15, zmm15"
    };
    (8) => {
        "vxorps zmm16, zmm16, zmm16\nvxorps zmm17, zmm17, zmm17"
    };
    (9) => {
        "vxorps zmm18, zmm18, zmm18\nvxorps zmm19, zmm19, zmm19"
    };
    (10) => {
        "vxorps zmm20, zmm20, zmm20\nvxorps zmm21, zmm21, zmm21"
    };
    (11) => {
        "vxorps zmm22, zmm22, zmm22\nvxorps zmm23, zmm23, zmm23"
    };
    (12) => {
        "vxorps zmm24, zmm24, zmm24\nvxorps zmm25, zmm25, zmm25"
    };
    (13) => {
        "vxorps zmm26, zmm26, zmm26\nvxorps zmm27, zmm27, zmm27"
    };
}

/// Stores row `r`'s two accumulators to the tile buffer (`[[__m512; 2]; R]`).
macro_rules! save_row {
    (0) => {
        "vmovups [{acc}+0], zmm0\nvmovups [{acc}+64], zmm1"
    };
    (1) => {
        "vmovups [{acc}+128], zmm2\nvmovups [{acc}+192], zmm3"
    };
    (2) => {
        "vmovups [{acc}+256], zmm4\nvmovups [{acc}+320], zmm5"
    };
    (3) => {
        "vmovups [{acc}+384], zmm6\nvmovups [{acc}+448], zmm7"
    };
    (4) => {
        "vmovups [{acc}+512], zmm8\nvmovups [{acc}+576], zmm9"
    };
    (5) => {
        "vmovups [{acc}+640], zmm10\nvmovups [{acc}+704], zmm11"
    };
    (6) => {
        "vmovups [{acc}+768], zmm12\nvmovups [{acc}+832], zmm13"
    };
    (7) => {
        "vmovups [{acc}+896], zmm14\nvmovups [{acc}+960], zmm15"
    };
    (8) => {
        "vmovups [{acc}+1024], zmm16\nvmovups [{acc}+1088], zmm17"
    };
    (9) => {
        "vmovups [{acc}+1152], zmm18\nvmovups [{acc}+1216], zmm19"
    };
    (10) => {
        "vmovups [{acc}+1280], zmm20\nvmovups [{acc}+1344], zmm21"
    };
    (11) => {
        "vmovups [{acc}+1408], zmm22\nvmovups [{acc}+1472], zmm23"
    };
    (12) => {
        "vmovups [{acc}+1536], zmm24\nvmovups [{acc}+1600], zmm25"
    };
    (13) => {
        "vmovups [{acc}+1664], zmm26\nvmovups [{acc}+1728], zmm27"
    };
}

/// An `R`-row × 32-column tile ([`tile512::<R, 2>`]) with its K loop in assembly. The
/// rows of A are addressed from three bases (rows 0, 5 and 10) plus `{0, 1, 2, 3, 4}·lda`,
/// so a step of K costs `2R` FMAs, `R` broadcasts, two loads of B, two prefetches and five
/// integer operations; the compiled loop kept one pointer per row (an add or a move per
/// row and step, which took FMA ports from the FMAs: 64×512×512 ran at 81–89% of the f32
/// peak, 92–93% with this loop, best of 30 batches, `examples/packed_bench`).
macro_rules! tile_asm {
    ($t:expr, $R:literal; $($r:tt)*) => {{
        let t: &Tile = $t;
        let mut acc = [[_mm512_setzero_ps(); 2]; $R];
        let l = t.lda.wrapping_mul(4);
        let ldb = t.ldb.wrapping_mul(4);
        let ahead = ldb.wrapping_mul(GEMM_PACKED_PREFETCH_ROWS as isize);
        // SAFETY: reads rows < R of A at columns < kc (kc ≥ 1) and B's panel rows < kc
        // at columns < 32 (the tile's contract); prefetches never fault; writes only the
        // tile buffer and the registers declared.
        unsafe {
            core::arch::asm!(
                "/* rows from {a0} {a5} {a10} + {l} {l3} */",
                $(zero_row!($r),)*
                "2:",
                "prefetcht0 [{b}+{ahead}]",
                "prefetcht0 [{b}+{ahead}+64]",
                "vmovups zmm28, [{b}]",
                "vmovups zmm29, [{b}+64]",
                $(fma_row!($r),)*
                "add {a0}, 4",
                "add {a5}, 4",
                "add {a10}, 4",
                "add {b}, {ldb}",
                "dec {k}",
                "jnz 2b",
                $(save_row!($r),)*
                a0 = inout(reg) t.a => _,
                a5 = inout(reg) t.a.wrapping_offset(5 * t.lda) => _,
                a10 = inout(reg) t.a.wrapping_offset(10 * t.lda) => _,
                l = in(reg) l,
                l3 = in(reg) l.wrapping_mul(3),
                b = inout(reg) t.b => _,
                ldb = in(reg) ldb,
                ahead = in(reg) ahead,
                k = inout(reg) t.kc => _,
                acc = in(reg) acc.as_mut_ptr(),
                out("zmm0") _,
                out("zmm1") _,
                out("zmm2") _,
                out("zmm3") _,
                out("zmm4") _,
                out("zmm5") _,
                out("zmm6") _,
                out("zmm7") _,
                out("zmm8") _,
                out("zmm9") _,
                out("zmm10") _,
                out("zmm11") _,
                out("zmm12") _,
                out("zmm13") _,
                out("zmm14") _,
                out("zmm15") _,
                out("zmm16") _,
                out("zmm17") _,
                out("zmm18") _,
                out("zmm19") _,
                out("zmm20") _,
                out("zmm21") _,
                out("zmm22") _,
                out("zmm23") _,
                out("zmm24") _,
                out("zmm25") _,
                out("zmm26") _,
                out("zmm27") _,
                out("zmm28") _,
                out("zmm29") _,
                out("zmm30") _,
                out("zmm31") _,
                options(nostack),
            );
            store512::<$R, 2>(t, acc);
        }
    }};
}

/// [`tile512::<R, 2>`] for every `R` ≤ 14 through [`tile_asm`].
///
/// # Safety
/// As [`tile512`] with 32 columns of B per panel row, `kc ≥ 1`; AVX-512F present.
#[target_feature(enable = "avx512f")]
unsafe fn tile_x32(t: &Tile) {
    debug_assert!(t.kc > 0);
    match t.mr {
        1 => tile_asm!(t, 1; 0),
        2 => tile_asm!(t, 2; 0 1),
        3 => tile_asm!(t, 3; 0 1 2),
        4 => tile_asm!(t, 4; 0 1 2 3),
        5 => tile_asm!(t, 5; 0 1 2 3 4),
        6 => tile_asm!(t, 6; 0 1 2 3 4 5),
        7 => tile_asm!(t, 7; 0 1 2 3 4 5 6),
        8 => tile_asm!(t, 8; 0 1 2 3 4 5 6 7),
        9 => tile_asm!(t, 9; 0 1 2 3 4 5 6 7 8),
        10 => tile_asm!(t, 10; 0 1 2 3 4 5 6 7 8 9),
        11 => tile_asm!(t, 11; 0 1 2 3 4 5 6 7 8 9 10),
        12 => tile_asm!(t, 12; 0 1 2 3 4 5 6 7 8 9 10 11),
        13 => tile_asm!(t, 13; 0 1 2 3 4 5 6 7 8 9 10 11 12),
        14 => tile_asm!(t, 14; 0 1 2 3 4 5 6 7 8 9 10 11 12 13),
        _ => unreachable!("tile rows ≤ MR512"),
    }
}

/// Stores a finished AVX-512 tile (scaled by alpha, added to C when `t.add`, then the
/// tile epilogue).
///
/// # Safety
/// As [`tile512`]'s stores; AVX-512F present.
#[inline(always)]
unsafe fn store512<const R: usize, const W: usize>(t: &Tile, acc: [[__m512; W]; R]) {
    // SAFETY: the first `cols` columns of the R rows of C (all 16·W when `cols` says so).
    unsafe {
        let va = _mm512_set1_ps(t.alpha);
        if t.cs == 1 && t.cols == 16 * W {
            for r in 0..R {
                let cr = t.c.offset(r as isize * t.rs);
                let rb = if t.row_bias.is_null() {
                    None
                } else {
                    Some(_mm512_set1_ps(*t.row_bias.add(r)))
                };
                for w in 0..W {
                    let mut v = _mm512_mul_ps(acc[r][w], va);
                    if t.add {
                        v = _mm512_add_ps(v, _mm512_loadu_ps(cr.add(16 * w)));
                    }
                    if !t.bias.is_null() {
                        v = _mm512_add_ps(v, _mm512_loadu_ps(t.bias.add(16 * w)));
                    }
                    if let Some(rb) = rb {
                        v = _mm512_add_ps(v, rb);
                    }
                    if t.relu {
                        // The second operand when either is NaN: NaN stays, -0 stays.
                        v = _mm512_max_ps(_mm512_setzero_ps(), v);
                    }
                    _mm512_storeu_ps(cr.add(16 * w), v);
                }
            }
        } else {
            let mut tile = [[[0.0f32; 16]; W]; R];
            for r in 0..R {
                for w in 0..W {
                    _mm512_storeu_ps(tile[r][w].as_mut_ptr(), _mm512_mul_ps(acc[r][w], va));
                }
            }
            store_rows::<W>(t, tile.as_flattened());
        }
    }
}

/// `store_partial` for a tile kept as `R·W` blocks of 16 floats (row-major).
///
/// # Safety
/// As `store_partial`.
#[inline(always)]
unsafe fn store_rows<const W: usize>(t: &Tile, flat: &[[f32; 16]]) {
    for r in 0..t.mr {
        for x in 0..t.cols {
            let v = flat[r * W + x / 16][x % 16];
            let p = t.c.wrapping_offset(r as isize * t.rs + x as isize * t.cs);
            // SAFETY: element (r, x) of the tile lies in C per the contract.
            unsafe { *p = finish(t, r, x, if t.add { *p + v } else { v }) };
        }
    }
}

/// AVX-512 BF16 microkernel: `R` rows × 2 vectors of 16 columns, one `vdpbf16ps` per
/// pair of K: A's pair broadcast as a 32-bit word, B's pairs of 16 columns per vector.
///
/// # Safety
/// As [`tile512`] over the pair layout; AVX-512 F/BW/BF16 present.
#[inline(always)]
unsafe fn tile_bf16<const R: usize, const W: usize>(t: &Tile) {
    // SAFETY: as `tile512` (rows of 32-bit words instead of floats).
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); W]; R];
        let rows: [*const u32; R] =
            core::array::from_fn(|r| t.a.offset(r as isize * t.lda) as *const u32);
        let mut bp = t.b;
        for p in 0..t.kc {
            let bv: [__m512bh; W] = core::array::from_fn(|w| {
                core::mem::transmute::<__m512, __m512bh>(_mm512_loadu_ps(bp.add(16 * w)))
            });
            for r in 0..R {
                let av = core::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(
                    *rows[r].add(p) as i32,
                ));
                for w in 0..W {
                    acc[r][w] = _mm512_dpbf16_ps(acc[r][w], av, bv[w]);
                }
            }
            bp = bp.offset(t.ldb);
        }
        store512::<R, W>(t, acc);
    }
}

/// # Safety
/// As [`super::packed::gemm_packed_bf16`]; AVX-512 F/BW/VL/BF16 present.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")]
pub(super) unsafe fn run_bf16(j: &Job) {
    // A few rows: the packed GEMV over the pairs of K (one 32-bit word per column and
    // pair, A's pair broadcast as one word), `vdpbf16ps` in place of the FMA.
    if j.m <= GEMV_MAX_ROWS {
        // SAFETY: A's pairs are readable 32-bit words (the contract); the casts only
        // reinterpret 512 bits.
        let bcast = |a: *const f32| unsafe {
            core::mem::transmute::<__m512i, __m512>(_mm512_set1_epi32(*(a as *const i32)))
        };
        // SAFETY: as above.
        let dot = |x, b, acc| unsafe {
            _mm512_dpbf16_ps(
                acc,
                core::mem::transmute::<__m512, __m512bh>(x),
                core::mem::transmute::<__m512, __m512bh>(b),
            )
        };
        gemv_rows!(j, bcast, dot);
        return;
    }
    macro_rules! rows {
        ($t:expr, $w:literal, $($r:literal)*) => {
            match $t.mr {
                $($r => tile_bf16::<$r, $w>($t),)*
                _ => unreachable!("tile rows ≤ MR512"),
            }
        };
    }
    // SAFETY: forwarded contract; tiles of 1..=MR512 rows and 16 or 32 columns, a
    // divisor of the panel width.
    unsafe {
        if j.b.nr == 16 {
            drive(
                j,
                MR512,
                16,
                |t| rows!(t, 1, 1 2 3 4 5 6 7 8 9 10 11 12 13 14),
            );
        } else {
            drive(
                j,
                MR512,
                32,
                |t| rows!(t, 2, 1 2 3 4 5 6 7 8 9 10 11 12 13 14),
            );
        }
    }
}

/// Rows per AVX-512 tile.
const MR512: usize = 14;
/// 16-float vectors per AVX-512 tile row.
const W512: usize = 2;

/// The packed GEMV: `R` rows of A (at most [`GEMV_MAX_ROWS`]) against B one whole panel
/// of `16·W` columns at a time, the panel's `K × 16·W` floats read once, front to back —
/// one sequential stream the hardware prefetcher follows from L3 — with `U` steps of K in
/// flight in separate accumulators (`R·W·U` ≥ 8 chains hide the FMA latency), summed at
/// the panel's end and stored with the tile epilogue. For a product of a few rows the
/// 14-row tiles of [`drive`] would compute mostly padding in K blocks; this streams B at
/// the machine's cache bandwidth. `mlp` (four 512×512 layers, batch 1, weights in L3):
/// 0.80× the time of the row-streaming GEMV over the weights as stored (isolated kernels,
/// 4 weights in turn: 50 vs 63 µs).
///
/// # Safety
/// As [`super::packed::gemm_packed`] with `j.m == R`, `j.k ≥ 1`; `j.b.nr == 16·W`; AVX-512F
/// present.
#[inline(always)]
unsafe fn gemv512<const R: usize, const W: usize, const U: usize>(
    j: &Job,
    bcast: impl Fn(*const f32) -> __m512,
    fma: impl Fn(__m512, __m512, __m512) -> __m512,
) {
    let nr = 16 * W;
    let rows: [*const f32; R] = core::array::from_fn(|r| j.a.wrapping_offset(r as isize * j.lda));
    // SAFETY: A's rows r < R are readable at p < k; each panel q < ceil(n / nr) holds k
    // rows of nr floats; the stores as `store512` for the panel's first `cols` columns.
    unsafe {
        for q in 0..j.n.div_ceil(nr) {
            let panel = j.b.ptr.offset(q as isize * j.b.panel_stride);
            let mut acc = [[[_mm512_setzero_ps(); W]; R]; U];
            let mut p = 0;
            while p + U <= j.k {
                for u in 0..U {
                    let brow = panel.add((p + u) * nr);
                    let bv: [__m512; W] =
                        core::array::from_fn(|w| _mm512_loadu_ps(brow.add(16 * w)));
                    for r in 0..R {
                        let xv = bcast(rows[r].add(p + u));
                        for w in 0..W {
                            acc[u][r][w] = fma(xv, bv[w], acc[u][r][w]);
                        }
                    }
                }
                p += U;
            }
            while p < j.k {
                let brow = panel.add(p * nr);
                for r in 0..R {
                    let xv = bcast(rows[r].add(p));
                    for w in 0..W {
                        acc[0][r][w] = fma(xv, _mm512_loadu_ps(brow.add(16 * w)), acc[0][r][w]);
                    }
                }
                p += 1;
            }
            let mut sum = acc[0];
            for a in &acc[1..] {
                for r in 0..R {
                    for w in 0..W {
                        sum[r][w] = _mm512_add_ps(sum[r][w], a[r][w]);
                    }
                }
            }
            store512::<R, W>(&gemv_tile(j, R, panel, q * nr, nr), sum);
        }
    }
}

/// # Safety
/// As [`super::packed::gemm_packed`]; AVX-512F present.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn run_avx512(j: &Job) {
    // A few rows: the packed GEMV, `U` chosen for at least 8 accumulator chains.
    if j.m <= GEMV_MAX_ROWS {
        // SAFETY: A's elements are readable floats (the contract).
        let bcast = |a: *const f32| _mm512_set1_ps(unsafe { *a });
        let fma = |x, b, acc| _mm512_fmadd_ps(x, b, acc);
        gemv_rows!(j, bcast, fma);
        return;
    }
    // SAFETY: forwarded contract; every tile has 1..=MR512 rows, kc ≥ 1 and a width of 32
    // that divides every panel width (16-wide panels take the 16-wide kernel).
    unsafe {
        if j.b.nr == 16 {
            drive(j, MR512, 16, |t| {
                macro_rules! r16 {
                    ($($r:literal)*) => {
                        match t.mr {
                            $($r => tile512::<$r, 1>(t),)*
                            _ => unreachable!("tile rows ≤ MR512"),
                        }
                    };
                }
                r16!(1 2 3 4 5 6 7 8 9 10 11 12 13 14)
            });
        } else {
            drive(j, MR512, 16 * W512, |t| tile_x32(t));
        }
    }
}

/// AVX2 microkernel: `R` rows × 16 columns (two 8-float vectors).
///
/// # Safety
/// As [`tile512`]; AVX2 and FMA present.
#[inline(always)]
unsafe fn tile256<const R: usize>(t: &Tile) {
    // SAFETY: as `tile512`, 16 columns.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        let rows: [*const f32; R] = core::array::from_fn(|r| t.a.offset(r as isize * t.lda));
        let mut bp = t.b;
        for p in 0..t.kc {
            let b0 = _mm256_loadu_ps(bp);
            let b1 = _mm256_loadu_ps(bp.add(8));
            for r in 0..R {
                let av = _mm256_broadcast_ss(&*rows[r].add(p));
                acc[r][0] = _mm256_fmadd_ps(av, b0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(av, b1, acc[r][1]);
            }
            bp = bp.offset(t.ldb);
        }
        store256::<R, 2>(t, acc);
    }
}

/// The packed GEMV on AVX2 ([`gemv512`]'s scheme in 8-float vectors): `R` rows of A
/// against a chunk of `8·V` columns of each panel (the whole panel when it fits the
/// sixteen `ymm` registers: `R·V·U` accumulators and the broadcast; otherwise the chunks
/// one after another, each a stream of the panel's rows), `U` steps of K in flight, the
/// sum stored with the tile epilogue. Without it a product of a few rows took the 6×16
/// tiles, K block by K block, mostly padding.
///
/// # Safety
/// As [`super::packed::gemm_packed`] with `j.m == R`, `j.k ≥ 1`; `8·V` divides `j.b.nr`; AVX2
/// and FMA present.
#[inline(always)]
unsafe fn gemv256<const R: usize, const V: usize, const U: usize, X: Copy>(
    j: &Job,
    bcast: impl Fn(*const f32) -> X,
    fma: impl Fn(X, *const f32, __m256) -> __m256,
) {
    let (nr, width) = (j.b.nr, 8 * V);
    let rows: [*const f32; R] = core::array::from_fn(|r| j.a.wrapping_offset(r as isize * j.lda));
    // SAFETY: A's rows r < R are readable at p < k; each panel q < ceil(n / nr) holds k
    // rows of nr floats and every chunk x0 < nr lies inside them; the stores write the
    // first `cols` columns of the chunk in the R rows of C.
    unsafe {
        for q in 0..j.n.div_ceil(nr) {
            let panel = j.b.ptr.offset(q as isize * j.b.panel_stride);
            let mut x0 = 0;
            while x0 < nr && q * nr + x0 < j.n {
                let base = panel.add(x0);
                let mut acc = [[[_mm256_setzero_ps(); V]; R]; U];
                let mut p = 0;
                while p + U <= j.k {
                    for u in 0..U {
                        let brow = base.add((p + u) * nr);
                        for r in 0..R {
                            let xv = bcast(rows[r].add(p + u));
                            for v in 0..V {
                                acc[u][r][v] = fma(xv, brow.add(8 * v), acc[u][r][v]);
                            }
                        }
                    }
                    p += U;
                }
                while p < j.k {
                    let brow = base.add(p * nr);
                    for r in 0..R {
                        let xv = bcast(rows[r].add(p));
                        for v in 0..V {
                            acc[0][r][v] = fma(xv, brow.add(8 * v), acc[0][r][v]);
                        }
                    }
                    p += 1;
                }
                let mut sum = acc[0];
                for a in &acc[1..] {
                    for r in 0..R {
                        for v in 0..V {
                            sum[r][v] = _mm256_add_ps(sum[r][v], a[r][v]);
                        }
                    }
                }
                let col = q * nr + x0;
                store256::<R, V>(&gemv_tile(j, R, base, col, width), sum);
                x0 += width;
            }
        }
    }
}

/// Stores `R` rows × `V` vectors of 8 sums with the tile epilogue: in vectors when C's
/// rows are contiguous and the chunk is whole, through a stack tile otherwise.
///
/// # Safety
/// The first `t.cols` columns of the R rows of C writable; `t.bias` (if not null)
/// readable for `t.cols` floats, `t.row_bias` for R; AVX2 present.
#[inline(always)]
unsafe fn store256<const R: usize, const V: usize>(t: &Tile, acc: [[__m256; V]; R]) {
    // SAFETY: per the contract; the vector path only when all 8·V columns are C's.
    unsafe {
        let va = _mm256_set1_ps(t.alpha);
        if t.cs == 1 && t.cols == 8 * V {
            for r in 0..R {
                let cr = t.c.offset(r as isize * t.rs);
                for v in 0..V {
                    let mut x = _mm256_mul_ps(acc[r][v], va);
                    if t.add {
                        x = _mm256_add_ps(x, _mm256_loadu_ps(cr.add(8 * v)));
                    }
                    if !t.bias.is_null() {
                        x = _mm256_add_ps(x, _mm256_loadu_ps(t.bias.add(8 * v)));
                    }
                    if !t.row_bias.is_null() {
                        x = _mm256_add_ps(x, _mm256_set1_ps(*t.row_bias.add(r)));
                    }
                    if t.relu {
                        // The second operand when either is NaN: NaN stays, -0 stays.
                        x = _mm256_max_ps(_mm256_setzero_ps(), x);
                    }
                    _mm256_storeu_ps(cr.add(8 * v), x);
                }
            }
        } else {
            let mut tile = [[0.0f32; 64]; R];
            for r in 0..R {
                for v in 0..V {
                    _mm256_storeu_ps(
                        tile[r].as_mut_ptr().add(8 * v),
                        _mm256_mul_ps(acc[r][v], va),
                    );
                }
            }
            store_partial(t, &tile[..]);
        }
    }
}

/// One f32 step of the AVX2 kernels: A's element broadcast, times 8 floats of B.
///
/// # Safety
/// AVX2 and FMA present; `a` readable for a float, `b` for 8.
#[inline(always)]
unsafe fn f32_step() -> (
    impl Fn(*const f32) -> __m256 + Copy,
    impl Fn(__m256, *const f32, __m256) -> __m256 + Copy,
) {
    (
        // SAFETY: per the contract.
        |a: *const f32| unsafe { _mm256_broadcast_ss(&*a) },
        // SAFETY: per the contract.
        |x, b: *const f32, acc| unsafe { _mm256_fmadd_ps(x, _mm256_loadu_ps(b), acc) },
    )
}

/// A pair of K widened from bf16: the even step's floats, then the odd step's.
type F32Pair = (__m256, __m256);

/// One bf16 step of the AVX2 kernels (no AVX-512 BF16): a 32-bit word of A holds a pair
/// of K as bf16 (low half first), widened to two broadcast floats; each of the 8 words of
/// B at `b` holds one column's pair, widened the same way — the low half shifted up, the
/// high half masked — and both products added in f32, as `vdpbf16ps` does.
///
/// # Safety
/// AVX2 and FMA present; `a` readable for a 32-bit word, `b` for 8.
#[inline(always)]
unsafe fn bf16_step() -> (
    impl Fn(*const f32) -> F32Pair + Copy,
    impl Fn(F32Pair, *const f32, __m256) -> __m256 + Copy,
) {
    (
        // SAFETY: per the contract.
        |a: *const f32| unsafe {
            let w = _mm256_set1_epi32(*(a as *const i32));
            (
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(w)),
                _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(-65536))),
            )
        },
        // SAFETY: per the contract.
        |(lo, hi), b: *const f32, acc| unsafe {
            let w = _mm256_loadu_si256(b as *const __m256i);
            let acc = _mm256_fmadd_ps(lo, _mm256_castsi256_ps(_mm256_slli_epi32::<16>(w)), acc);
            _mm256_fmadd_ps(
                hi,
                _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(-65536))),
                acc,
            )
        },
    )
}

/// `dst[p]` = the float at `src + p` rounded to bf16 (to nearest even; a NaN stays a
/// NaN, quiet), as a float: [`crate::elem::f32_to_bf16`] eight at a time.
///
/// # Safety
/// `src` readable for `dst.len()` floats; AVX2 present.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn round_to_bf16_avx2(src: *const f32, dst: &mut [f32]) {
    let n = dst.len();
    let mut p = 0;
    // SAFETY: p + 8 ≤ n floats read from `src` and written to `dst`.
    unsafe {
        let (one, bias, high) = (
            _mm256_set1_epi32(1),
            _mm256_set1_epi32(0x7fff),
            _mm256_set1_epi32(-65536),
        );
        let quiet = _mm256_set1_epi32(0x0040_0000);
        while p + 8 <= n {
            let x = _mm256_loadu_ps(src.add(p));
            let b = _mm256_castps_si256(x);
            let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(b), one);
            let r = _mm256_and_si256(_mm256_add_epi32(b, _mm256_add_epi32(bias, lsb)), high);
            let nan = _mm256_or_si256(_mm256_and_si256(b, high), quiet);
            let v = _mm256_blendv_ps(
                _mm256_castsi256_ps(r),
                _mm256_castsi256_ps(nan),
                _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x),
            );
            _mm256_storeu_ps(dst.as_mut_ptr().add(p), v);
            p += 8;
        }
    }
    for (i, o) in dst.iter_mut().enumerate().skip(p) {
        // SAFETY: i < n, readable per the contract.
        *o = crate::elem::bf16_to_f32(crate::elem::f32_to_bf16(unsafe { *src.add(i) }));
    }
}

/// Widens `k.div_ceil(2)` rows of `nr` 32-bit words (pairs of K, low half first) into
/// `k` rows of `nr` floats: row `2t` the low halves, row `2t + 1` the high ones.
///
/// # Safety
/// `words` holds `k.div_ceil(2) · nr` words and `dst` `k · nr` floats; `nr` a multiple
/// of 8; AVX2 present.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn widen_pairs_avx2(words: &[u32], k: usize, nr: usize, dst: &mut [f32]) {
    let high = _mm256_set1_epi32(-65536);
    for (t, pair) in words.chunks_exact(nr).enumerate() {
        let odd = 2 * t + 1 < k;
        // SAFETY: rows 2t and (when odd) 2t + 1 of nr floats lie in `dst`; x + 8 ≤ nr
        // words of the pair row are read.
        unsafe {
            let (even_row, odd_row) = (
                dst.as_mut_ptr().add(2 * t * nr),
                dst.as_mut_ptr().wrapping_add((2 * t + 1) * nr),
            );
            for x in (0..nr).step_by(8) {
                let w = _mm256_loadu_si256(pair.as_ptr().add(x) as *const __m256i);
                _mm256_storeu_si256(even_row.add(x) as *mut __m256i, _mm256_slli_epi32::<16>(w));
                if odd {
                    _mm256_storeu_si256(odd_row.add(x) as *mut __m256i, _mm256_and_si256(w, high));
                }
            }
        }
    }
}

/// The packed GEMV on AVX2 for `j.m` (1 to [`GEMV_MAX_ROWS`]) rows, one step kind.
/// Chunks of `8·V` columns and `U` steps of K in flight: at least 8 accumulator chains,
/// at most 12 (with the broadcast, in 16 registers). Three rows take chunks of 16
/// columns: a whole 32-column panel (12 chains, 3 rows × 4 vectors) ran 1.3–1.5× slower
/// than two 16-column passes over it (`packed_bench avx2 3 512 512`).
macro_rules! gemv256_rows {
    ($j:expr, $step:expr) => {{
        let j: &Job = $j;
        let (b, f) = $step;
        // SAFETY: forwarded contract; `j.m` rows; every chunk width divides the panel
        // width (16, 32 or 64).
        unsafe {
            match (j.b.nr, j.m) {
                (16, 1) => gemv256::<1, 2, 4, _>(j, b, f),
                (32, 1) => gemv256::<1, 4, 2, _>(j, b, f),
                (_, 1) => gemv256::<1, 8, 1, _>(j, b, f),
                (16, 2) => gemv256::<2, 2, 2, _>(j, b, f),
                (_, 2) => gemv256::<2, 4, 1, _>(j, b, f),
                (_, 3) => gemv256::<3, 2, 2, _>(j, b, f),
                (_, _) => gemv256::<4, 2, 1, _>(j, b, f),
            }
        }
    }};
}

/// # Safety
/// As [`super::packed::gemm_packed`]; AVX2 and FMA present.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn run_avx2(j: &Job) {
    if j.m <= GEMV_MAX_ROWS {
        // SAFETY: AVX2 and FMA present; the GEMV reads A and B inside the job.
        gemv256_rows!(j, unsafe { f32_step() });
        return;
    }
    // SAFETY: forwarded contract; tiles of 1..=6 rows, 16 columns (divides every panel).
    unsafe {
        drive(j, 6, 16, |t| match t.mr {
            1 => tile256::<1>(t),
            2 => tile256::<2>(t),
            3 => tile256::<3>(t),
            4 => tile256::<4>(t),
            5 => tile256::<5>(t),
            _ => tile256::<6>(t),
        })
    }
}

/// bf16 weights without AVX-512 BF16, at most [`GEMV_MAX_ROWS`] rows: the packed GEMV
/// on pairs of K ([`bf16_step`]), streaming B's half-size panels.
///
/// # Safety
/// As [`super::packed::gemm_packed_bf16`]'s job (A's rows bf16 pairs, B's panels pair rows of
/// 32-bit words) with `j.m ≤ GEMV_MAX_ROWS`; AVX2 and FMA present.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn gemv_bf16_avx2(j: &Job) {
    // SAFETY: AVX2 and FMA present; the GEMV reads A and B inside the job.
    gemv256_rows!(j, unsafe { bf16_step() })
}
