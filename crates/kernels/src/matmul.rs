//! `MatMul`: `C (+)= alpha · op(A) · op(B)`, batched over dimensions 0 and 1 (batch stride 0
//! broadcasts an operand).
//!
//! # Which GEMM
//!
//! Candidates measured on this project's machine (2 vCPU AMD EPYC Zen 4 under KVM, AVX2 +
//! FMA visible to the guest, no AVX-512; `target-cpu=x86-64-v3`; single thread; f32,
//! row-major; GFLOP/s as the median of 9 timed batches, three interleaved rounds; the VM is
//! noisy, ±15 % between rounds):
//!
//! | M×K×N | `gemm` 0.19 | `matrixmultiply` 0.3 | `faer` 0.24 | `private-gemm-x86` 0.1 | this module |
//! |---|---|---|---|---|---|
//! | 1×512×512 | 20–24 | 4.2–4.3 | 23–25 | 12–16 | 22–27 (GEMV) |
//! | 64×512×512 | 63–81 | 64–66 | 68–81 | 71–82 | 77 |
//! | 512×512×512 | 66–89 | 70–80 | 68–81 | 72–81 | 66–87 |
//! | 128×64×128 | 61–86 | 64–72 | 67–86 | 64–87 | 82–88 |
//! | 4096×27×16 | 54–80 | 35–42 | 44–67 | 45–71 | 49–50 |
//! | heap allocations per call | 1 | 1 | 0 | 0 | 0 |
//! | clean build, 2 cores | — | — | — | 17 s | — |
//!
//! (Clean builds: `gemm` + `matrixmultiply` + `faer` together took 116 s — `faer` pulls
//! `gemm`, `nano-gemm`, `pulp` and `private-gemm-x86`; `private-gemm-x86` alone 17 s. The
//! last column is `cargo bench -p nrt-kernels -- matmul`, fastest of 15 batches, through
//! `execute`.)
//!
//! (ONNX Runtime on this machine, for scale: a 4-layer 512-wide batch-1 MLP runs in ~100 µs,
//! tract ~100 µs through its Python binding; `MatMul` + `Activation(Relu, bias)` ×4 here:
//! 65–83 µs. The machine is ~2× slower than the one the project's 50.7 µs tract figure comes
//! from: its L3 streams ~60 GB/s, and a 512×512 GEMV reads 1 MiB of B, ≥ 18 µs.)
//!
//! All but `matrixmultiply` are within the machine's noise of each other for M ≥ 64.
//! `gemm` and `matrixmultiply` allocate their packing buffers on every call, which the
//! project's zero-allocation rule forbids. `faer` does not: for f32 on x86-64 it calls
//! `private-gemm-x86` (same author), whose packing buffers live in a thread-local that grows
//! once. We depend on `private-gemm-x86` directly: the same kernels as `faer` with a seventh of
//! its build time and none of its linear-algebra surface. (`faer`'s own small-size and
//! matrix-vector paths are replaced here by the GEMV kernels below.) Its API is the one
//! function `gemm` with explicit strides; the risk of a "private" crate changing is contained
//! in [`gemm_f32`], the only place that calls it, and in the lock file.
//!
//! Constant weights are different: the compiler stores them packed once in the layout of
//! this crate's own microkernels ([`crate::gemm_packed`], `matmul_flags::PACKED_B`), which
//! then pack nothing per call and apply a per-column bias and Relu in registers; at
//! 64×512×512 that ran at 94–97% of the f32 peak against 89–90% for `private-gemm-x86` in
//! the same runs (isolated kernels, `cargo run --release -p nrt-kernels --example
//! packed_bench`, busy machine). The GEMM crate stays for every other product.
//!
//! # GEMV
//!
//! GEMM crates pack the operands, which for a few rows costs as much as the product.
//! Matrix-vector and few-row products take hand-written AVX2/FMA kernels instead (`M ≤`
//! [`GEMV_MAX_ROWS`] rows, or `N = 1`), on groups of up to [`GEMV_GROUP`] rows of A that share
//! one pass over B:
//! - B row-major (`[K, N]`, unit stride along N): column strips (64 floats for one row of A,
//!   32 for two, 16 for three or four; 64 for three or four with AVX-512, detected at run
//!   time — 0.67–0.69× the time of the 16-wide AVX2 strips at 3 and 4 × 512 × 512, paired
//!   A/B on a busy machine) held in registers while B's rows stream past;
//! - B stored transposed (`[N, K]`, unit stride along K — PyTorch `Linear` weights) and the
//!   `N = 1` case: dot products of up to 4 rows of B with each row of A, 8 accumulators.
//!
//! At M = 1 these run at the machine's memory bandwidth (a 512×512 B is 1 MiB: 17–20 µs here;
//! a plain 1 MiB read takes 18 µs); the GEMM crate needs 35 µs (88 µs with B transposed).

use crate::Execute;
use crate::gemm_packed::{
    Bf16Kernel, Packed, PackedBf16, TileEpilogue, gemm_packed, gemm_packed_bf16,
};
use crate::matmul_half::{Half, HalfMat, gemm_half};
use crate::strided::View;
use crate::{DeviceMemory, KernelError, Workspace};
use nrt_hal::DType;
use nrt_hal::tuning::{EPILOGUE_MIN_ROWS, EPILOGUE_TILE_BYTES, GEMV_MAX_ROWS};
use nrt_isa::op;
use nrt_isa::{AccessPattern, ActFunc, Epilogue, matmul_flags};

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

