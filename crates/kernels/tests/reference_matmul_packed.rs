//! MatMul with B packed in panels (constant weights) against the f64 reference: every
//! kernel this CPU has, tails, splits, K blocks, the bf16 paths.

// Reference code indexes dimensions explicitly: clearer than iterator chains here.
#![allow(clippy::needless_range_loop)]

mod common;

use common::reference::{act_ref, cfg, random_epilogue};
use common::{Arena, Rng, indices};
use nrt_hal::DType;
use nrt_isa::op;
use nrt_isa::{AccessPattern, ActFunc, Epilogue, Op, matmul_flags};
use nrt_kernels::Workspace;
use nrt_kernels::elem::{bf16_to_f32, f32_to_bf16};
use proptest::prelude::*;

//===--- MatMul with B packed in panels (constant weights) ---------------------------===//

/// A `PACKED_B` MatMul against the f64 reference: B is a `k × n_full` matrix packed in panels
/// of `nr` columns, of which the instruction uses columns `start..start+n` (`start` a
/// multiple of `nr`: one core's half of a split layer, whose last panel may run on into the
/// other half's columns); A and C random layouts and batches, `flags`: accumulate,
/// transposed A; optional epilogue.
#[allow(clippy::too_many_arguments)]
fn matmul_packed_case(
    m_: usize,
    k: usize,
    n: usize,
    nr: usize,
    start: usize,
    n_full: usize,
    seed: u64,
    flags: u32,
    batch: [u32; 2],
    epi: bool,
) {
    matmul_packed_case_e(
        m_,
        k,
        n,
        nr,
        start,
        n_full,
        seed,
        flags,
        batch,
        u8::from(epi),
    );
}

