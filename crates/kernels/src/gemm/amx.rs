//! The bf16 GEMM on Intel AMX (Advanced Matrix Extensions): `C = alpha·A·B (+ C)`, then the
//! tile epilogue, for an f32 A rounded to bf16, a packed bf16 B (the `--auto-cast matmult`
//! weights, [`super::types::PackedBf16`]) and an f32 C.
//!
//! The tile unit multiplies a 16×32 bf16 tile of A by a 32×16 bf16 tile of B (stored as 16
//! rows of 16 pairs — exactly the rows of the packed panels) into a 16×16 f32 tile in one
//! `tdpbf16ps`: 8,192 multiply-adds, where one `vdpbf16ps` does 512. Measured on this
//! project's machine, one core: 3.6 TFLOP/s for `tdpbf16ps` in a register-only loop, against
//! 247 for the f32 FMA and 124 for `vdpbf16ps` in the same minutes
//! (`nrt bench --gemm` prints the three limits). The compiler's bf16 auto-cast exists to run
//! matmuls at the bf16 rate; this is that rate on a CPU that has it.
//!
//! Blocking: C in blocks of 32 rows × 32 columns (four accumulator tiles, two A tiles and
//! two B tiles: all eight tile registers), or 16 × 32 for a last block of ≤ 16 rows. A block's
//! whole K loop, its stores and the tile configuration run inside one `asm!` block, so no
//! tile state lives across Rust code. A is rounded into host scratch and stored tile by tile
//! (16 rows × 16 pairs, 1 KiB, one sequential stream per row tile), zeros past K and M; a K
//! that is not a multiple of 32 takes its last chunk of B from a zero-padded 16-row copy (the packed panel
//! has no rows past K, and reading on would multiply the zeros of A by whatever follows —
//! a NaN there would poison the sum). The finished block goes through a 32×32 stack buffer
//! to C with the epilogue (alpha, accumulate, per-column and per-row bias, Relu) in AVX-512.
//!
//! The int8 product of [`crate::qmatmul`] runs on the same blocks with `tdpbusd` (u8 × i8
//! quadruples into i32: 16,384 multiply-adds an instruction against `vpdpbusd`'s 64): its
//! packed words are the B tile rows too (`int8_products`).
//!
//! Availability ([`bf16_available`], [`int8_available`]): CPUID's AMX-TILE and AMX-BF16 /
//! AMX-INT8, the tile state enabled by the OS in XCR0, and Linux's per-process permission for
//! the tile data (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`), asked once.
//! `NRT_SIM_AMX=0` turns both paths off (the AVX-512 BF16 and VNNI kernels then run), for
//! comparisons.

use super::types::{Mat, PackedBf16, TileEpilogue};
use crate::{KernelError, Workspace};
use core::sync::atomic::{AtomicU8, Ordering};

/// Whether the AMX bf16 path runs in this process (see the module docs); decided once.
pub fn bf16_available() -> bool {
    features() & BF16 != 0
}

/// Whether the AMX int8 path (`tdpbusd`, [`crate::qmatmul`]) runs in this process.
pub fn int8_available() -> bool {
    features() & INT8 != 0
}

const KNOWN: u8 = 0x80;
const BF16: u8 = 1;
const INT8: u8 = 2;