/// `C = alpha·A·B` (or `C += alpha·A·B` when `accumulate`) for an `m×k` A, `k×n` B and `m×n`
/// C, any strides; picks the GEMV kernels or the GEMM crate.
///
/// # Safety
/// The three matrices must be valid (A and B readable, C writable) for every element their
/// shape and strides address; C must not overlap A or B.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_auto(
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: Mat,
    c: Mat,
    alpha: f32,
    accumulate: bool,
    ws: &mut Workspace,
) -> Result<(), KernelError> {
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                for j in 0..n {
                    // SAFETY: C element in bounds per the contract.
                    unsafe {
                        c.ptr
                            .offset(i as isize * c.rs + j as isize * c.cs)
                            .write(0.0)
                    };
                }
            }
        }
        return Ok(());
    }
    if m <= GEMV_MAX_ROWS && c.cs == 1 && (b.cs == 1 || b.rs == 1) {
        // GEMV kernels on groups of up to 4 rows of A: B is read once per group.
        let mut i = 0;
        while i < m {
            let g = (m - i).min(GEMV_GROUP);
            let mut xs = [core::ptr::null::<f32>(); GEMV_GROUP];
            let mut ys = [core::ptr::null_mut::<f32>(); GEMV_GROUP];
            let rows = a.ptr.wrapping_offset(i as isize * a.rs);
            // SAFETY: the group's rows of A are readable; the scratch copy is distinct.
            let (base, rs) = unsafe { contiguous_rows(rows, a.rs, a.cs, g, k, ws)? };
            for q in 0..g {
                xs[q] = base.wrapping_offset(q as isize * rs);
                ys[q] = c.ptr.wrapping_offset((i + q) as isize * c.rs);
            }
            // SAFETY: B readable and the C rows writable per the contract.
            unsafe {
                if b.cs == 1 {
                    gemv_rowmajor(k, n, &xs[..g], b.ptr, b.rs, &ys[..g], alpha, accumulate);
                } else {
                    gemv_dot(k, n, &xs[..g], b.ptr, b.cs, &ys[..g], 1, alpha, accumulate);
                }
            }
            i += g;
        }
        return Ok(());
    }
    if n == 1 && a.cs == 1 {
        // C[:, 0] = A · b: dot products of A's rows with the vector b.
        // SAFETY: B's column is readable; the scratch copy is a distinct buffer.
        let x = unsafe { contiguous(b.ptr, b.rs, k, ws)? };
        // SAFETY: A readable, C writable per the contract.
        unsafe { gemv_dot(k, m, &[x], a.ptr, a.rs, &[c.ptr], c.rs, alpha, accumulate) };
        return Ok(());
    }
    // SAFETY: forwarded contract.
    unsafe { gemm_f32(m, n, k, a, b, c, alpha, accumulate) };
    Ok(())
}

/// The `k` floats at `p` (stride `s`) as a contiguous pointer: `p` itself when `s == 1`, else
/// a copy in workspace buffer 3.
///
/// # Safety
/// The elements must be readable.
unsafe fn contiguous(
    p: *const f32,
    s: isize,
    k: usize,
    ws: &mut Workspace,
) -> Result<*const f32, KernelError> {
    if s == 1 {
        return Ok(p);
    }
    let buf = ws.f32(3, k)?;
    // SAFETY: readable per the contract; `buf` is distinct scratch.
    unsafe { crate::strided::gather_into(p, s, buf) };
    Ok(buf.as_ptr())
}

/// `g` rows of `k` floats (row stride `rs`, element stride `cs`) as contiguous rows: the
/// rows themselves when `cs == 1`, else copies in workspace buffer 3. Returns the first row
/// and the row stride.
///
/// # Safety
/// The elements must be readable.
unsafe fn contiguous_rows(
    p: *const f32,
    rs: isize,
    cs: isize,
    g: usize,
    k: usize,
    ws: &mut Workspace,
) -> Result<(*const f32, isize), KernelError> {
    if cs == 1 {
        return Ok((p, rs));
    }
    let buf = ws.f32(3, g * k)?;
    for (q, row) in buf.chunks_exact_mut(k).enumerate() {
        // SAFETY: readable per the contract; `buf` is distinct scratch.
        unsafe { crate::strided::gather_into(p.wrapping_offset(q as isize * rs), cs, row) };
    }
    Ok((buf.as_ptr(), k as isize))
}

/// Readies the calling thread to run [`gemm_f32`] without allocating: the GEMM crate keeps
/// its packing buffers in a thread-local of its own (two L3-sized blocks of address space,
/// reserved on a thread's first product and only touched as used), which a 1×1×1 product
/// sets up. A thread that may run device work — a device thread, or a waiting caller that
/// assists its core — calls it before its steady state, so that its first real product
/// (perhaps thousands of executions in, the first time a co-tenant holds the device
/// thread's vCPU) allocates nothing. Idempotent and cheap after the first call.
pub fn prepare_thread() {
    let (mut a, mut b, mut c) = (0.0f32, 0.0f32, 0.0f32);
    let mat = |p: &mut f32| Mat {
        ptr: p,
        rs: 1,
        cs: 1,
    };
    // SAFETY: 1×1 matrices on three distinct locals; m = n = k = 1.
    unsafe { gemm_f32(1, 1, 1, mat(&mut a), mat(&mut b), mat(&mut c), 1.0, false) };
}

/// Runs the GEMM crate (or the portable fallback off x86-64).
///
/// # Safety
/// As [`gemm_auto`]; `m`, `n`, `k` ≥ 1.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_f32(
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: Mat,
    c: Mat,
    alpha: f32,
    accumulate: bool,
) {
    #[cfg(target_arch = "x86_64")]
    {
        use private_gemm_x86 as pg;
        let instr = if crate::cpu::avx512f() {
            pg::InstrSet::Avx512
        } else {
            pg::InstrSet::Avx256
        };
        let accum = if accumulate {
            pg::Accum::Add
        } else {
            pg::Accum::Replace
        };
        // SAFETY: the contract of `gemm_auto` is the crate's: every addressed element valid,
        // dst not overlapping the inputs; `alpha` outlives the call; no row/column index
        // tables (null) and a full (not triangular) destination; one thread.
        unsafe {
            pg::gemm(
                pg::DType::F32,
                pg::IType::U64,
                instr,
                m,
                n,
                k,
                c.ptr as *mut (),
                c.rs,
                c.cs,
                core::ptr::null(),
                core::ptr::null(),
                pg::DstKind::Full,
                accum,
                a.ptr as *const (),
                a.rs,
                a.cs,
                false,
                core::ptr::null(),
                0,
                b.ptr as *const (),
                b.rs,
                b.cs,
                false,
                &raw const alpha as *const (),
                1,
            );
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0f32;
                for p in 0..k {
                    // SAFETY: in bounds per the contract.
                    s += unsafe {
                        *a.ptr.offset(i as isize * a.rs + p as isize * a.cs)
                            * *b.ptr.offset(p as isize * b.rs + j as isize * b.cs)
                    };
                }
                let cp = c.ptr.wrapping_offset(i as isize * c.rs + j as isize * c.cs);
                // SAFETY: in bounds per the contract.
                unsafe { *cp = alpha * s + if accumulate { *cp } else { 0.0 } };
            }
        }
    }
}

