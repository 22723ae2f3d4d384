//! GEMM against a B packed once (constant weights): `C (+)= alpha · A · B` where B is stored
//! in column panels of `nr` columns (16, 32 or 64), each panel `K × nr` floats, row after row
//! (`B[p, j]` at `panel(j / nr) + p·nr + j % nr`), the last panel zero-padded past N.
//!
//! The GEMM crate ([`super::sgemm::gemm_f32`]) packs both operands on every call; for a
//! constant B that work is done once by the compiler ([`pack_b`], see `docs/ARCHITECTURE.md`),
//! and A is read in place (rows contiguous along K; otherwise copied once per call into the
//! workspace). The microkernel keeps an `MR × 16·W` tile of C in registers, loads `W` vectors
//! of the B panel per step of K and broadcasts one element of each row of A:
//! - AVX-512F (detected at run time): 14 rows × 32 columns (28 accumulators, the K loop in
//!   `asm!`: see `tile_asm`), 16-column panels 14 × 16 in intrinsics; bf16 weights
//!   (pairs of K per 32-bit word) take the same tiles with `vdpbf16ps` ([`gemm_packed_bf16`]);
//! - AVX-512F, at most [`nrt_hal::tuning::GEMV_MAX_ROWS`] rows of A (f32 and bf16): the
//!   packed GEMV instead of tiles — one whole panel at a time, read front to back as one
//!   sequential stream, several steps of K in flight in separate accumulators;
//! - AVX2 + FMA: 6 rows × 16 columns (12 accumulators); at most `GEMV_MAX_ROWS` rows, the
//!   packed GEMV in 8-float vectors (a panel, or 16-column chunks of it, at a time);
//! - elsewhere: a portable loop over the same layout.
//!
//! Loop order: K in blocks of [`nrt_hal::tuning::GEMM_PACKED_KC`], then column blocks of B
//! ([`nrt_hal::tuning::GEMM_PACKED_B_BLOCK_BYTES`], kept in L2), then row blocks of A (kept
//! in L1 while every panel of the column block streams past from L2), then panels. Partial
//! tiles (rows past M, columns past N, a strided C) go through a stack tile, so nothing is
//! ever allocated.

#[cfg(target_arch = "x86_64")]
use super::packed_x86 as x86;
use super::tile::{Job, drive, store_partial};
use super::types::Mat;
use crate::{KernelError, Workspace};
use nrt_hal::tuning::GEMM_PACKED_B_BLOCK_BYTES;

pub use super::types::{Packed, PackedBf16, TileEpilogue};
pub use nrt_isa::matmul_flags::{PANEL_WIDTHS, pack_b, packed_len};

/// `C = alpha·A·B` (`C += …` when `accumulate`), then `epi`, for an `m×k` A (any strides), a
/// packed `k×n` B and an `m×n` C (any strides).
///
/// # Safety
/// A readable and C writable for every element their shape and strides address; B readable
/// for `ceil(n / nr)` panels of `k·nr` floats; `epi.bias` (if not null) readable for `n`
/// floats and `epi.row_bias` for `m`; C overlapping none of them.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_packed(
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: Packed,
    c: Mat,
    alpha: f32,
    accumulate: bool,
    epi: TileEpilogue,
    ws: &mut Workspace,
) -> Result<(), KernelError> {
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        for i in 0..m {
            for j in 0..n {
                let p = c.ptr.wrapping_offset(i as isize * c.rs + j as isize * c.cs);
                // SAFETY: C element in bounds per the contract; bias[j] readable.
                unsafe {
                    let mut v = if accumulate { *p } else { 0.0 };
                    if !epi.bias.is_null() {
                        v += *epi.bias.add(j);
                    }
                    if !epi.row_bias.is_null() {
                        v += *epi.row_bias.add(i);
                    }
                    *p = if epi.relu && v < 0.0 { 0.0 } else { v };
                }
            }
        }
        return Ok(());
    }
    // A with unit stride along K whose rows do not alias in L1: in place, else one copy per
    // call with rows `k` (or `k + 16`) floats apart.
    let (ap, lda) = if a.cs == 1 && !rows_alias(a.rs.unsigned_abs()) {
        (a.ptr as *const f32, a.rs)
    } else {
        let ld = copied_row_stride(k);
        let buf = ws.f32(3, m.saturating_mul(ld))?;
        for (i, row) in buf.chunks_exact_mut(ld).enumerate() {
            // SAFETY: readable per the contract; `buf` is distinct scratch.
            unsafe {
                crate::strided::gather_into(
                    a.ptr.wrapping_offset(i as isize * a.rs),
                    a.cs,
                    &mut row[..k],
                )
            };
        }
        (buf.as_ptr(), ld as isize)
    };
    // SAFETY: forwarded contract.
    unsafe {
        gemm_packed_on(
            Isa::best(),
            m,
            n,
            k,
            Mat {
                ptr: ap as *mut f32,
                rs: lda,
                cs: 1,
            },
            b,
            c,
            alpha,
            accumulate,
            epi,
        )
    }
    Ok(())
}

