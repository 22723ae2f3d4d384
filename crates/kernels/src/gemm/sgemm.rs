//! The f32 GEMM for any strides: [`gemm_auto`] picks the GEMV kernels ([`super::gemv`]) or
//! the GEMM crate ([`gemm_f32`]).
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
//! this crate's own microkernels ([`super::packed`], `matmul_flags::PACKED_B`), which
//! then pack nothing per call and apply a per-column bias and Relu in registers; at
//! 64×512×512 that ran at 94–97% of the f32 peak against 89–90% for `private-gemm-x86` in
//! the same runs (isolated kernels, `cargo run --release -p nrt-kernels --example
//! packed_bench`, busy machine). The GEMM crate stays for every other product.

use super::gemv::{GEMV_GROUP, gemv_dot, gemv_rowmajor};
use super::types::Mat;
use crate::{KernelError, Workspace};
use nrt_hal::tuning::GEMV_MAX_ROWS;

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
