//! The tile driver of the packed GEMM ([`super::packed`]): one product ([`Job`]), the tiles
//! a microkernel computes ([`Tile`]), the loop nest over them ([`drive`]) and the stores of
//! partial tiles.

use super::types::{Mat, Packed, TileEpilogue};
use nrt_hal::tuning::{GEMM_PACKED_B_BLOCK_BYTES, GEMM_PACKED_KC};

/// One product, A contiguous along K.
pub(super) struct Job {
    pub(super) m: usize,
    pub(super) n: usize,
    pub(super) k: usize,
    pub(super) a: *const f32,
    pub(super) lda: isize,
    pub(super) b: Packed,
    pub(super) c: Mat,
    pub(super) alpha: f32,
    pub(super) accumulate: bool,
    pub(super) epi: TileEpilogue,
}

/// One tile of C computed by a microkernel, as it is handed to [`drive`]: rows `i0..i0+mr`,
/// `cols` columns from `j0`, K range `p0..p0+kc`; `add`: add to C instead of overwriting it.
#[derive(Clone, Copy)]
pub(super) struct Tile {
    pub(super) a: *const f32,
    pub(super) lda: isize,
    pub(super) b: *const f32,
    pub(super) ldb: isize,
    pub(super) kc: usize,
    pub(super) mr: usize,
    pub(super) cols: usize,
    pub(super) c: *mut f32,
    pub(super) rs: isize,
    pub(super) cs: isize,
    pub(super) alpha: f32,
    pub(super) add: bool,
    /// The epilogue's bias at the tile's first column and row bias at its first row (null:
    /// none), and Relu; only on the last K block.
    pub(super) bias: *const f32,
    pub(super) row_bias: *const f32,
    pub(super) relu: bool,
}

/// Walks the product in K blocks, row blocks of `mr_max` and column chunks of `width` (a
/// divisor of every panel width) and hands each tile to `kernel`.
///
/// # Safety
/// As [`super::packed::gemm_packed`]; `kernel` sound for every tile it is given.
#[inline(always)]
pub(super) unsafe fn drive(j: &Job, mr_max: usize, width: usize, kernel: impl Fn(&Tile)) {
    let nr = j.b.nr;
    let panels = j.n.div_ceil(nr);
    let mut p0 = 0;
    while p0 < j.k {
        let kc = GEMM_PACKED_KC.min(j.k - p0);
        let add = j.accumulate || p0 > 0;
        let last = p0 + kc == j.k;
        // Panels per column block: the block's K×width slice of B stays in L2 while every row
        // block of A passes over it.
        let chunk = (GEMM_PACKED_B_BLOCK_BYTES / size_of::<f32>() / (kc * nr)).max(1);
        let mut q0 = 0;
        while q0 < panels {
            let q1 = (q0 + chunk).min(panels);
            let mut i0 = 0;
            while i0 < j.m {
                let mr = mr_max.min(j.m - i0);
                for q in q0..q1 {
                    let panel =
                        j.b.ptr
                            .wrapping_offset(q as isize * j.b.panel_stride)
                            .wrapping_add(p0 * nr);
                    let mut s = 0;
                    while s < nr && q * nr + s < j.n {
                        let col = q * nr + s;
                        kernel(&Tile {
                            a: j.a.wrapping_offset(i0 as isize * j.lda).wrapping_add(p0),
                            lda: j.lda,
                            b: panel.wrapping_add(s),
                            ldb: nr as isize,
                            kc,
                            mr,
                            cols: width.min(j.n - col),
                            c: j.c
                                .ptr
                                .wrapping_offset(i0 as isize * j.c.rs + col as isize * j.c.cs),
                            rs: j.c.rs,
                            cs: j.c.cs,
                            alpha: j.alpha,
                            add,
                            bias: if last && !j.epi.bias.is_null() {
                                j.epi.bias.wrapping_add(col)
                            } else {
                                core::ptr::null()
                            },
                            row_bias: if last && !j.epi.row_bias.is_null() {
                                j.epi.row_bias.wrapping_add(i0)
                            } else {
                                core::ptr::null()
                            },
                            relu: last && j.epi.relu,
                        });
                        s += width;
                    }
                }
                i0 += mr;
            }
            q0 = q1;
        }
        p0 += kc;
    }
}

/// Writes a finished `mr × width` tile (`t[r][x]`, already scaled by alpha) into C: its
/// first `cols` columns, added when `add`.
///
/// # Safety
/// The tile's C elements writable.
#[inline(always)]
pub(super) unsafe fn store_partial<const WIDTH: usize>(t: &Tile, tile: &[[f32; WIDTH]]) {
    for (r, row) in tile.iter().enumerate().take(t.mr) {
        for (x, v) in row.iter().enumerate().take(t.cols) {
            let p = t.c.wrapping_offset(r as isize * t.rs + x as isize * t.cs);
            // SAFETY: element (r, x) of the tile lies in C per the contract.
            unsafe { *p = finish(t, r, x, if t.add { *p + v } else { *v }) };
        }
    }
}

/// The tile epilogue on the element of row `r` and column `x` of the tile (the order of
/// the vector paths: the sum, then the column bias, then the row bias, then Relu).
///
/// # Safety
/// `t.bias` (if not null) readable at `x`, `t.row_bias` (if not null) at `r`.
#[inline(always)]
pub(super) unsafe fn finish(t: &Tile, r: usize, x: usize, mut v: f32) -> f32 {
    if !t.bias.is_null() {
        // SAFETY: per the contract.
        v += unsafe { *t.bias.add(x) };
    }
    if !t.row_bias.is_null() {
        // SAFETY: per the contract.
        v += unsafe { *t.row_bias.add(r) };
    }
    if t.relu && v < 0.0 { 0.0 } else { v }
}

/// The tile a packed GEMV stores: the job's first `rows` rows, `width` columns from `col`
/// (fewer past N), the whole K, with the job's epilogue; `b` where its columns start in the
/// panel (the store reads only C, the bias and the row bias).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn gemv_tile(j: &Job, rows: usize, b: *const f32, col: usize, width: usize) -> Tile {
    Tile {
        a: j.a,
        lda: j.lda,
        b,
        ldb: j.b.nr as isize,
        kc: j.k,
        mr: rows,
        cols: width.min(j.n - col),
        c: j.c.ptr.wrapping_offset(col as isize * j.c.cs),
        rs: j.c.rs,
        cs: j.c.cs,
        alpha: j.alpha,
        add: j.accumulate,
        bias: if j.epi.bias.is_null() {
            core::ptr::null()
        } else {
            j.epi.bias.wrapping_add(col)
        },
        row_bias: j.epi.row_bias,
        relu: j.epi.relu,
    }
}