/// A strided f32 operand of the epilogue, in one batch: element `[i, j]` at
/// `ptr + i·rs + j·cs`.
#[derive(Clone, Copy, Debug)]
struct Addend {
    ptr: *const f32,
    rs: isize,
    cs: isize,
}

/// `row[j] += p[j·cs]`.
///
/// # Safety
/// `p` readable for the row's elements, not overlapping `row`.
#[inline(always)]
unsafe fn add_row(row: &mut [f32], p: *const f32, cs: isize) {
    match cs {
        1 => {
            // SAFETY: readable per the contract, distinct from `row`.
            let src = unsafe { core::slice::from_raw_parts(p, row.len()) };
            for (o, v) in row.iter_mut().zip(src) {
                *o += *v;
            }
        }
        0 => {
            // SAFETY: readable per the contract.
            let v = unsafe { *p };
            for o in row.iter_mut() {
                *o += v;
            }
        }
        _ => {
            for (j, o) in row.iter_mut().enumerate() {
                // SAFETY: readable per the contract.
                *o += unsafe { *p.offset(j as isize * cs) };
            }
        }
    }
}

/// Applies the epilogue to rows `r0..r1` of one batch of C (`n` columns), just computed.
/// `staged`: work on a copy of each row (C strided, or an addend overlapping C — which a
/// compiler never emits but a hostile model may: then no reference to C is ever formed
/// while an addend is read).
///
/// # Safety
/// C's rows writable, the addends readable for them.
#[allow(clippy::too_many_arguments)]
unsafe fn epilogue_rows(
    c: Mat,
    n: usize,
    rows: core::ops::Range<usize>,
    addends: &[Option<Addend>; 2],
    epi: &Epilogue,
    staged: bool,
    ws: &mut Workspace,
) -> Result<(), KernelError> {
    let staged = staged || c.cs != 1;
    let scratch = if staged { ws.f32(2, n)? } else { &mut [][..] };
    for i in rows {
        let cp = c.ptr.wrapping_offset(i as isize * c.rs);
        let row: &mut [f32] = if !staged {
            // SAFETY: the row is writable and nothing else refers to it during the call.
            unsafe { core::slice::from_raw_parts_mut(cp, n) }
        } else {
            // SAFETY: readable per the contract; `scratch` is distinct.
            unsafe { crate::strided::gather_into(cp, c.cs, scratch) };
            &mut scratch[..]
        };
        for x in addends.iter().flatten() {
            // SAFETY: readable per the contract, not overlapping C.
            unsafe { add_row(row, x.ptr.wrapping_offset(i as isize * x.rs), x.cs) };
        }
        crate::act::apply_in_place(epi.func, epi.act_alpha, epi.act_beta, row);
        if staged {
            for (j, v) in scratch.iter().enumerate() {
                // SAFETY: writable per the contract.
                unsafe { *cp.offset(j as isize * c.cs) = *v };
            }
        }
    }
    Ok(())
}

/// Rows of C per block of a MatMul with an epilogue (see
/// [`nrt_hal::tuning::EPILOGUE_TILE_BYTES`]).
pub fn epilogue_block_rows(n: usize) -> usize {
    (EPILOGUE_TILE_BYTES / (4 * n.max(1))).max(EPILOGUE_MIN_ROWS)
}