/// Whether rows of A `lda` floats apart fall in one set of the L1 data cache: a multiple of
/// 4 KiB apart (not 0: one row read again), the set period of every x86 L1d (64 sets of
/// 64-byte lines). The tile's 14 rows then compete for that set's 8–12 ways and evict each
/// other on every step of K: 128×1024×128 ran at 52% of the f32 peak in place, against 89%
/// for 64×512×512.
#[inline]
pub(crate) fn rows_alias(lda: usize) -> bool {
    lda != 0 && lda.is_multiple_of(4096 / size_of::<f32>())
}

/// The row stride, in f32 slots, of a copy of A whose rows hold `len` slots: `len`, or one
/// cache line (16 slots) more where `len` would alias ([`rows_alias`]), so that consecutive
/// rows start in consecutive L1 sets.
#[inline]
pub(crate) fn copied_row_stride(len: usize) -> usize {
    if rows_alias(len) { len + 16 } else { len }
}

/// The instruction sets the packed GEMM has kernels for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// 14×32 tiles of `zmm` registers (AVX-512F).
    Avx512,
    /// 6×16 tiles of `ymm` registers (AVX2 + FMA).
    Avx2,
    /// Plain Rust.
    Portable,
}

impl Isa {
    /// Whether this CPU runs the kernel.
    pub fn available(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => crate::cpu::avx512f(),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => crate::cpu::avx2_fma(),
            Isa::Portable => true,
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The fastest available kernel (detected once per call: a few loads of a cached word).
    pub fn best() -> Isa {
        [Isa::Avx512, Isa::Avx2]
            .into_iter()
            .find(|i| i.available())
            .unwrap_or(Isa::Portable)
    }
}

/// [`gemm_packed`] with `k ≥ 1`, A's rows contiguous (`a.cs == 1`), on the kernel of `isa`
/// (the tests run every available one against the reference).
///
/// # Safety
/// As [`gemm_packed`]; `isa` available; `a.cs == 1`; `m, n, k ≥ 1`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_packed_on(
    isa: Isa,
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: Packed,
    c: Mat,
    alpha: f32,
    accumulate: bool,
    epi: TileEpilogue,
) {
    debug_assert!(isa.available() && a.cs == 1 && m > 0 && n > 0 && k > 0);
    let (ap, lda) = (a.ptr as *const f32, a.rs);
    let job = Job {
        m,
        n,
        k,
        a: ap,
        lda,
        b,
        c,
        alpha,
        accumulate,
        epi,
    };
    match isa {
        // SAFETY: forwarded contract; AVX-512F present per the contract.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { x86::run_avx512(&job) },
        // SAFETY: forwarded contract; AVX2 and FMA present per the contract.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::run_avx2(&job) },
        // SAFETY: forwarded contract.
        _ => unsafe { portable(&job) },
    }
}