/// The usable AMX features ([`BF16`], [`INT8`]), detected once.
fn features() -> u8 {
    static STATE: AtomicU8 = AtomicU8::new(0);
    match STATE.load(Ordering::Relaxed) {
        0 => {
            let f = detect() | KNOWN;
            STATE.store(f, Ordering::Relaxed);
            f
        }
        f => f,
    }
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn detect() -> u8 {
    use core::arch::x86_64::{__cpuid, __cpuid_count};
    if std::env::var_os("NRT_SIM_AMX").is_some_and(|v| v == "0") {
        return 0;
    }
    // The rounding of A and the stores use AVX-512 F/BW/BF16 (every AMX CPU has them; a
    // hypervisor might still hide them).
    // Off under `NRT_SIM_ISA=avx2` too (`crate::cpu`).
    if !crate::cpu::avx512bf16() {
        return 0;
    }
    // CPUID.(7, 0):EDX bit 22 AMX-BF16, bit 24 AMX-TILE, bit 25 AMX-INT8; CPUID.1:ECX bit
    // 27 OSXSAVE.
    let leaf7 = __cpuid_count(7, 0);
    let tile = leaf7.edx & (1 << 24) != 0;
    let units = (if leaf7.edx & (1 << 22) != 0 { BF16 } else { 0 })
        | (if leaf7.edx & (1 << 25) != 0 { INT8 } else { 0 });
    if !tile || units == 0 || __cpuid(1).ecx & (1 << 27) == 0 {
        return 0;
    }
    // XCR0 bits 17 (XTILECFG) and 18 (XTILEDATA): the OS saves the tile state.
    let (lo, _hi): (u32, u32);
    // SAFETY: OSXSAVE is set (checked above), so XGETBV with ECX = 0 is defined; it reads a
    // register and touches no memory.
    unsafe {
        core::arch::asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") _hi,
            options(nomem, nostack, preserves_flags));
    }
    if lo & (0b11 << 17) != 0b11 << 17 {
        return 0;
    }
    // Linux hands out the 8 KiB tile data state only to processes that ask (5.16+).
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: a plain syscall with integer arguments; it changes this process's permitted
    // extended state, nothing in memory.
    let r = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        )
    };
    if r == 0 { units } else { 0 }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn detect() -> u8 {
    0
}

/// Pairs of K per tile chunk (a tile row is 64 bytes: 16 pairs of bf16).
const PAIRS: usize = 16;