/// [`matmul_packed_case`] with `epi`: 0 none, 1 random, 2 a per-column bias and Relu (what
/// the packed kernel applies in registers).
#[allow(clippy::too_many_arguments)]
fn matmul_packed_case_e(
    m_: usize,
    k: usize,
    n: usize,
    nr: usize,
    start: usize,
    n_full: usize,
    seed: u64,
    flags: u32,
    batch: [u32; 2],
    epi: u8,
) {
    use nrt_kernels::gemm_packed::{pack_b, packed_len};
    assert!(start.is_multiple_of(nr) && start + n <= n_full);
    let mut rng = Rng::new(seed);
    let mut m = Arena::new(16 << 20);
    let ta = flags & matmul_flags::TRANSPOSE_A != 0;
    let acc = flags & matmul_flags::ACCUMULATE != 0;
    let (m32, k32, n32) = (m_ as u32, k as u32, n as u32);
    let ash = if ta {
        [batch[0], batch[1], k32, m32]
    } else {
        [batch[0], batch[1], m32, k32]
    };
    let csh = [batch[0], batch[1], m32, n32];
    let a = m.random(&mut rng, DType::F32, ash, true);
    let c = m.random(&mut rng, DType::F32, csh, false);
    m.fill_f32(&a, &mut rng, -1.0, 1.0);
    m.fill_f32(&c, &mut rng, -1.0, 1.0);
    let bval: Vec<f32> = (0..k * n_full).map(|_| rng.f32(-1.0, 1.0)).collect();
    let len = packed_len(k, n_full, nr).unwrap();
    let mut packed = vec![0f32; len];
    pack_b(k, n_full, nr, |p, j| bval[p * n_full + j], &mut packed);
    let base = m.alloc(len as u64 * 4);
    for (i, v) in packed.iter().enumerate() {
        m.bytes()[base as usize + 4 * i..base as usize + 4 * i + 4]
            .copy_from_slice(&v.to_le_bytes());
    }
    let b = AccessPattern {
        addr: base + (start * k * 4) as u64,
        dtype: DType::F32,
        shape: [1, n.div_ceil(nr) as u32, k32, nr as u32],
        stride: [0, (k * nr) as i32, nr as i32, 1],
    };
    let c0 = m.read_f32(&c);
    let alpha = if rng.chance(0.5) {
        1.0
    } else {
        rng.f32(-2.0, 2.0)
    };
    let epilogue = match epi {
        0 => Epilogue::NONE,
        1 => random_epilogue(&mut rng, &mut m, csh),
        _ => {
            let bias = AccessPattern {
                shape: csh,
                stride: [0, 0, 0, 1],
                ..m.dense(DType::F32, [1, 1, 1, n32])
            };
            m.fill_f32(&bias, &mut rng, -1.0, 1.0);
            Epilogue {
                bias: Some(bias),
                func: ActFunc::Relu,
                ..Epilogue::NONE
            }
        }
    };
    let op = Op::MatMul(op::MatMul {
        a,
        b,
        c,
        alpha,
        flags: flags | matmul_flags::PACKED_B,
        epilogue,
    });
    // What the device runs is what the decoder accepts.
    let mut bytes = Vec::new();
    nrt_isa::Instruction::new(op).encode(&mut bytes);
    let (back, _) = nrt_isa::Instruction::decode(&bytes).expect("a valid packed MatMul");
    assert_eq!(back.op, op);
    m.run(&op, &mut Workspace::new()).unwrap();
    let got = m.read_f32(&c);
    for (q, idx) in indices(csh).enumerate() {
        let [b0, b1, i, j] = idx;
        let (mut s, mut sa) = (0.0f64, 0.0f64);
        for p in 0..k {
            let av = m.get_f32(&a, if ta { [b0, b1, p, i] } else { [b0, b1, i, p] }) as f64;
            let bv = bval[p * n_full + start + j] as f64;
            s += av * bv;
            sa += (av * bv).abs();
        }
        let prev = c0[q] as f64;
        let mut y = alpha as f64 * s + if acc { prev } else { 0.0 };
        let mut t = 1e-5 * (sa * alpha.abs() as f64 + prev.abs()) + 1e-6;
        for x in [&epilogue.bias, &epilogue.residual].into_iter().flatten() {
            let v = m.get_f32(x, idx) as f64;
            y += v;
            t += 1e-6 * v.abs();
        }
        let fy = act_ref(
            epilogue.func,
            y,
            epilogue.act_alpha as f64,
            epilogue.act_beta as f64,
        );
        let tol = 1.2 * t + 4e-6 * fy.abs() + 1e-6;
        assert!(
            ((got[q] as f64) - fy).abs() <= tol,
            "m{m_} k{k} n{n} nr{nr} start{start}/{n_full} f{flags} {epilogue:?}: {idx:?} {} vs {fy}",
            got[q]
        );
    }
}

#[test]
fn matmul_packed_tails_splits_and_k_blocks() {
    // Row tails of every length against the 14-row (AVX-512) and 6-row (AVX2) tiles, column
    // tails inside the last panel, K past one K block (512), the second half of a split B
    // (its last panel continuing into columns it must not write), every panel width, rows of
    // A that alias in L1.
    let shapes = [
        (1, 1, 1),
        (14, 16, 32),
        (15, 33, 31),
        (29, 7, 65),
        (6, 100, 17),
        (64, 64, 64),
        (3, 513, 40),
        (20, 1100, 70),
        (41, 3, 100),
        (13, 64, 129),
        // Rows of A 4 KiB apart (in place) or K = 1024 (transposed A, gathered): A is copied
        // with its rows 16 floats further apart.
        (17, 1024, 40),
        // Two column blocks of B kept in L2 (512 KiB: 256 columns of a 512-deep K block).
        (5, 600, 300),
    ];
    for (i, &(m_, k, n)) in shapes.iter().enumerate() {
        for (w, nr) in [16usize, 32, 64].into_iter().enumerate() {
            let seed = (i * 3 + w) as u64;
            let flags = (seed % 4) as u32; // accumulate, transposed A
            matmul_packed_case(
                m_,
                k,
                n,
                nr,
                0,
                n,
                seed,
                flags,
                [1, 1],
                seed.is_multiple_of(3),
            );
            // The second half of a split: n_full = start + n + a few columns.
            let start = nr * (1 + i % 2);
            let n_full = start + n + (i % 5);
            matmul_packed_case(m_, k, n, nr, start, n_full, seed + 99, flags, [1, 1], false);
            // Bias and Relu in registers (over two K blocks where K > 512).
            matmul_packed_case_e(m_, k, n, nr, start, n_full, seed + 7, flags, [2, 1], 2);
        }
    }
}