/// The kernels of the bf16 packed GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bf16Kernel {
    /// The AMX tile unit (`tdpbf16ps`, [`super::amx`]); panels of 32 or 64 columns (16-wide
    /// panels take [`Bf16Kernel::Dot`]).
    Amx,
    /// `vdpbf16ps` in 14×32 register tiles (AVX-512 BF16).
    Dot,
    /// Without AVX-512 BF16, on AVX2 + FMA: up to `GEMV_MAX_ROWS` rows the packed GEMV
    /// widens each pair to two f32 in registers; more rows widen B's panels into the
    /// workspace a block at a time and run the f32 6×16 tiles.
    Avx2,
    /// Plain Rust.
    Portable,
}

impl Bf16Kernel {
    /// Whether this CPU (and, for AMX, this process) runs the kernel.
    pub fn available(self) -> bool {
        match self {
            Bf16Kernel::Amx => bf16_fast() && super::amx::bf16_available(),
            Bf16Kernel::Dot => bf16_fast(),
            Bf16Kernel::Avx2 => crate::cpu::avx2_fma(),
            Bf16Kernel::Portable => true,
        }
    }

    /// The fastest available kernel.
    pub fn best() -> Bf16Kernel {
        [Bf16Kernel::Amx, Bf16Kernel::Dot, Bf16Kernel::Avx2]
            .into_iter()
            .find(|k| k.available())
            .unwrap_or(Bf16Kernel::Portable)
    }
}

/// Whether the bf16 packed GEMM runs `vdpbf16ps` here (else a portable loop).
pub fn bf16_fast() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::half::fast_path_available(super::half::Half::Bf16)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `C = alpha·A·B` (`+=` when `accumulate`), then `epi`, for an f32 `m×k` A (rounded to
/// bf16 once per call, as the unpacked bf16 path does), a packed bf16 `k×n` B and an f32
/// `m×n` C on `kernel` (it must be available): the AMX tile unit, `vdpbf16ps` in 14×32
/// register tiles (AVX-512 BF16), or a portable loop.
///
/// # Safety
/// As [`gemm_packed`], B readable for `ceil(n / nr)` panels of `ceil(k/2)·2·nr` bf16.
#[allow(clippy::too_many_arguments)]
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
    kernel: Bf16Kernel,
    ws: &mut Workspace,
) -> Result<(), KernelError> {
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        let b = Packed {
            ptr: b.ptr as *const f32,
            nr: b.nr,
            panel_stride: 0,
        };
        // SAFETY: forwarded contract (k = 0 reads nothing of B).
        unsafe { gemm_packed(m, n, 0, a, b, c, alpha, accumulate, epi, ws)? };
        return Ok(());
    }
    debug_assert!(kernel.available());
    #[cfg(target_arch = "x86_64")]
    if kernel == Bf16Kernel::Amx && (b.nr == 32 || b.nr == 64) {
        // SAFETY: forwarded contract; the tile unit is usable; m, n, k ≥ 1.
        unsafe { super::amx::gemm_packed_bf16(m, n, k, a, b, c, alpha, accumulate, epi, ws)? };
        return Ok(());
    }
    #[cfg(target_arch = "x86_64")]
    if kernel == Bf16Kernel::Avx2 && m > nrt_hal::tuning::GEMV_MAX_ROWS {
        // SAFETY: forwarded contract; AVX2 and FMA present (the kernel is available).
        return unsafe { bf16_widened(m, n, k, a, b, c, alpha, accumulate, epi, ws) };
    }
    let fast = matches!(kernel, Bf16Kernel::Amx | Bf16Kernel::Dot);
    let kp = k.div_ceil(2);
    // A rounded to bf16 rows of `2·kp` (one f32 slot per pair), the odd K padded with 0,
    // `ld` slots apart (`copied_row_stride`).
    let ld = copied_row_stride(kp);
    let buf = ws.f32(0, m.saturating_mul(ld))?;
    for (i, row) in buf.chunks_exact_mut(ld).enumerate() {
        // SAFETY: the slots hold 2·kp u16, f32-aligned.
        let h = unsafe { core::slice::from_raw_parts_mut(row.as_mut_ptr() as *mut u16, 2 * kp) };
        let src = a.ptr.wrapping_offset(i as isize * a.rs);
        #[cfg(target_arch = "x86_64")]
        if fast {
            // SAFETY: A's row readable per the contract; the features are present.
            unsafe { super::types::avx512::round_row(src, a.cs, &mut h[..k]) };
        }
        if !fast && a.cs == 1 {
            // SAFETY: a row of k contiguous floats, readable per the contract.
            let row = unsafe { core::slice::from_raw_parts(src as *const f32, k) };
            for (o, &x) in h[..k].iter_mut().zip(row) {
                *o = crate::elem::f32_to_bf16(x);
            }
        } else if !fast {
            for (p, o) in h[..k].iter_mut().enumerate() {
                // SAFETY: readable per the contract.
                *o = crate::elem::f32_to_bf16(unsafe { *src.offset(p as isize * a.cs) });
            }
        }
        if k % 2 == 1 {
            h[k] = 0;
        }
    }
    let job = Job {
        m,
        n,
        k: kp,
        a: buf.as_ptr(),
        lda: ld as isize,
        b: Packed {
            ptr: b.ptr as *const f32,
            nr: b.nr,
            panel_stride: b.panel_stride / 2,
        },
        c,
        alpha,
        accumulate,
        epi,
    };
    #[cfg(target_arch = "x86_64")]
    if fast {
        // SAFETY: forwarded contract; AVX-512 BF16 present per the contract.
        unsafe { x86::run_bf16(&job) };
        return Ok(());
    }
    #[cfg(target_arch = "x86_64")]
    if kernel == Bf16Kernel::Avx2 {
        // SAFETY: forwarded contract; at most GEMV_MAX_ROWS rows (the rest were widened
        // above); AVX2 and FMA present per the contract.
        unsafe { x86::gemv_bf16_avx2(&job) };
        return Ok(());
    }
    // SAFETY: forwarded contract.
    unsafe { portable_bf16(&job) };
    Ok(())
}