/// Executes `Op::MatMul` — the one entry point for every element type of B: f32, or bf16 /
/// f16 weights ([`crate::matmul_half`], AVX-512 BF16 / F16C chosen at run time): the product,
/// then the epilogue (if any) on each block of rows of C
/// right after the block is computed, while it is still in cache.
///
/// # Safety
/// The operands must lie inside `mem`, aligned; C must not overlap A or B (the epilogue's
/// operands may overlap C: those rows are staged through the workspace).
#[allow(clippy::too_many_arguments)]
pub unsafe fn matmul(
    a: &AccessPattern,
    b: &AccessPattern,
    c: &AccessPattern,
    alpha: f32,
    flags: u32,
    epilogue: &Epilogue,
    mem: DeviceMemory,
    ws: &mut Workspace,
) -> Result<(), KernelError> {
    let (va, vb, vc) = (
        View::<f32>::new(a, mem),
        View::<f32>::new(b, mem),
        View::<f32>::new(c, mem),
    );
    // Half-precision weights (`--auto-cast`): the same element strides, 16-bit elements.
    let half = match b.dtype {
        DType::Bf16 => Some(Half::Bf16),
        DType::F16 => Some(Half::F16),
        _ => None,
    };
    let vh = View::<u16>::new(b, mem);
    let ve = [
        epilogue.bias.as_ref().map(|x| View::<f32>::new(x, mem)),
        epilogue.residual.as_ref().map(|x| View::<f32>::new(x, mem)),
    ];
    let ta = flags & matmul_flags::TRANSPOSE_A != 0;
    let tb = flags & matmul_flags::TRANSPOSE_B != 0;
    let acc = flags & matmul_flags::ACCUMULATE != 0;
    // B packed in panels at compile time (constant weights, shared by every batch; the
    // decoder checked the layout: f32 `[1, panels, K, NR]`, strides `[_, K·NR, NR, 1]`, or
    // bf16 `[1, panels, ceil(K/2), 2·NR]` — pairs of K side by side).
    let bf16_packed = half == Some(Half::Bf16);
    let packed = (flags & matmul_flags::PACKED_B != 0).then(|| Packed {
        ptr: vb.at([0, 0, 0, 0]),
        nr: if bf16_packed {
            vb.shape[3] / 2
        } else {
            vb.shape[3]
        },
        panel_stride: vb.stride[1],
    });
    let (m, n) = (vc.shape[2], vc.shape[3]);
    if m == 0 || n == 0 || vc.shape[0] == 0 || vc.shape[1] == 0 {
        return Ok(());
    }
    let k = if ta { va.shape[2] } else { va.shape[3] };
    let rows_k = if bf16_packed { k.div_ceil(2) } else { k };
    if let Some(p) = packed
        && ((half.is_some() && !bf16_packed)
            || !matmul_flags::PANEL_WIDTHS.contains(&(p.nr as u32))
            || vb.shape[2] != rows_k
            || vb.shape[1] * p.nr < n
            || vb.stride[2] != vb.shape[3] as isize
            || vb.shape[3] != p.nr * if bf16_packed { 2 } else { 1 }
            || vb.stride[3] != 1)
    {
        // Not a layout the decoder lets through (an `Op` built by hand): compute nothing
        // rather than read past the operand.
        debug_assert!(false, "packed B of an unchecked layout");
        return Ok(());
    }
    let (ars, acs) = if ta {
        (va.stride[3], va.stride[2])
    } else {
        (va.stride[2], va.stride[3])
    };
    let (brs, bcs) = if tb {
        (vb.stride[3], vb.stride[2])
    } else {
        (vb.stride[2], vb.stride[3])
    };
    // Batches that share one B (stride 0) and lie evenly spaced along M in A and C (and the
    // epilogue's operands) are one taller product (a Linear layer over [batch, seq, K] is one
    // GEMM, not batch·seq GEMVs).
    let (mut m, mut nb) = (m, [vc.shape[0], vc.shape[1]]);
    for d in [1, 0] {
        let mergeable = nb[d] == 1
            || ((packed.is_some() || vb.stride[d] == 0)
                && va.stride[d] == m as isize * ars
                && vc.stride[d] == m as isize * vc.stride[2]
                && ve
                    .iter()
                    .flatten()
                    .all(|e| e.stride[d] == m as isize * e.stride[2]));
        if !mergeable {
            break;
        }
        m *= nb[d];
        nb[d] = 1;
    }
    let fused = !epilogue.is_none();
    // An addend overlapping C (never compiled; possible in a hostile model): stage rows.
    let overlap = |x: &AccessPattern| {
        let (cl, ch) = c.byte_extent();
        let (xl, xh) = x.byte_extent();
        let (c0, x0) = (c.addr as i128, x.addr as i128);
        c0 + cl < x0 + xh + 4 && x0 + xl < c0 + ch + 4
    };
    let staged = [&epilogue.bias, &epilogue.residual]
        .into_iter()
        .flatten()
        .any(overlap);
    // The packed GEMM applies a per-column bias and Relu to each tile in registers: then the
    // epilogue needs no pass of its own.
    let in_tile = packed.is_some()
        && fused
        && !staged
        && epilogue.residual.is_none()
        && matches!(epilogue.func, ActFunc::Identity | ActFunc::Relu)
        && ve[0].is_none_or(|b| b.stride[2] == 0 && b.stride[3] == 1);
    let fused = fused && !in_tile;
    let block = if fused {
        epilogue_block_rows(n).min(m)
    } else {
        m
    };
    for i0 in 0..nb[0] {
        for i1 in 0..nb[1] {
            let ma = Mat {
                ptr: va.at([i0, i1, 0, 0]),
                rs: ars,
                cs: acs,
            };
            let mb = Mat {
                ptr: if packed.is_some() {
                    vb.at([0, 0, 0, 0])
                } else {
                    vb.at([i0, i1, 0, 0])
                },
                rs: brs,
                cs: bcs,
            };
            let mc = Mat {
                ptr: vc.at([i0, i1, 0, 0]),
                rs: vc.stride[2],
                cs: vc.stride[3],
            };
            let addends = ve.map(|e| {
                e.map(|e| Addend {
                    ptr: e.at([i0, i1, 0, 0]),
                    rs: e.stride[2],
                    cs: e.stride[3],
                })
            });
            let mut r0 = 0;
            while r0 < m {
                let rb = block.min(m - r0);
                let off = |x: Mat| Mat {
                    ptr: x.ptr.wrapping_offset(r0 as isize * x.rs),
                    ..x
                };
                let epi = if in_tile {
                    TileEpilogue {
                        bias: addends[0].map_or(core::ptr::null(), |b| b.ptr),
                        row_bias: core::ptr::null(),
                        relu: epilogue.func == ActFunc::Relu,
                    }
                } else {
                    TileEpilogue::NONE
                };
                // SAFETY: the caller's contract covers every element of every batch; the
                // block's rows are a subset; the bias (in-tile epilogue) is a row of N.
                unsafe {
                    match (half, packed) {
                        (None, Some(pb)) => {
                            gemm_packed(rb, n, k, off(ma), pb, off(mc), alpha, acc, epi, ws)
                        }
                        (Some(_), Some(pb)) => {
                            let hb = PackedBf16 {
                                ptr: vh.at([0, 0, 0, 0]),
                                nr: pb.nr,
                                panel_stride: vh.stride[1],
                            };
                            let kernel = Bf16Kernel::best();
                            let (a, c) = (off(ma), off(mc));
                            gemm_packed_bf16(rb, n, k, a, hb, c, alpha, acc, epi, kernel, ws)
                        }
                        (None, None) => gemm_auto(rb, n, k, off(ma), mb, off(mc), alpha, acc, ws),
                        (Some(kind), _) => {
                            let hb = HalfMat {
                                ptr: vh.at([i0, i1, 0, 0]),
                                rs: brs,
                                cs: bcs,
                                kind,
                            };
                            if k == 0 {
                                gemm_auto(rb, n, k, off(ma), mb, off(mc), alpha, acc, ws)
                            } else {
                                gemm_half(rb, n, k, off(ma), hb, off(mc), alpha, acc, ws)
                            }
                        }
                    }
                }?;
                if fused {
                    // SAFETY: as above; the addends do not overlap C per the contract.
                    unsafe { epilogue_rows(mc, n, r0..r0 + rb, &addends, epilogue, staged, ws)? };
                }
                r0 += rb;
            }
        }
    }
    Ok(())
}