/// `C = alpha·A·B` (`+=` when `accumulate`), then `epi`, on the tile unit (see the module
/// docs). `b.nr` must be 32 or 64.
///
/// # Safety
/// As [`super::packed::gemm_packed_bf16`]; [`bf16_available`]; `m, n, k ≥ 1`.
#[allow(clippy::too_many_arguments)]
#[cfg(target_arch = "x86_64")]
pub unsafe fn gemm_packed_bf16(
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: PackedBf16,
    c: Mat,
    alpha: f32,
    accumulate: bool,
    epi: TileEpilogue,
    ws: &mut Workspace,
) -> Result<(), KernelError> {
    debug_assert!(bf16_available() && (b.nr == 32 || b.nr == 64) && m > 0 && n > 0 && k > 0);
    let kp = k.div_ceil(2); // pairs of K in B's rows
    let chunks = kp / PAIRS; // whole chunks read straight from the panels
    let tail = kp % PAIRS; // pairs of the last, partial chunk
    let apairs = kp.div_ceil(PAIRS) * PAIRS; // A's row pitch, in pairs
    let rows = m.div_ceil(32) * 32;
    // A rounded to bf16 and stored tile by tile: row tile t (rows 16t..16t + 16), chunk q
    // (pairs 16q..16q + 16) is the 1 KiB at (t·nq + q)·1 KiB, rows 64 bytes apart — so the
    // K loop reads A as one sequential stream per row tile (with rows 2·K bytes apart, 32
    // rows of A plus 16 of B were more streams than the prefetchers follow, and the tile
    // loads waited on L2). Zeros past K and M. Then a zeroed 16-row × 32-pair copy of the
    // tail of B, and one row of A rounded (scratch).
    let nq = apairs / PAIRS;
    let (abuf, tbuf, rowbuf) = ws.f32x3(rows.saturating_mul(apairs), PAIRS * 32, apairs)?;
    for i in 0..rows {
        // SAFETY: the slots hold 2·apairs u16, f32-aligned.
        let h =
            unsafe { core::slice::from_raw_parts_mut(rowbuf.as_mut_ptr() as *mut u16, 2 * apairs) };
        if i < m {
            // SAFETY: A's row i is readable per the contract; AVX-512 F/BW/BF16 are present
            // (`bf16_available` checks them).
            unsafe {
                super::types::avx512::round_row(
                    a.ptr.wrapping_offset(i as isize * a.rs),
                    a.cs,
                    &mut h[..k],
                )
            };
            h[k..].fill(0);
        } else {
            h.fill(0);
        }
        let (t, r) = (i / 16, i % 16);
        for q in 0..nq {
            let dst = ((t * nq + q) * 16 + r) * PAIRS;
            abuf[dst..dst + PAIRS].copy_from_slice(&rowbuf[q * PAIRS..(q + 1) * PAIRS]);
        }
    }
    tbuf.fill(0.0);
    let tile_bytes = 16 * PAIRS * 4; // one A tile: 16 rows of 64 bytes
    let ldb = b.nr * 4; // bytes between a panel's rows
    let mut cbuf = CBlock([0.0; 32 * 32]);
    for q in 0..n.div_ceil(b.nr) {
        let panel = b.ptr.wrapping_offset(q as isize * b.panel_stride) as *const u8;
        let mut s = 0;
        while s < b.nr && q * b.nr + s < n {
            let col = q * b.nr + s;
            let bp = panel.wrapping_add(s * 4);
            if tail > 0 {
                // Rows chunks·16.. of the panel's columns s..s + 32, zero-padded to 16 rows.
                for (r, dst) in tbuf.chunks_exact_mut(32).enumerate().take(tail) {
                    let src = bp.wrapping_add((chunks * PAIRS + r) * ldb) as *const f32;
                    // SAFETY: row chunks·16 + r < kp of the panel, 32 words from column s
                    // (s + 32 ≤ nr): inside the panel per the contract.
                    dst.copy_from_slice(unsafe { core::slice::from_raw_parts(src, 32) });
                }
            }
            let mut i0 = 0;
            while i0 < m {
                let full = m - i0 > 16;
                // SAFETY: A's scratch holds row tiles i0/16 and i0/16 + 1 (rows is a
                // multiple of 32), nq chunks each; B's panel holds `chunks` chunks of 16 rows from row 0, 32
                // columns from s; the tail copy holds 16 rows of 128 bytes; `cbuf` is 32 rows
                // of 128 bytes; the tile unit is usable (`bf16_available`).
                unsafe {
                    block_bf16(
                        full,
                        (abuf.as_ptr() as *const u8).add((i0 / 16) * nq * tile_bytes),
                        nq * tile_bytes,
                        bp,
                        ldb,
                        chunks,
                        if tail > 0 {
                            tbuf.as_ptr() as *const u8
                        } else {
                            core::ptr::null()
                        },
                        cbuf.0.as_mut_ptr() as *mut u8,
                    )
                };
                let (mr, cols) = ((m - i0).min(32), (n - col).min(32));
                // SAFETY: C's rows i0..i0 + mr and columns col..col + cols are in C; the
                // biases cover them per the contract.
                unsafe { store(&cbuf.0, mr, cols, c, i0, col, alpha, accumulate, epi) };
                i0 += 32;
            }
            s += 32;
        }
    }
    Ok(())
}