/// [`gemm_packed_bf16`] on AVX2 for more than a few rows: B's panels widened to f32 a block
/// at a time ([`GEMM_PACKED_B_BLOCK_BYTES`] of floats, in the workspace), A rounded to bf16
/// and kept as floats, then the f32 kernels on each block — the products and their f32 sums
/// are those of `vdpbf16ps`. A tile kernel that widened B's words in registers ran at a third
/// of the f32 tiles' speed (64×512×512: 34 against 103 GFLOP/s; the shifts and masks compete
/// with the FMAs for the vector ports), while widening a block costs one pass over it.
///
/// # Safety
/// As [`gemm_packed_bf16`] with `m, n, k ≥ 1`; AVX2 and FMA present.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn bf16_widened(
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
    use crate::elem::{bf16_to_f32, f32_to_bf16};
    let (nr, kp) = (b.nr, k.div_ceil(2));
    let ld = copied_row_stride(k);
    let panel = k.saturating_mul(nr);
    let per_block = (GEMM_PACKED_B_BLOCK_BYTES / size_of::<f32>() / panel.max(1)).max(1);
    let (abuf, bbuf) = ws.f32x2(m.saturating_mul(ld), per_block.saturating_mul(panel))?;
    for (i, row) in abuf.chunks_exact_mut(ld).enumerate() {
        let src = a.ptr.wrapping_offset(i as isize * a.rs);
        if a.cs == 1 {
            // SAFETY: A's row i holds k contiguous readable floats; AVX2 present.
            unsafe { x86::round_to_bf16_avx2(src, &mut row[..k]) };
            continue;
        }
        for (p, o) in row[..k].iter_mut().enumerate() {
            // SAFETY: A's element (i, p) readable per the contract.
            *o = bf16_to_f32(f32_to_bf16(unsafe { *src.offset(p as isize * a.cs) }));
        }
    }
    let panels = n.div_ceil(nr);
    let mut q0 = 0;
    while q0 < panels {
        let q1 = (q0 + per_block).min(panels);
        for q in q0..q1 {
            // SAFETY: panel q holds kp rows of nr 32-bit words (pairs of K) per the contract.
            let words = unsafe {
                core::slice::from_raw_parts(
                    b.ptr.offset(q as isize * b.panel_stride) as *const u32,
                    kp * nr,
                )
            };
            // SAFETY: AVX2 present; `words` holds kp rows of nr words, the block's slice k
            // rows of nr floats.
            unsafe { x86::widen_pairs_avx2(words, k, nr, &mut bbuf[(q - q0) * panel..][..panel]) };
        }
        let col = q0 * nr;
        let job = Job {
            m,
            n: ((q1 - q0) * nr).min(n - col),
            k,
            a: abuf.as_ptr(),
            lda: ld as isize,
            b: Packed {
                ptr: bbuf.as_ptr(),
                nr,
                panel_stride: panel as isize,
            },
            c: Mat {
                ptr: c.ptr.wrapping_offset(col as isize * c.cs),
                ..c
            },
            alpha,
            accumulate,
            epi: TileEpilogue {
                bias: if epi.bias.is_null() {
                    core::ptr::null()
                } else {
                    epi.bias.wrapping_add(col)
                },
                ..epi
            },
        };
        // SAFETY: forwarded contract: A's m rows of k floats, the widened panels of the
        // block, C's columns from `col`; AVX2 and FMA present.
        unsafe { x86::run_avx2(&job) };
        q0 = q1;
    }
    Ok(())
}