proptest! {
    #![proptest_config(cfg(60))]

    #[test]
    fn matmul_packed_random(
        seed in any::<u64>(),
        m_ in 1usize..40,
        k in 1usize..70,
        n in 1usize..140,
        w in 0usize..3,
        flags in 0u32..4,
        b0 in 1u32..3,
        b1 in 1u32..3,
        split in any::<bool>(),
        epi in any::<bool>(),
    ) {
        let nr = [16, 32, 64][w];
        let (start, n_full) = if split { (nr, nr + n + (seed % 7) as usize) } else { (0, n) };
        matmul_packed_case(m_, k, n, nr, start, n_full, seed, flags, [b0, b1], epi);
    }
}

/// Every packed-GEMM kernel this CPU has (AVX-512, AVX2, portable), called directly, against
/// the f64 reference: C with a row stride, accumulate, alpha, a column range of B starting
/// at a panel boundary.
#[test]
fn matmul_packed_every_isa() {
    let mut rng = Rng::new(7);
    for case in 0..60u64 {
        let m_ = 1 + rng.below(33) as usize;
        let k = 1 + rng.below(if case % 10 == 0 { 1200 } else { 80 }) as usize;
        let n = 1 + rng.below(150) as usize;
        let nr = [16, 32, 64][(case % 3) as usize];
        check_packed_gemm(&mut rng, m_, k, n, nr, false);
    }
}

/// The packed GEMV (1 to 4 rows of A; AVX-512 streams whole panels with several steps of K
/// in flight) on every tail: K below and off a multiple of its unroll, a last panel cut short
/// by N (and N under one panel), C row-major and column-major (the epilogue's strided path).
#[test]
fn matmul_packed_gemv_tails() {
    let mut rng = Rng::new(41);
    for case in 0..120u64 {
        let m_ = 1 + (case % 4) as usize;
        let nr = [16, 32, 64][(case / 4 % 3) as usize];
        let k = match case % 5 {
            0 => 1 + rng.below(9) as usize,
            1 => 8 * (1 + rng.below(40) as usize),
            _ => 1 + rng.below(600) as usize,
        };
        let n = 1 + rng.below(3 * nr as u64) as usize;
        check_packed_gemm(&mut rng, m_, k, n, nr, case % 2 == 1);
    }
}