/// The raw sums of the packed int8 product (`Σ` over words of four `u8 × i8` products, as
/// `vpdpbusd` computes them in [`crate::qmatmul`]) in blocks of 32 rows × 32 columns on the
/// tile unit (`tdpbusd`), each handed to `sink(i0, j0, rows, cols, block)` (block row `r`,
/// column `x` is C's `(i0 + r, j0 + x)`; `rows ≤ 32`, `cols ≤ 32` are the valid ones).
///
/// `apack`: `m` rows of `k4` words (A's bytes, four k a word); `bpack`: `k4` rows of `np`
/// words (B's quadruples, one column a word; `np ≥ ⌈n/32⌉·32`); `tiles`: scratch of at least
/// [`int8_scratch_words`] words. As for bf16, A is re-laid tile by tile with zeros past K
/// and M, and a partial last K chunk of B is read from a zero-padded copy.
///
/// # Safety
/// [`int8_available`]; `m, n, k4 ≥ 1`; the slices as described.
#[allow(clippy::too_many_arguments)]
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn int8_products(
    m: usize,
    n: usize,
    k4: usize,
    apack: &[i32],
    bpack: &[i32],
    np: usize,
    tiles: &mut [i32],
    mut sink: impl FnMut(usize, usize, usize, usize, &[[i32; 32]; 32]),
) {
    debug_assert!(int8_available() && m > 0 && n > 0 && k4 > 0);
    let nq = k4.div_ceil(PAIRS);
    let (chunks, tail) = (k4 / PAIRS, k4 % PAIRS);
    let rows = m.div_ceil(32) * 32;
    assert!(
        apack.len() >= m * k4
            && bpack.len() >= k4 * np
            && np >= n.div_ceil(32) * 32
            && tiles.len() >= int8_scratch_words(m, k4)
    );
    let (abuf, tbuf) = tiles.split_at_mut(rows * nq * PAIRS);
    let tbuf = &mut tbuf[..PAIRS * 32];
    for t in 0..rows / 16 {
        for q in 0..nq {
            for r in 0..16 {
                let i = 16 * t + r;
                let dst = &mut abuf[((t * nq + q) * 16 + r) * PAIRS..][..PAIRS];
                let w0 = q * PAIRS;
                if i < m && w0 < k4 {
                    let take = PAIRS.min(k4 - w0);
                    dst[..take].copy_from_slice(&apack[i * k4 + w0..][..take]);
                    dst[take..].fill(0);
                } else {
                    dst.fill(0);
                }
            }
        }
    }
    tbuf.fill(0);
    let tile_bytes = 16 * PAIRS * 4;
    let ldb = np * 4;
    let mut blk = IBlock([[0; 32]; 32]);
    let mut j0 = 0;
    while j0 < n {
        let bp = bpack[j0..].as_ptr() as *const u8;
        if tail > 0 {
            for (r, dst) in tbuf.chunks_exact_mut(32).enumerate().take(tail) {
                dst.copy_from_slice(&bpack[(chunks * PAIRS + r) * np + j0..][..32]);
            }
        }
        let mut i0 = 0;
        while i0 < m {
            // SAFETY: A's tiles hold row tiles i0/16 and i0/16 + 1 (rows is a multiple of
            // 32), nq chunks each; B holds `chunks` chunks of 16 rows of np words, 32 words
            // from j0 (np ≥ j0 + 32); the tail copy 16 rows of 128 bytes; `blk` 32 rows of
            // 128 bytes; the tile unit is usable (`int8_available`).
            unsafe {
                block_u8i8(
                    m - i0 > 16,
                    (abuf.as_ptr() as *const u8).add((i0 / 16) * nq * tile_bytes),
                    nq * tile_bytes,
                    bp,
                    ldb,
                    chunks,
                    if tail > 0 {
                        tbuf.as_ptr() as *const u8
                    } else {
                        core::ptr::null()
                    },
                    blk.0.as_mut_ptr() as *mut u8,
                )
            };
            sink(i0, j0, (m - i0).min(32), (n - j0).min(32), &blk.0);
            i0 += 32;
        }
        j0 += 32;
    }
}

/// Words of scratch [`int8_products`] needs.
pub(crate) fn int8_scratch_words(m: usize, k4: usize) -> usize {
    m.div_ceil(32) * 32 * k4.div_ceil(PAIRS) * PAIRS + PAIRS * 32
}

/// A finished 32×32 block of int8 sums, 64-byte aligned for the tile stores.
#[repr(C, align(64))]
struct IBlock([[i32; 32]; 32]);

/// A finished 32×32 block of C, 64-byte aligned for the tile stores.
#[repr(C, align(64))]
struct CBlock([f32; 32 * 32]);