/// The portable loop over the packed bf16 layout (pairs of K in 32-bit words).
///
/// # Safety
/// As [`gemm_packed_bf16`].
unsafe fn portable_bf16(j: &Job) {
    use crate::elem::bf16_to_f32;
    let pair = |w: u32| (bf16_to_f32(w as u16), bf16_to_f32((w >> 16) as u16));
    // SAFETY: forwarded contract.
    unsafe {
        drive(j, 4, 16, |t| {
            let mut acc = [[0.0f32; 16]; 4];
            for p in 0..t.kc {
                let brow = t.b.wrapping_offset(p as isize * t.ldb) as *const u32;
                for (r, ar) in acc.iter_mut().enumerate().take(t.mr) {
                    let (a0, a1) =
                        pair(*(t.a.wrapping_offset(r as isize * t.lda) as *const u32).add(p));
                    for (x, v) in ar.iter_mut().enumerate() {
                        let (b0, b1) = pair(*brow.add(x));
                        *v += a0 * b0 + a1 * b1;
                    }
                }
            }
            for row in acc.iter_mut() {
                for v in row.iter_mut() {
                    *v *= t.alpha;
                }
            }
            store_partial(t, &acc[..]);
        })
    }
}

/// The portable loop over the packed layout.
///
/// # Safety
/// As [`gemm_packed`].
unsafe fn portable(j: &Job) {
    // SAFETY: forwarded contract.
    unsafe {
        drive(j, 4, 16, |t| {
            let mut acc = [[0.0f32; 16]; 4];
            for p in 0..t.kc {
                let brow = t.b.wrapping_offset(p as isize * t.ldb);
                for (r, ar) in acc.iter_mut().enumerate().take(t.mr) {
                    let av = *t.a.wrapping_offset(r as isize * t.lda).add(p);
                    for (x, v) in ar.iter_mut().enumerate() {
                        *v += av * *brow.add(x);
                    }
                }
            }
            for row in acc.iter_mut() {
                for v in row.iter_mut() {
                    *v *= t.alpha;
                }
            }
            store_partial(t, &acc[..]);
        })
    }
}