/// Up to 4 rows of A processed together by the GEMV kernels.
pub const GEMV_GROUP: usize = 4;

/// For each row `i < x.len()` (1 to [`GEMV_GROUP`]): `y_i[j] = alpha · Σ_p x_i[p]·B[p, j]`
/// (`+ y_i[j]` when `accumulate`) for a `k×n` B with row stride `ldb` and unit column
/// stride; every `x_i` and `y_i` contiguous. B is read once for the whole group.
///
/// # Safety
/// Each `x_i` readable for `k`, B for its `k×n` elements, each `y_i` writable for `n` and
/// overlapping no input.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemv_rowmajor(
    k: usize,
    n: usize,
    x: &[*const f32],
    b: *const f32,
    ldb: isize,
    y: &[*mut f32],
    alpha: f32,
    accumulate: bool,
) {
    debug_assert!((1..=GEMV_GROUP).contains(&x.len()) && x.len() == y.len());
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    {
        macro_rules! go {
            ($r:literal) => {{
                let xs: [*const f32; $r] = core::array::from_fn(|i| x[i]);
                let mut ys: [*mut f32; $r] = core::array::from_fn(|i| y[i]);
                let (mut b, mut n) = (b, n);
                // AVX-512 (detected at run time) for the columns up to a multiple of 64, the
                // AVX2 kernels for the rest: 1 and 2 rows of a B too large for L2 stream its
                // rows 16 lanes wide (the AVX2 kernel does the same 8 lanes wide); 3 and 4 rows
                // take 64-column strips (twice the registers and width of the AVX2 strips).
                let stream = $r <= 2 && k * n * 4 >= nrt_hal::tuning::GEMV_STREAM_MIN_BYTES;
                if ($r >= 3 || stream) && n >= 64 && avx512::available() {
                    let done = n & !63;
                    // SAFETY: forwarded contract; AVX-512F detected; `done` a multiple of 64.
                    unsafe {
                        if stream {
                            avx512::stream_rows::<$r, 4>(k, done, xs, b, ldb, ys, alpha, accumulate)
                        } else {
                            avx512::gemv_strips::<$r>(k, done, xs, b, ldb, ys, alpha, accumulate)
                        }
                    };
                    b = b.wrapping_add(done);
                    ys = ys.map(|p| p.wrapping_add(done));
                    n -= done;
                }
                if n > 0 {
                    // SAFETY: forwarded contract; the CPU features are enabled at compile
                    // time.
                    unsafe { avx::gemv_rowmajor::<$r>(k, n, xs, b, ldb, ys, alpha, accumulate) }
                }
            }};
        }
        match x.len() {
            1 => go!(1),
            2 => go!(2),
            3 => go!(3),
            _ => go!(4),
        }
    }
    #[cfg(not(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    )))]
    for (xi, yi) in x.iter().zip(y) {
        for j in 0..n {
            let mut s = 0.0;
            for p in 0..k {
                // SAFETY: in bounds per the contract.
                s += unsafe { *xi.add(p) * *b.offset(p as isize * ldb + j as isize) };
            }
            // SAFETY: in bounds per the contract.
            unsafe { *yi.add(j) = alpha * s + if accumulate { *yi.add(j) } else { 0.0 } };
        }
    }
}

/// For each row `i < x.len()` (1 to [`GEMV_GROUP`]): `y_i[j·ys] = alpha · dot(x_i, R_j)`
/// (`+ y_i[j·ys]` when `accumulate`) for `n` rows `R_j = r + j·ldr` of `k` contiguous floats;
/// every `x_i` contiguous. The rows `R_j` are read once for the whole group.
///
/// # Safety
/// As [`gemv_rowmajor`], `y_i` writable at every `j·ys`, `j < n`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemv_dot(
    k: usize,
    n: usize,
    x: &[*const f32],
    r: *const f32,
    ldr: isize,
    y: &[*mut f32],
    ys: isize,
    alpha: f32,
    accumulate: bool,
) {
    debug_assert!((1..=GEMV_GROUP).contains(&x.len()) && x.len() == y.len());
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    {
        macro_rules! go {
            ($r:literal) => {{
                let xs: [*const f32; $r] = core::array::from_fn(|i| x[i]);
                let yv: [*mut f32; $r] = core::array::from_fn(|i| y[i]);
                // SAFETY: forwarded contract; the CPU features are enabled at compile time.
                unsafe { avx::gemv_dot::<$r>(k, n, xs, r, ldr, yv, ys, alpha, accumulate) }
            }};
        }
        match x.len() {
            1 => go!(1),
            2 => go!(2),
            3 => go!(3),
            _ => go!(4),
        }
    }
    #[cfg(not(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    )))]
    for (xi, yi) in x.iter().zip(y) {
        for j in 0..n {
            let mut s = 0.0;
            for p in 0..k {
                // SAFETY: in bounds per the contract.
                s += unsafe { *xi.add(p) * *r.offset(j as isize * ldr + p as isize) };
            }
            let yp = yi.wrapping_offset(j as isize * ys);
            // SAFETY: in bounds per the contract.
            unsafe { *yp = alpha * s + if accumulate { *yp } else { 0.0 } };
        }
    }
}

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
mod avx {
    use core::arch::x86_64::*;

    /// Stores `alpha·s (+ y)` to 8 floats at `y`.
    ///
    /// # Safety
    /// `y` writable for 8 floats.
    #[inline(always)]
    unsafe fn store8(y: *mut f32, s: __m256, alpha: __m256, accumulate: bool) {
        // SAFETY: per the contract (unaligned load/store intrinsics).
        unsafe {
            let v = if accumulate {
                _mm256_fmadd_ps(s, alpha, _mm256_loadu_ps(y))
            } else {
                _mm256_mul_ps(s, alpha)
            };
            _mm256_storeu_ps(y, v);
        }
    }