/// One random product `m×k · k×n` through [`gemm_packed_on`] on every available kernel,
/// against the f64 reference (C column-major when `col_major`).
fn check_packed_gemm(rng: &mut Rng, m_: usize, k: usize, n: usize, nr: usize, col_major: bool) {
    use nrt_kernels::gemm_packed::{Isa, Packed, TileEpilogue, gemm_packed_on, pack_b, packed_len};
    use nrt_kernels::matmul::Mat;
    let isas: Vec<Isa> = [Isa::Avx512, Isa::Avx2, Isa::Portable]
        .into_iter()
        .filter(|i| i.available())
        .collect();
    let start = nr * rng.below(2) as usize;
    let n_full = start + n + rng.below(5) as usize;
    let lda = k + rng.below(3) as usize;
    // C's element (i, j) at i·rs + j·cs; `len` slots, the ones past the product's
    // columns (row-major) or rows (column-major) left alone.
    let (rs, cs, len) = if col_major {
        let ld = m_ + rng.below(3) as usize;
        (1, ld, ld * n)
    } else {
        let ld = n + rng.below(3) as usize;
        (ld, 1, m_ * ld)
    };
    let a: Vec<f32> = (0..m_ * lda).map(|_| rng.f32(-1.0, 1.0)).collect();
    let bv: Vec<f32> = (0..k * n_full).map(|_| rng.f32(-1.0, 1.0)).collect();
    let c0: Vec<f32> = (0..len).map(|_| rng.f32(-1.0, 1.0)).collect();
    let mut packed = vec![0f32; packed_len(k, n_full, nr).unwrap()];
    pack_b(k, n_full, nr, |p, j| bv[p * n_full + j], &mut packed);
    let accumulate = rng.chance(0.5);
    let alpha = if rng.chance(0.5) { 1.0 } else { -0.75 };
    // The in-register epilogue: a per-column bias of B's full width (the tile reads it
    // from its first column on), Relu.
    // And a per-row bias (a convolution's per-channel bias).
    let bias: Vec<f32> = (0..n_full).map(|_| rng.f32(-1.0, 1.0)).collect();
    let row_bias: Vec<f32> = (0..m_).map(|_| rng.f32(-1.0, 1.0)).collect();
    let use_bias = rng.chance(0.5);
    let use_row_bias = rng.chance(0.5);
    let relu = rng.chance(0.5);
    let epi = TileEpilogue {
        bias: if use_bias {
            bias[start..].as_ptr()
        } else {
            core::ptr::null()
        },
        row_bias: if use_row_bias {
            row_bias.as_ptr()
        } else {
            core::ptr::null()
        },
        relu,
    };
    for &isa in &isas {
        let mut c = c0.clone();
        // SAFETY: A is m×k with row stride lda, C m×n with strides (rs, cs) inside
        // `len`, B's panels from `start` cover n columns; the kernel is available.
        unsafe {
            gemm_packed_on(
                isa,
                m_,
                n,
                k,
                Mat {
                    ptr: a.as_ptr() as *mut f32,
                    rs: lda as isize,
                    cs: 1,
                },
                Packed {
                    ptr: packed.as_ptr().add(start * k),
                    nr,
                    panel_stride: (k * nr) as isize,
                },
                Mat {
                    ptr: c.as_mut_ptr(),
                    rs: rs as isize,
                    cs: cs as isize,
                },
                alpha,
                accumulate,
                epi,
            )
        };
        for (at, (&got, &prev)) in c.iter().zip(&c0).enumerate() {
            let (i, j) = if col_major {
                (at % cs, at / cs)
            } else {
                (at / rs, at % rs)
            };
            let (got, prev) = (got as f64, prev as f64);
            if i >= m_ || j >= n {
                assert_eq!(got, prev, "{isa:?} wrote outside C at ({i}, {j})");
                continue;
            }
            let (mut s, mut sa) = (0.0f64, 0.0f64);
            for p in 0..k {
                let x = a[i * lda + p] as f64 * bv[p * n_full + start + j] as f64;
                s += x;
                sa += x.abs();
            }
            let mut want = alpha as f64 * s + if accumulate { prev } else { 0.0 };
            if use_bias {
                want += bias[start + j] as f64;
            }
            if use_row_bias {
                want += row_bias[i] as f64;
            }
            if relu && want < 0.0 {
                want = 0.0;
            }
            assert!(
                (got - want).abs() <= 1e-5 * (sa + prev.abs() + 1.0) + 1e-6,
                "{isa:?} m{m_} k{k} n{n} nr{nr} start{start} col-major {col_major} bias \
                 {use_bias} row bias {use_row_bias} relu {relu}: ({i}, {j}) {got} vs {want}"
            );
        }
    }
}