/// The tile configuration (palette 1): tiles 0–3 the accumulators (16 rows of 16 f32), 4–5
/// A (16 rows of 32 bf16), 6–7 B (16 rows of 16 pairs).
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

const CONFIG: TileConfig = TileConfig {
    palette: 1,
    start_row: 0,
    reserved: [0; 14],
    colsb: [64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0],
    rows: [16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0],
};

/// Defines a block function for one tile multiply instruction (`tdpbf16ps`: bf16 pairs into
/// f32; `tdpbusd`: u8 × i8 quadruples into i32). Both read A and B tiles of 16 rows of 64
/// bytes (16 four-byte units) and accumulate 16×16 four-byte sums, so one layout and one
/// loop serve both.
macro_rules! tile_block {
    ($name:ident, $dp:literal) => {
        /// One block of C into `c` (32 rows of 32 four-byte sums, 128 bytes apart; only the first 16 rows
        /// when `!full`): `chunks` chunks of K from `a` (A's tiled layout: 1 KiB a chunk, rows 64
        /// bytes apart; the second row tile `a_next` bytes on) and `b` (16 rows `ldb` bytes apart a
        /// chunk, 32 columns), then, if `bt` is not null, one more chunk of A with B from `bt` (16
        /// rows of 128 bytes).
        ///
        /// # Safety
        /// Every tile load inside its buffer as described; the tile unit usable.
        #[allow(clippy::too_many_arguments)]
        #[cfg(target_arch = "x86_64")]
        unsafe fn $name(
            full: bool,
            a: *const u8,
            a_next: usize,
            b: *const u8,
            ldb: usize,
            chunks: usize,
            bt: *const u8,
            c: *mut u8,
        ) {
            let cfg = &CONFIG;
            let a1 = a.wrapping_add(a_next);
            let lda = 64usize;
            let bstep = 16 * ldb;
            if full {
                // SAFETY: the caller's contract; the block configures, uses and releases the tiles
                // itself, so no tile state outlives it.
                unsafe {
                    core::arch::asm!(
                        "ldtilecfg [{cfg}]",
                        "tilezero tmm0",
                        "tilezero tmm1",
                        "tilezero tmm2",
                        "tilezero tmm3",
                        "test {n}, {n}",
                        "jz 3f",
                        "2:",
                        "tileloadd tmm4, [{a0} + {lda}*1]",
                        "tileloadd tmm5, [{a1} + {lda}*1]",
                        "tileloadd tmm6, [{b} + {ldb}*1]",
                        "tileloadd tmm7, [{b} + {ldb}*1 + 64]",
                        concat!($dp, " tmm0, tmm4, tmm6"),
                        concat!($dp, " tmm1, tmm4, tmm7"),
                        concat!($dp, " tmm2, tmm5, tmm6"),
                        concat!($dp, " tmm3, tmm5, tmm7"),
                        "add {a0}, 1024",
                        "add {a1}, 1024",
                        "add {b}, {bstep}",
                        "dec {n}",
                        "jnz 2b",
                        "3:",
                        "test {bt}, {bt}",
                        "jz 4f",
                        "tileloadd tmm4, [{a0} + {lda}*1]",
                        "tileloadd tmm5, [{a1} + {lda}*1]",
                        "tileloadd tmm6, [{bt} + {s128}*1]",
                        "tileloadd tmm7, [{bt} + {s128}*1 + 64]",
                        concat!($dp, " tmm0, tmm4, tmm6"),
                        concat!($dp, " tmm1, tmm4, tmm7"),
                        concat!($dp, " tmm2, tmm5, tmm6"),
                        concat!($dp, " tmm3, tmm5, tmm7"),
                        "4:",
                        "tilestored [{c} + {s128}*1], tmm0",
                        "tilestored [{c} + {s128}*1 + 64], tmm1",
                        "tilestored [{c} + {s128}*1 + 2048], tmm2",
                        "tilestored [{c} + {s128}*1 + 2112], tmm3",
                        "tilerelease",
                        cfg = in(reg) cfg,
                        a0 = inout(reg) a => _,
                        a1 = inout(reg) a1 => _,
                        lda = in(reg) lda,
                        b = inout(reg) b => _,
                        ldb = in(reg) ldb,
                        bstep = in(reg) bstep,
                        n = inout(reg) chunks => _,
                        bt = in(reg) bt,
                        s128 = in(reg) 128usize,
                        c = in(reg) c,
                        options(nostack),
                    );
                }
            } else {
                // SAFETY: as above, with one A tile (rows 0..16) and two accumulators.
                unsafe {
                    core::arch::asm!(
                        "ldtilecfg [{cfg}]",
                        "tilezero tmm0",
                        "tilezero tmm1",
                        "test {n}, {n}",
                        "jz 3f",
                        "2:",
                        "tileloadd tmm4, [{a0} + {lda}*1]",
                        "tileloadd tmm6, [{b} + {ldb}*1]",
                        "tileloadd tmm7, [{b} + {ldb}*1 + 64]",
                        concat!($dp, " tmm0, tmm4, tmm6"),
                        concat!($dp, " tmm1, tmm4, tmm7"),
                        "add {a0}, 1024",
                        "add {b}, {bstep}",
                        "dec {n}",
                        "jnz 2b",
                        "3:",
                        "test {bt}, {bt}",
                        "jz 4f",
                        "tileloadd tmm4, [{a0} + {lda}*1]",
                        "tileloadd tmm6, [{bt} + {s128}*1]",
                        "tileloadd tmm7, [{bt} + {s128}*1 + 64]",
                        concat!($dp, " tmm0, tmm4, tmm6"),
                        concat!($dp, " tmm1, tmm4, tmm7"),
                        "4:",
                        "tilestored [{c} + {s128}*1], tmm0",
                        "tilestored [{c} + {s128}*1 + 64], tmm1",
                        "tilerelease",
                        cfg = in(reg) cfg,
                        a0 = inout(reg) a => _,
                        lda = in(reg) lda,
                        b = inout(reg) b => _,
                        ldb = in(reg) ldb,
                        bstep = in(reg) bstep,
                        n = inout(reg) chunks => _,
                        bt = in(reg) bt,
                        s128 = in(reg) 128usize,
                        c = in(reg) c,
                        options(nostack),
                    );
                }
            }
        }
    };
}