    /// One strip of `8·W` columns over all `k` rows of B, for `R` rows of A: `R·W`
    /// accumulators in registers while B's rows stream past.
    ///
    /// # Safety
    /// As `super::gemv_rowmajor` for the strip's columns.
    #[inline(always)]
    unsafe fn strip<const R: usize, const W: usize>(
        k: usize,
        x: [*const f32; R],
        b: *const f32,
        ldb: isize,
        y: [*mut f32; R],
        alpha: f32,
        accumulate: bool,
    ) {
        // SAFETY: every load reads row p < k, columns < 8·W of the strip, or x_i[p].
        unsafe {
            let mut c = [[_mm256_setzero_ps(); W]; R];
            let mut row = b;
            for p in 0..k {
                let bv: [__m256; W] = core::array::from_fn(|w| _mm256_loadu_ps(row.add(8 * w)));
                for (ci, xi) in c.iter_mut().zip(x) {
                    let xv = _mm256_broadcast_ss(&*xi.add(p));
                    for (cw, bw) in ci.iter_mut().zip(bv) {
                        *cw = _mm256_fmadd_ps(xv, bw, *cw);
                    }
                }
                row = row.offset(ldb);
            }
            let av = _mm256_set1_ps(alpha);
            for (ci, yi) in c.iter().zip(y) {
                for (w, cw) in ci.iter().enumerate() {
                    store8(yi.add(8 * w), *cw, av, accumulate);
                }
            }
        }
    }