/// The bf16 packed GEMM on the AMX tile unit (where this process has it), against the f64
/// reference on A rounded to bf16: M across 32-row blocks and a last block of ≤ 16 rows, K
/// with and without a partial 32-pair chunk (its B rows come from a zero-padded copy: the
/// panels are followed by NaNs here, which would poison a sum that read past K), column
/// and row biases, Relu, accumulate, and C row-major or column-major.
#[test]
fn matmul_packed_bf16_amx() {
    use nrt_kernels::gemm_packed::{Bf16Kernel, PackedBf16, TileEpilogue, gemm_packed_bf16};
    use nrt_kernels::matmul::Mat;
    if !Bf16Kernel::Amx.available() {
        eprintln!("no AMX-BF16 here: nothing to test");
        return;
    }
    let mut rng = Rng::new(23);
    for case in 0..40u64 {
        let m_ = 1 + rng.below(if case % 4 == 0 { 80 } else { 40 }) as usize;
        let k = if case % 3 == 0 {
            32 * (1 + rng.below(8) as usize)
        } else {
            1 + rng.below(300) as usize
        };
        let n = 1 + rng.below(140) as usize;
        let nr = [32, 64][(case % 2) as usize];
        let kp = k.div_ceil(2);
        let a: Vec<f32> = (0..m_ * k).map(|_| rng.f32(-1.0, 1.0)).collect();
        let bh: Vec<u16> = (0..k * n)
            .map(|_| f32_to_bf16(rng.f32(-1.0, 1.0)))
            .collect();
        let mut packed = matmul_flags::pack_b_pairs(k, n, nr, |p, j| bh[p * n + j]);
        let len = packed.len();
        packed.extend(std::iter::repeat_n(0x7FC0u16, 64 * nr)); // NaNs past the panels
        let col_major = rng.chance(0.4);
        let ld = if col_major { m_ + 3 } else { n + 2 };
        let c0: Vec<f32> = (0..ld * if col_major { n } else { m_ })
            .map(|_| rng.f32(-1.0, 1.0))
            .collect();
        let at = |i: usize, j: usize| if col_major { j * ld + i } else { i * ld + j };
        let bias: Vec<f32> = (0..n).map(|_| rng.f32(-1.0, 1.0)).collect();
        let row_bias: Vec<f32> = (0..m_).map(|_| rng.f32(-1.0, 1.0)).collect();
        let (use_bias, use_row_bias, relu, accumulate) = (
            rng.chance(0.5),
            rng.chance(0.5),
            rng.chance(0.5),
            rng.chance(0.5),
        );
        let alpha = if rng.chance(0.5) { 1.0 } else { -0.5 };
        let mut c = c0.clone();
        // SAFETY: A m×k, B's panels (then NaNs), C m×n at stride ld (row- or column-major),
        // the biases of n and m floats: all inside their vectors; AMX available.
        unsafe {
            gemm_packed_bf16(
                m_,
                n,
                k,
                Mat {
                    ptr: a.as_ptr() as *mut f32,
                    rs: k as isize,
                    cs: 1,
                },
                PackedBf16 {
                    ptr: packed.as_ptr(),
                    nr,
                    panel_stride: (kp * 2 * nr) as isize,
                },
                Mat {
                    ptr: c.as_mut_ptr(),
                    rs: if col_major { 1 } else { ld as isize },
                    cs: if col_major { ld as isize } else { 1 },
                },
                alpha,
                accumulate,
                TileEpilogue {
                    bias: if use_bias {
                        bias.as_ptr()
                    } else {
                        core::ptr::null()
                    },
                    row_bias: if use_row_bias {
                        row_bias.as_ptr()
                    } else {
                        core::ptr::null()
                    },
                    relu,
                },
                Bf16Kernel::Amx,
                &mut Workspace::new(),
            )
            .unwrap()
        };
        assert!(packed[len..].iter().all(|&h| h == 0x7FC0), "wrote into B");
        for i in 0..m_ {
            for j in 0..n {
                let (mut s, mut sa) = (0.0f64, 0.0f64);
                for p in 0..k {
                    let x = bf16_to_f32(f32_to_bf16(a[i * k + p])) as f64
                        * bf16_to_f32(bh[p * n + j]) as f64;
                    s += x;
                    sa += x.abs();
                }
                let prev = c0[at(i, j)] as f64;
                let mut y = alpha as f64 * s + if accumulate { prev } else { 0.0 };
                if use_bias {
                    y += bias[j] as f64;
                }
                if use_row_bias {
                    y += row_bias[i] as f64;
                }
                if relu && y < 0.0 {
                    y = 0.0;
                }
                let got = c[at(i, j)] as f64;
                assert!(
                    (got - y).abs() <= 1e-4 * (sa + prev.abs() + 1.0),
                    "case {case} m{m_} k{k} n{n} nr{nr} col-major {col_major}: ({i}, {j}) {got} vs {y}"
                );
            }
        }
        // Nothing outside the m×n block of C moved.
        for (x, (&g, &p)) in c.iter().zip(&c0).enumerate() {
            let (i, j) = if col_major {
                (x % ld, x / ld)
            } else {
                (x / ld, x % ld)
            };
            if i >= m_ || j >= n {
                assert_eq!(
                    g.to_bits(),
                    p.to_bits(),
                    "case {case}: wrote outside C at {x}"
                );
            }
        }
    }
}

