//! The bf16 GEMM on Intel AMX (Advanced Matrix Extensions): `C = alpha·A·B (+ C)`, then the
//! tile epilogue, for an f32 A rounded to bf16, a packed bf16 B (the `--auto-cast matmult`
//! weights, [`crate::gemm_packed::PackedBf16`]) and an f32 C.
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
//! tile state lives across Rust code. A is rounded into host scratch with rows padded to
//! whole 32-pair chunks (zeros) and a multiple of the block's rows; a K that is not a
//! multiple of 32 takes its last chunk of B from a zero-padded 16-row copy (the packed panel
//! has no rows past K, and reading on would multiply the zeros of A by whatever follows —
//! a NaN there would poison the sum). The finished block goes through a 32×32 stack buffer
//! to C with the epilogue (alpha, accumulate, per-column and per-row bias, Relu) in AVX-512.
//!
//! Availability ([`bf16_available`]): CPUID's AMX-TILE and AMX-BF16, the tile state enabled
//! by the OS in XCR0, and Linux's per-process permission for the tile data
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`), asked once. `NRT_SIM_AMX=0` turns
//! the path off (the AVX-512 BF16 kernels then run), for comparisons.

use crate::Workspace;
use crate::gemm_packed::{PackedBf16, TileEpilogue};
use crate::matmul::Mat;
use core::sync::atomic::{AtomicU8, Ordering};

/// Whether the AMX bf16 path runs in this process (see the module docs); decided once.
pub fn bf16_available() -> bool {
    static STATE: AtomicU8 = AtomicU8::new(0); // 0 unknown, 1 no, 2 yes
    match STATE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let yes = detect();
            STATE.store(if yes { 2 } else { 1 }, Ordering::Relaxed);
            yes
        }
    }
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn detect() -> bool {
    use core::arch::x86_64::{__cpuid, __cpuid_count};
    if std::env::var_os("NRT_SIM_AMX").is_some_and(|v| v == "0") {
        return false;
    }
    // The rounding of A and the stores use AVX-512 F/BW/BF16 (every AMX CPU has them; a
    // hypervisor might still hide them).
    if !(std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512bf16"))
    {
        return false;
    }
    // CPUID.(7, 0):EDX bit 22 AMX-BF16, bit 24 AMX-TILE; CPUID.1:ECX bit 27 OSXSAVE.
    let leaf7 = __cpuid_count(7, 0);
    let (bf16, tile) = (leaf7.edx & (1 << 22) != 0, leaf7.edx & (1 << 24) != 0);
    if !(bf16 && tile) || __cpuid(1).ecx & (1 << 27) == 0 {
        return false;
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
        return false;
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
    r == 0
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn detect() -> bool {
    false
}

/// Pairs of K per tile chunk (a tile row is 64 bytes: 16 pairs of bf16).
const PAIRS: usize = 16;

/// `C = alpha·A·B` (`+=` when `accumulate`), then `epi`, on the tile unit (see the module
/// docs). `b.nr` must be 32 or 64.
///
/// # Safety
/// As [`crate::gemm_packed::gemm_packed_bf16`]; [`bf16_available`]; `m, n, k ≥ 1`.
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
) {
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
    let (abuf, tbuf, rowbuf) = ws.f32x3(rows * apairs, PAIRS * 32, apairs);
    for i in 0..rows {
        // SAFETY: the slots hold 2·apairs u16, f32-aligned.
        let h =
            unsafe { core::slice::from_raw_parts_mut(rowbuf.as_mut_ptr() as *mut u16, 2 * apairs) };
        if i < m {
            // SAFETY: A's row i is readable per the contract; AVX-512 F/BW/BF16 are present
            // (`bf16_available` checks them).
            unsafe {
                crate::matmul_half::avx512::round_row(
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
                    block(
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
                        cbuf.0.as_mut_ptr(),
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
}

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

/// One block of C into `c` (32 rows of 32 f32, 128 bytes apart; only the first 16 rows
/// when `!full`): `chunks` chunks of K from `a` (A's tiled layout: 1 KiB a chunk, rows 64
/// bytes apart; the second row tile `a_next` bytes on) and `b` (16 rows `ldb` bytes apart a
/// chunk, 32 columns), then, if `bt` is not null, one more chunk of A with B from `bt` (16
/// rows of 128 bytes).
///
/// # Safety
/// Every tile load inside its buffer as described; the tile unit usable.
#[allow(clippy::too_many_arguments)]
#[cfg(target_arch = "x86_64")]
unsafe fn block(
    full: bool,
    a: *const u8,
    a_next: usize,
    b: *const u8,
    ldb: usize,
    chunks: usize,
    bt: *const u8,
    c: *mut f32,
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
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
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
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
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
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
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
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
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

/// `n` iterations of four independent `tdpbf16ps` on tiles that stay in the tile registers
/// (the tile unit's register-only limit, [`crate::peak::Peak::Bf16Tile`]); returns one
/// element of the result so the work is not dead.
///
/// # Safety
/// [`bf16_available`].
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn tile_loop(n: u64) -> f32 {
    #[repr(C, align(64))]
    struct Buf([u16; 16 * 32]);
    let ones = Buf([0x3F80; 16 * 32]); // bf16 1.0
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
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm1, tmm4, tmm6",
            "tdpbf16ps tmm2, tmm4, tmm6",
            "tdpbf16ps tmm3, tmm4, tmm6",
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