    /// One step of [`stream_rows`]: rows `p..p+G` of B, each read once, start to end, added
    /// (scaled by `alpha·x_i[p+g]`) into every `y_i`, `8·Q` columns per register block.
    ///
    /// # Safety
    /// As `super::gemv_rowmajor`, with `p + G ≤ k`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn stream_step<const R: usize, const G: usize, const Q: usize>(
        n: usize,
        x: [*const f32; R],
        p: usize,
        b: *const f32,
        ldb: isize,
        y: [*mut f32; R],
        alpha: f32,
    ) {
        // SAFETY: reads x_i[p..p+G], rows p..p+G of B at columns < n; writes y_i at columns
        // < n (no overlap with any input, per the contract).
        unsafe {
            let xs: [[f32; G]; R] =
                core::array::from_fn(|i| core::array::from_fn(|g| alpha * *x[i].add(p + g)));
            let xv: [[__m256; G]; R] = xs.map(|xi| xi.map(|v| _mm256_set1_ps(v)));
            let rows: [*const f32; G] = core::array::from_fn(|g| b.offset((p + g) as isize * ldb));
            let mut j = 0;
            while j + 8 * Q <= n {
                let mut acc: [[__m256; Q]; R] = core::array::from_fn(|i| {
                    core::array::from_fn(|q| _mm256_loadu_ps(y[i].add(j + 8 * q)))
                });
                for (g, row) in rows.iter().enumerate() {
                    for q in 0..Q {
                        let w = _mm256_loadu_ps(row.add(j + 8 * q));
                        for (ai, xi) in acc.iter_mut().zip(&xv) {
                            ai[q] = _mm256_fmadd_ps(xi[g], w, ai[q]);
                        }
                    }
                }
                for (ai, yi) in acc.iter().zip(y) {
                    for (q, aq) in ai.iter().enumerate() {
                        _mm256_storeu_ps(yi.add(j + 8 * q), *aq);
                    }
                }
                j += 8 * Q;
            }
            while j + 8 <= n {
                for i in 0..R {
                    let mut a = _mm256_loadu_ps(y[i].add(j));
                    for g in 0..G {
                        a = _mm256_fmadd_ps(xv[i][g], _mm256_loadu_ps(rows[g].add(j)), a);
                    }
                    _mm256_storeu_ps(y[i].add(j), a);
                }
                j += 8;
            }
            while j < n {
                for i in 0..R {
                    let mut a = *y[i].add(j);
                    for g in 0..G {
                        a += xs[i][g] * *rows[g].add(j);
                    }
                    *y[i].add(j) = a;
                }
                j += 1;
            }
        }
    }

    /// The GEMV for a B too large for L2: instead of column strips (which walk B down its
    /// columns, `k` short runs per strip), B's rows are read in memory order, `G` at a time,
    /// and each `y_i` (in L1) accumulates them; the hardware prefetcher sees `G` sequential
    /// streams. `y_i = alpha·Σ_p x_i[p]·B[p] (+ y_i)`, with `alpha` folded into `x_i[p]`.
    ///
    /// # Safety
    /// As `super::gemv_rowmajor`.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    unsafe fn stream_rows<const R: usize, const G: usize, const Q: usize>(
        k: usize,
        n: usize,
        x: [*const f32; R],
        b: *const f32,
        ldb: isize,
        y: [*mut f32; R],
        alpha: f32,
        accumulate: bool,
    ) {
        // SAFETY: y_i writable for n floats; the steps as `stream_step` with p + G ≤ k.
        unsafe {
            if !accumulate {
                for yi in y {
                    core::ptr::write_bytes(yi, 0, n);
                }
            }
            let mut p = 0;
            while p + G <= k {
                stream_step::<R, G, Q>(n, x, p, b, ldb, y, alpha);
                p += G;
            }
            while p < k {
                stream_step::<R, 1, Q>(n, x, p, b, ldb, y, alpha);
                p += 1;
            }
        }
    }

    /// # Safety
    /// As `super::gemv_rowmajor`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemv_rowmajor<const R: usize>(
        k: usize,
        n: usize,
        x: [*const f32; R],
        b: *const f32,
        ldb: isize,
        y: [*mut f32; R],
        alpha: f32,
        accumulate: bool,
    ) {
        if R <= 2 && n >= 32 && k * n * 4 >= nrt_hal::tuning::GEMV_STREAM_MIN_BYTES {
            // SAFETY: forwarded contract. G·R broadcasts plus R·Q accumulators and one loaded
            // B vector stay within the 16 registers.
            unsafe {
                match R {
                    1 => stream_rows::<R, 8, 4>(k, n, x, b, ldb, y, alpha, accumulate),
                    _ => stream_rows::<R, 4, 2>(k, n, x, b, ldb, y, alpha, accumulate),
                }
            }
            return;
        }
        let at = |j: usize| y.map(|yi| yi.wrapping_add(j));
        let mut j = 0;
        // SAFETY: (every strip) columns j..j+8W ≤ n lie inside B and every y_i. Widths keep
        // R·W accumulators plus the loaded B vectors within the 16 registers.
        unsafe {
            match R {
                1 => {
                    while j + 64 <= n {
                        strip::<R, 8>(k, x, b.add(j), ldb, at(j), alpha, accumulate);
                        j += 64;
                    }
                    if j + 32 <= n {
                        strip::<R, 4>(k, x, b.add(j), ldb, at(j), alpha, accumulate);
                        j += 32;
                    }
                }
                2 => {
                    while j + 32 <= n {
                        strip::<R, 4>(k, x, b.add(j), ldb, at(j), alpha, accumulate);
                        j += 32;
                    }
                }
                _ => {}
            }
            while j + 16 <= n {
                strip::<R, 2>(k, x, b.add(j), ldb, at(j), alpha, accumulate);
                j += 16;
            }
            if j + 8 <= n {
                strip::<R, 1>(k, x, b.add(j), ldb, at(j), alpha, accumulate);
                j += 8;
            }
        }
        if j < n {
            // Up to 7 tail columns: accumulate them together, row by row of B.
            let t = n - j;
            let mut s = [[0.0f32; 8]; R];
            for p in 0..k {
                // SAFETY: row p, columns j..n of B; x_i[p].
                unsafe {
                    let row = b.offset(p as isize * ldb).add(j);
                    for (si, xi) in s.iter_mut().zip(x) {
                        let xp = *xi.add(p);
                        for (q, sq) in si[..t].iter_mut().enumerate() {
                            *sq += xp * *row.add(q);
                        }
                    }
                }
            }
            for (si, yi) in s.iter().zip(y) {
                for (q, sq) in si[..t].iter().enumerate() {
                    // SAFETY: y_i[j + q] with j + q < n.
                    unsafe {
                        let yp = yi.add(j + q);
                        *yp = alpha * sq + if accumulate { *yp } else { 0.0 };
                    }
                }
            }
        }
    }

    /// Horizontal sum of 8 lanes.
    #[inline(always)]
    fn hsum(v: __m256) -> f32 {
        // SAFETY: register-only intrinsics; AVX is enabled at compile time (this module is
        // compiled only with avx2 + fma).
        unsafe {
            let lo = _mm256_castps256_ps128(v);
            let hi = _mm256_extractf128_ps::<1>(v);
            let s = _mm_add_ps(lo, hi);
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_movehdup_ps(s));
            _mm_cvtss_f32(s)
        }
    }

    /// Dot products of `R` rows of A with `J` rows `r + j·ldr`, `U` accumulators per pair.
    ///
    /// # Safety
    /// Each `x_i` readable for `k`; rows `r + j·ldr` readable for `k`, `j < J`.
    #[inline(always)]
    unsafe fn dots<const R: usize, const J: usize, const U: usize>(
        k: usize,
        x: [*const f32; R],
        r: *const f32,
        ldr: isize,
    ) -> [[f32; J]; R] {
        // SAFETY: every load reads index < k of an x_i or of one of the J rows.
        unsafe {
            let rows: [*const f32; J] = core::array::from_fn(|j| r.offset(j as isize * ldr));
            let mut c = [[[_mm256_setzero_ps(); U]; J]; R];
            let mut p = 0;
            while p + 8 * U <= k {
                for u in 0..U {
                    let bv: [__m256; J] =
                        core::array::from_fn(|j| _mm256_loadu_ps(rows[j].add(p + 8 * u)));
                    for (ci, xi) in c.iter_mut().zip(x) {
                        let xv = _mm256_loadu_ps(xi.add(p + 8 * u));
                        for (cij, bj) in ci.iter_mut().zip(bv) {
                            cij[u] = _mm256_fmadd_ps(xv, bj, cij[u]);
                        }
                    }
                }
                p += 8 * U;
            }
            while p + 8 <= k {
                let bv: [__m256; J] = core::array::from_fn(|j| _mm256_loadu_ps(rows[j].add(p)));
                for (ci, xi) in c.iter_mut().zip(x) {
                    let xv = _mm256_loadu_ps(xi.add(p));
                    for (cij, bj) in ci.iter_mut().zip(bv) {
                        cij[0] = _mm256_fmadd_ps(xv, bj, cij[0]);
                    }
                }
                p += 8;
            }
            let mut out = [[0.0f32; J]; R];
            for i in 0..R {
                for j in 0..J {
                    let v = c[i][j][1..]
                        .iter()
                        .fold(c[i][j][0], |v, cu| _mm256_add_ps(v, *cu));
                    let mut s = hsum(v);
                    for q in p..k {
                        s += *x[i].add(q) * *rows[j].add(q);
                    }
                    out[i][j] = s;
                }
            }
            out
        }
    }

    /// # Safety
    /// As `super::gemv_dot`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemv_dot<const R: usize>(
        k: usize,
        n: usize,
        x: [*const f32; R],
        r: *const f32,
        ldr: isize,
        y: [*mut f32; R],
        ys: isize,
        alpha: f32,
        accumulate: bool,
    ) {
        let put = |i: usize, j: usize, s: f32| {
            let yp = y[i].wrapping_offset(j as isize * ys);
            // SAFETY: y_i[j·ys] with j < n is writable per the contract.
            unsafe { *yp = alpha * s + if accumulate { *yp } else { 0.0 } };
        };
        macro_rules! block {
            ($j:literal, $u:literal, $jj:expr) => {{
                // SAFETY: rows jj..jj+J < n.
                let s = unsafe { dots::<R, $j, $u>(k, x, r.offset($jj as isize * ldr), ldr) };
                for (i, si) in s.iter().enumerate() {
                    for (q, v) in si.iter().enumerate() {
                        put(i, $jj + q, *v);
                    }
                }
            }};
        }
        let mut j = 0;
        // R·J·U ≤ 8 accumulators: 4 rows of B at a time for one row of A, 2 for more.
        if R == 1 {
            while j + 4 <= n {
                block!(4, 2, j);
                j += 4;
            }
        } else {
            while j + 2 <= n {
                if R == 2 {
                    block!(2, 2, j);
                } else {
                    block!(2, 1, j);
                }
                j += 2;
            }
        }
        while j < n {
            block!(1, 2, j);
            j += 1;
        }
    }
}