tile_block!(block_bf16, "tdpbf16ps");
tile_block!(block_u8i8, "tdpbusd");

/// Writes rows `0..mr` and columns `0..cols` of a finished block (`blk`, rows of 32) into C
/// at (`i0`, `j0`): scaled by alpha, added to C when `accumulate`, then the epilogue.
///
/// # Safety
/// The block's C elements writable; `epi`'s biases readable over them.
#[allow(clippy::too_many_arguments)]
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn store(
    blk: &[f32; 32 * 32],
    mr: usize,
    cols: usize,
    c: Mat,
    i0: usize,
    j0: usize,
    alpha: f32,
    accumulate: bool,
    epi: TileEpilogue,
) {
    use core::arch::x86_64::*;
    let va = _mm512_set1_ps(alpha);
    let zero = _mm512_setzero_ps();
    let masks = [
        ((1u32 << cols.min(16)) - 1) as u16,
        ((1u32 << cols.saturating_sub(16)) - 1) as u16,
    ];
    for r in 0..mr {
        let row = c
            .ptr
            .wrapping_offset((i0 + r) as isize * c.rs + j0 as isize * c.cs);
        // SAFETY: row r of C at columns j0..j0 + cols, and the biases there, per the
        // contract; masked lanes are not touched.
        unsafe {
            let rb = if epi.row_bias.is_null() {
                None
            } else {
                Some(_mm512_set1_ps(*epi.row_bias.add(i0 + r)))
            };
            for (h, &mk) in masks.iter().enumerate() {
                if mk == 0 {
                    continue;
                }
                let mut v = _mm512_mul_ps(_mm512_loadu_ps(blk.as_ptr().add(r * 32 + 16 * h)), va);
                if c.cs == 1 {
                    let p = row.add(16 * h);
                    if accumulate {
                        v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mk, p));
                    }
                    if !epi.bias.is_null() {
                        v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mk, epi.bias.add(j0 + 16 * h)));
                    }
                    if let Some(rb) = rb {
                        v = _mm512_add_ps(v, rb);
                    }
                    if epi.relu {
                        // The second operand when either is NaN: NaN stays, as elsewhere.
                        v = _mm512_max_ps(zero, v);
                    }
                    _mm512_mask_storeu_ps(p, mk, v);
                } else {
                    let mut t = [0f32; 16];
                    _mm512_storeu_ps(t.as_mut_ptr(), v);
                    for (x, &tv) in t.iter().enumerate().take(cols - 16 * h) {
                        let jx = 16 * h + x;
                        let p = row.wrapping_offset(jx as isize * c.cs);
                        let mut e = tv;
                        if accumulate {
                            e += *p;
                        }
                        if !epi.bias.is_null() {
                            e += *epi.bias.add(j0 + jx);
                        }
                        if !epi.row_bias.is_null() {
                            e += *epi.row_bias.add(i0 + r);
                        }
                        *p = if epi.relu && e < 0.0 { 0.0 } else { e };
                    }
                }
            }
        }
    }
}