/// The bf16 packed GEMM (`vdpbf16ps` where the CPU has AVX-512 BF16, and the portable loop
/// everywhere) against the f64 reference on A rounded to bf16: odd K (the padded pair),
/// column ranges of B from a panel boundary, every panel width, accumulate, bias and Relu,
/// 1 to 4 rows (the packed GEMV) in a quarter of the cases; half the cases through the
/// decoded `Op::MatMul`.
#[test]
fn matmul_packed_bf16_every_path() {
    use nrt_kernels::gemm_packed::{Bf16Kernel, PackedBf16, TileEpilogue, gemm_packed_bf16};
    use nrt_kernels::matmul::Mat;
    let mut rng = Rng::new(11);
    let paths: Vec<Bf16Kernel> = [
        Bf16Kernel::Amx,
        Bf16Kernel::Dot,
        Bf16Kernel::Avx2,
        Bf16Kernel::Portable,
    ]
    .into_iter()
    .filter(|k| k.available())
    .collect();
    for case in 0..64u64 {
        // A quarter of the cases 1 to 4 rows: the packed GEMV.
        let m_ = if case % 4 == 1 {
            1 + (case / 4 % 4) as usize
        } else {
            1 + rng.below(33) as usize
        };
        let k = 1 + rng.below(if case % 8 == 0 { 1200 } else { 90 }) as usize;
        // 1024 pairs of K: rows of bf16 A 4 KiB apart, which the kernel pads.
        let k = if case == 5 { 2048 } else { k };
        let n = 1 + rng.below(150) as usize;
        let nr = [16, 32, 64][(case % 3) as usize];
        let start = nr * rng.below(2) as usize;
        let n_full = start + n + rng.below(5) as usize;
        let ldc = n + rng.below(3) as usize;
        let a: Vec<f32> = (0..m_ * k).map(|_| rng.f32(-1.0, 1.0)).collect();
        let bh: Vec<u16> = (0..k * n_full)
            .map(|_| f32_to_bf16(rng.f32(-1.0, 1.0)))
            .collect();
        let c0: Vec<f32> = (0..m_ * ldc).map(|_| rng.f32(-1.0, 1.0)).collect();
        let bias: Vec<f32> = (0..n_full).map(|_| rng.f32(-1.0, 1.0)).collect();
        let packed = matmul_flags::pack_b_pairs(k, n_full, nr, |p, j| bh[p * n_full + j]);
        let kp = k.div_ceil(2);
        let accumulate = rng.chance(0.5);
        let alpha = if rng.chance(0.5) { 1.0 } else { 0.5 };
        let (use_bias, relu) = (rng.chance(0.5), rng.chance(0.5));
        let want = |i: usize, j: usize| {
            let (mut s, mut sa) = (0.0f64, 0.0f64);
            for p in 0..k {
                let x = bf16_to_f32(f32_to_bf16(a[i * k + p])) as f64
                    * bf16_to_f32(bh[p * n_full + start + j]) as f64;
                s += x;
                sa += x.abs();
            }
            let prev = c0[i * ldc + j] as f64;
            let mut y = alpha as f64 * s + if accumulate { prev } else { 0.0 };
            if use_bias {
                y += bias[start + j] as f64;
            }
            if relu && y < 0.0 {
                y = 0.0;
            }
            (y, 1e-4 * (sa + prev.abs() + 1.0))
        };
        for &kernel in &paths {
            let mut c = c0.clone();
            if case % 2 == 0 {
                // SAFETY: A m×k, C m×n (row stride ldc), B's panels from `start`, the bias
                // of n_full columns: all inside their vectors.
                unsafe {
                    gemm_packed_bf16(
                        m_,
                        n,
                        k,
                        Mat {
                            ptr: a.as_ptr() as *mut f32,
                            rs: k as isize,
                            cs: 1,
                        },
                        PackedBf16 {
                            ptr: packed.as_ptr().add(start * kp * 2),
                            nr,
                            panel_stride: (kp * 2 * nr) as isize,
                        },
                        Mat {
                            ptr: c.as_mut_ptr(),
                            rs: ldc as isize,
                            cs: 1,
                        },
                        alpha,
                        accumulate,
                        TileEpilogue {
                            bias: if use_bias {
                                bias[start..].as_ptr()
                            } else {
                                core::ptr::null()
                            },
                            row_bias: core::ptr::null(),
                            relu,
                        },
                        kernel,
                        &mut Workspace::new(),
                    )
                    .unwrap()
                };
            } else {
                if kernel != Bf16Kernel::best() {
                    continue; // the op takes the best kernel on this CPU
                }
                // Through the decoded instruction, C dense (ldc = n here).
                let mut ar = Arena::new(8 << 20);
                let csh = [1, 1, m_ as u32, n as u32];
                let ap = ar.dense(DType::F32, [1, 1, m_ as u32, k as u32]);
                let cp = ar.dense(DType::F32, csh);
                let base = ar.alloc(packed.len() as u64 * 2);
                for (i, v) in packed.iter().enumerate() {
                    ar.bytes()[base as usize + 2 * i..base as usize + 2 * i + 2]
                        .copy_from_slice(&v.to_le_bytes());
                }
                for i in 0..m_ {
                    for p in 0..k {
                        ar.set_f32(&ap, [0, 0, i, p], a[i * k + p]);
                    }
                    for j in 0..n {
                        ar.set_f32(&cp, [0, 0, i, j], c0[i * ldc + j]);
                    }
                }
                let bp = AccessPattern {
                    addr: base + (start * kp * 2 * 2) as u64,
                    dtype: DType::Bf16,
                    shape: [1, n.div_ceil(nr) as u32, kp as u32, 2 * nr as u32],
                    stride: [0, (kp * 2 * nr) as i32, 2 * nr as i32, 1],
                };
                let bias_ap = use_bias.then(|| {
                    let x = ar.dense(DType::F32, [1, 1, 1, n as u32]);
                    for j in 0..n {
                        ar.set_f32(&x, [0, 0, 0, j], bias[start + j]);
                    }
                    AccessPattern {
                        shape: csh,
                        stride: [0, 0, 0, 1],
                        ..x
                    }
                });
                let op = Op::MatMul(op::MatMul {
                    a: ap,
                    b: bp,
                    c: cp,
                    alpha,
                    flags: matmul_flags::PACKED_B
                        | if accumulate {
                            matmul_flags::ACCUMULATE
                        } else {
                            0
                        },
                    epilogue: Epilogue {
                        bias: bias_ap,
                        func: if relu {
                            ActFunc::Relu
                        } else {
                            ActFunc::Identity
                        },
                        ..Epilogue::NONE
                    },
                });
                let mut bytes = Vec::new();
                nrt_isa::Instruction::new(op).encode(&mut bytes);
                let (back, _) = nrt_isa::Instruction::decode(&bytes).expect("valid");
                assert_eq!(back.op, op);
                ar.run(&op, &mut Workspace::new()).unwrap();
                for i in 0..m_ {
                    for j in 0..n {
                        c[i * ldc + j] = ar.get_f32(&cp, [0, 0, i, j]);
                    }
                }
            }
            for i in 0..m_ {
                for j in 0..ldc {
                    let got = c[i * ldc + j] as f64;
                    if j >= n {
                        assert_eq!(got, c0[i * ldc + j] as f64, "wrote past N");
                        continue;
                    }
                    let (w, tol) = want(i, j);
                    assert!(
                        (got - w).abs() <= tol,
                        "case {case} {kernel:?} m{m_} k{k} n{n} nr{nr} start{start}: ({i}, \
                         {j}) {got} vs {w}"
                    );
                }
            }
        }
    }
}