/// The AVX-512 strips of the 3- and 4-row GEMV (chosen at run time).
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
mod avx512 {
    use core::arch::x86_64::*;

    /// Whether the CPU runs these kernels.
    pub fn available() -> bool {
        crate::cpu::avx512f()
    }

    /// `y_i[j] = alpha·Σ_p x_i[p]·B[p, j]` (`+ y_i[j]` when `accumulate`) for the first `n`
    /// columns, `n` a multiple of 64, in strips of 64 columns: R×4 accumulators, B's row
    /// segment loaded once per strip row.
    ///
    /// # Safety
    /// As [`super::gemv_rowmajor`]; AVX-512F present.
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f")]
    pub unsafe fn gemv_strips<const R: usize>(
        k: usize,
        n: usize,
        x: [*const f32; R],
        b: *const f32,
        ldb: isize,
        y: [*mut f32; R],
        alpha: f32,
        accumulate: bool,
    ) {
        debug_assert!(n.is_multiple_of(64));
        let mut j = 0;
        while j < n {
            let mut acc = [[_mm512_setzero_ps(); 4]; R];
            for p in 0..k {
                // SAFETY: row p, columns j..j+64 of B; x_i[p] (the contract).
                unsafe {
                    let row = b.offset(p as isize * ldb).add(j);
                    let mut bv = [_mm512_setzero_ps(); 4];
                    for w in 0..4 {
                        bv[w] = _mm512_loadu_ps(row.add(16 * w));
                    }
                    for r in 0..R {
                        let xv = _mm512_set1_ps(*x[r].add(p));
                        for w in 0..4 {
                            acc[r][w] = _mm512_fmadd_ps(xv, bv[w], acc[r][w]);
                        }
                    }
                }
            }
            let va = _mm512_set1_ps(alpha);
            for r in 0..R {
                for w in 0..4 {
                    // SAFETY: y_i[j + 16w .. +16] lies inside y_i's n columns.
                    unsafe {
                        let yp = y[r].add(j + 16 * w);
                        let mut v = _mm512_mul_ps(va, acc[r][w]);
                        if accumulate {
                            v = _mm512_add_ps(v, _mm512_loadu_ps(yp));
                        }
                        _mm512_storeu_ps(yp, v);
                    }
                }
            }
            j += 64;
        }
    }

    /// The row-streaming GEMV ([`super::avx`]'s `stream_rows`, for a B too large for L2)
    /// 16 lanes wide: `G` rows of B read in memory order per step, each `y_i` (in L1)
    /// accumulating them in blocks of 64 columns, for the first `n` columns, `n` a multiple
    /// of 64. Half the load and FMA instructions of the AVX2 kernel per byte of B. `mlp`
    /// (four 512×512 layers, batch 1; AMD EPYC Zen 5, `ab.sh` 12 pairs): `G` = 8 0.907× the
    /// AVX2 kernel, then `G` = 4 0.958× of 8, 16 1.09×, 2 1.19×.
    ///
    /// # Safety
    /// As [`super::gemv_rowmajor`]; AVX-512F present; `n` a multiple of 64.
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f")]
    pub unsafe fn stream_rows<const R: usize, const G: usize>(
        k: usize,
        n: usize,
        x: [*const f32; R],
        b: *const f32,
        ldb: isize,
        y: [*mut f32; R],
        alpha: f32,
        accumulate: bool,
    ) {
        debug_assert!(n.is_multiple_of(64));
        if !accumulate {
            for yi in y {
                // SAFETY: y_i writable for n floats (the contract).
                unsafe { core::ptr::write_bytes(yi, 0, n) };
            }
        }
        let mut p = 0;
        while p < k {
            let g = G.min(k - p);
            // alpha·x_i[p + t] for the step's rows (0 past the last: those rows are not read).
            let mut xv = [[_mm512_setzero_ps(); G]; R];
            let mut rows = [b; G];
            for t in 0..g {
                rows[t] = b.wrapping_offset((p + t) as isize * ldb);
                for r in 0..R {
                    // SAFETY: x_i[p + t], p + t < k.
                    xv[r][t] = _mm512_set1_ps(alpha * unsafe { *x[r].add(p + t) });
                }
            }
            let mut j = 0;
            while j < n {
                let mut acc = [[_mm512_setzero_ps(); 4]; R];
                for r in 0..R {
                    for w in 0..4 {
                        // SAFETY: y_i[j + 16w .. +16] inside its n columns.
                        acc[r][w] = unsafe { _mm512_loadu_ps(y[r].add(j + 16 * w)) };
                    }
                }
                for t in 0..g {
                    for w in 0..4 {
                        // SAFETY: row p + t < k, columns j + 16w .. +16 < n of B.
                        let bv = unsafe { _mm512_loadu_ps(rows[t].add(j + 16 * w)) };
                        for r in 0..R {
                            acc[r][w] = _mm512_fmadd_ps(xv[r][t], bv, acc[r][w]);
                        }
                    }
                }
                for r in 0..R {
                    for w in 0..4 {
                        // SAFETY: as the loads of y_i above.
                        unsafe { _mm512_storeu_ps(y[r].add(j + 16 * w), acc[r][w]) };
                    }
                }
                j += 64;
            }
            p += G;
        }
    }
}

impl Execute for op::MatMul {
    unsafe fn execute(&self, mem: DeviceMemory, ws: &mut Workspace) -> Result<(), KernelError> {
        // The caller guarantees every operand in bounds and aligned ([`crate::execute`]).
        let op::MatMul {
            a,
            b,
            c,
            alpha,
            flags,
            epilogue,
        } = self;

        // SAFETY: see above.
        unsafe { matmul(a, b, c, *alpha, *flags, epilogue, mem, ws) }
    }
}