/// Defines a register-only loop for one tile multiply instruction.
macro_rules! tile_loop {
    ($name:ident, $dp:literal) => {
        /// `n` iterations of four independent tile multiplies on tiles that stay in the tile
        /// registers (the tile unit's register-only limit, [`crate::peak::Peak`]); returns
        /// one element of the result so the work is not dead.
        ///
        /// # Safety
        /// The instruction's AMX feature usable ([`bf16_available`], [`int8_available`]).
        #[cfg(target_arch = "x86_64")]
        pub(crate) unsafe fn $name(n: u64) -> f32 {
            #[repr(C, align(64))]
            struct Buf([u16; 16 * 32]);
            let ones = Buf([0x3F80; 16 * 32]); // bf16 1.0 (as bytes: 0x80, 0x3F)
            let mut out = CBlock([0.0; 32 * 32]);
            // SAFETY: the tile unit is usable; the loads read `ones` (16 rows of 64 bytes) and the
            // store writes the first 16 rows of `out` (128 bytes apart); the tiles are configured,
            // used and released inside the block.
            unsafe {
                core::arch::asm!(
                    "ldtilecfg [{cfg}]",
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tilezero tmm2",
                    "tilezero tmm3",
                    "tileloadd tmm4, [{a} + {s64}*1]",
                    "tileloadd tmm6, [{a} + {s64}*1]",
                    "test {n}, {n}",
                    "jz 3f",
                    "2:",
                    concat!($dp, " tmm0, tmm4, tmm6"),
                    concat!($dp, " tmm1, tmm4, tmm6"),
                    concat!($dp, " tmm2, tmm4, tmm6"),
                    concat!($dp, " tmm3, tmm4, tmm6"),
                    "dec {n}",
                    "jnz 2b",
                    "3:",
                    "tilestored [{c} + {s128}*1], tmm0",
                    "tilerelease",
                    cfg = in(reg) &CONFIG,
                    a = in(reg) ones.0.as_ptr(),
                    s64 = in(reg) 64usize,
                    n = inout(reg) n => _,
                    c = in(reg) out.0.as_mut_ptr(),
                    s128 = in(reg) 128usize,
                    options(nostack),
                );
            }
            out.0[0]
        }
    };
}

tile_loop!(tile_loop_bf16, "tdpbf16ps");
tile_loop!(tile_loop_u8i8, "tdpbusd");
