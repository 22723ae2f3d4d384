//! MatMul against the f64 reference: random shapes, layouts, batches, half-precision
//! weights and epilogues; the integer GEMM and its paths.

// Reference code indexes dimensions explicitly: clearer than iterator chains here.
#![allow(clippy::needless_range_loop)]

mod common;

use common::reference::{ARENA, act_ref, cfg, random_epilogue};
use common::{Arena, Rng, assert_close, indices};
use nrt_hal::DType;
use nrt_isa::op;
use nrt_isa::{AccessPattern, ActFunc, Epilogue, Op, matmul_flags};
use nrt_kernels::Workspace;
use nrt_kernels::elem::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use proptest::prelude::*;

//===--- matmul ----------------------------------------------------------------------===//

/// `layouts`: `Some(true)` random operand layouts, `Some(false)` dense, `None` either.
/// `epi`: whether a random [`Epilogue`] is added (`None`: either).
#[allow(clippy::too_many_arguments)]
fn matmul_case(
    m_: usize,
    k: usize,
    n: usize,
    seed: u64,
    flags: u32,
    batch: [u32; 2],
    layouts: Option<bool>,
    epi: Option<bool>,
) {
    matmul_case_b(m_, k, n, seed, flags, batch, layouts, epi, DType::F32)
}

/// [`matmul_case`] with B of element type `bdt` (f32, or bf16/f16 weights: then the
/// reference multiplies the stored half values, and A rounded to bf16 for bf16 B, in f64).
#[allow(clippy::too_many_arguments)]
fn matmul_case_b(
    m_: usize,
    k: usize,
    n: usize,
    seed: u64,
    flags: u32,
    batch: [u32; 2],
    layouts: Option<bool>,
    epi: Option<bool>,
    bdt: DType,
) {
    let mut rng = Rng::new(seed);
    let mut m = Arena::new(16 << 20);
    let ta = flags & matmul_flags::TRANSPOSE_A != 0;
    let tb = flags & matmul_flags::TRANSPOSE_B != 0;
    let acc = flags & matmul_flags::ACCUMULATE != 0;
    let (m32, k32, n32) = (m_ as u32, k as u32, n as u32);
    let ash = if ta {
        [batch[0], batch[1], k32, m32]
    } else {
        [batch[0], batch[1], m32, k32]
    };
    let bsh = if tb {
        [batch[0], batch[1], n32, k32]
    } else {
        [batch[0], batch[1], k32, n32]
    };
    let csh = [batch[0], batch[1], m32, n32];
    let random_layouts = layouts.unwrap_or_else(|| rng.chance(0.5));
    let (a, b, c) = if random_layouts {
        (
            m.random(&mut rng, DType::F32, ash, true),
            m.random(&mut rng, bdt, bsh, true),
            m.random(&mut rng, DType::F32, csh, false),
        )
    } else {
        (
            m.dense(DType::F32, ash),
            m.dense(bdt, bsh),
            m.dense(DType::F32, csh),
        )
    };
    m.fill_f32(&a, &mut rng, -1.0, 1.0);
    match bdt {
        DType::Bf16 => m.fill_with(&b, || f32_to_bf16(rng.f32(-1.0, 1.0)) as u64),
        DType::F16 => m.fill_with(&b, || f32_to_f16(rng.f32(-1.0, 1.0)) as u64),
        _ => m.fill_f32(&b, &mut rng, -1.0, 1.0),
    }
    m.fill_f32(&c, &mut rng, -1.0, 1.0);
    let c0 = m.read_f32(&c);
    let alpha = if rng.chance(0.5) {
        1.0
    } else {
        rng.f32(-2.0, 2.0)
    };
    let epilogue = if epi.unwrap_or_else(|| rng.chance(0.5)) {
        random_epilogue(&mut rng, &mut m, csh)
    } else {
        Epilogue::NONE
    };
    m.run(
        &Op::MatMul(op::MatMul {
            a,
            b,
            c,
            alpha,
            flags,
            epilogue,
        }),
        &mut Workspace::new(),
    )
    .unwrap();
    let got = m.read_f32(&c);
    let mut want = Vec::new();
    let mut tol = Vec::new();
    for idx in indices(csh) {
        let [b0, b1, i, j] = idx;
        let (mut s, mut sa) = (0.0f64, 0.0f64);
        for p in 0..k {
            let mut av = m.get_f32(&a, if ta { [b0, b1, p, i] } else { [b0, b1, i, p] });
            let bi = if tb { [b0, b1, j, p] } else { [b0, b1, p, j] };
            let bv = match bdt {
                DType::Bf16 => {
                    if flags & matmul_flags::F32_A == 0 {
                        av = bf16_to_f32(f32_to_bf16(av));
                    }
                    bf16_to_f32(m.get_raw(&b, bi) as u16)
                }
                DType::F16 => f16_to_f32(m.get_raw(&b, bi) as u16),
                _ => m.get_f32(&b, bi),
            };
            let (av, bv) = (av as f64, bv as f64);
            s += av * bv;
            sa += (av * bv).abs();
        }
        let prev = c0[want.len()] as f64;
        let mut y = alpha as f64 * s + if acc { prev } else { 0.0 };
        let mut t = 1e-5 * (sa * alpha.abs() as f64 + prev.abs()) + 1e-6;
        for x in [&epilogue.bias, &epilogue.residual].into_iter().flatten() {
            let v = m.get_f32(x, idx) as f64;
            y += v;
            t += 1e-6 * v.abs();
        }
        let (p, q) = (epilogue.act_alpha as f64, epilogue.act_beta as f64);
        let fy = act_ref(epilogue.func, y, p, q);
        // Every drawn function is 1.2-Lipschitz; its f32 evaluation adds a few ulp.
        want.push(fy);
        tol.push(1.2 * t + 4e-6 * fy.abs() + 1e-6);
    }
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            ((*g as f64) - w).abs() <= tol[i],
            "m{m_} k{k} n{n} f{flags} {bdt} {epilogue:?}: [{i}] {g} vs {w}"
        );
    }
}

proptest! {
    #![proptest_config(cfg(120))]

    #[test]
    fn matmul_random(
        seed in any::<u64>(),
        m_ in prop_oneof![Just(1usize), 1usize..40],
        k in prop_oneof![Just(0usize), 1usize..70],
        n in prop_oneof![Just(1usize), 1usize..70],
        flags in 0u32..8,
        b0 in 1u32..3,
        b1 in 1u32..3,
    ) {
        matmul_case(m_, k, n, seed, flags, [b0, b1], None, None);
    }
}

#[test]
fn matmul_shapes_of_interest() {
    for (i, &(m_, k, n)) in [
        (1, 512, 512),
        // B of 256 KiB or more: the row-streaming GEMV, with row and column tails.
        (1, 517, 263),
        (2, 301, 250),
        (1, 1030, 71),
        (1, 300, 77),
        (2, 70, 37),
        (4, 33, 100),
        (6, 40, 20),
        (4, 7, 71),
        (3, 129, 65),
        (64, 64, 64),
        (100, 27, 16),
        (1, 1, 1),
        (17, 1, 33),
    ]
    .iter()
    .enumerate()
    {
        for flags in 0..8 {
            for layouts in [false, true] {
                let seed = i as u64 * 31 + flags as u64;
                matmul_case(m_, k, n, seed, flags, [1, 1], Some(layouts), None);
            }
        }
    }
}

#[test]
fn matmul_half_weights_bf16_and_f16() {
    // B stored [N, K] (TRANSPOSE_B, K contiguous: the vectorized paths, AVX-512 or AVX2)
    // and [K, N] or random layouts (the widening fallback), with K tails of every length mod
    // 32, row/column blocks of 1–4 (AVX2: up to 8 columns), column panels, with and without
    // an epilogue. `NRT_SIM_ISA=avx2` runs the AVX2 path on an AVX-512 host.
    for bdt in [DType::Bf16, DType::F16] {
        for (i, &(m_, k, n)) in [
            (1, 512, 64),
            (1, 33, 7),
            (2, 31, 5),
            (3, 64, 9),
            (4, 17, 4),
            (5, 95, 6),
            (64, 70, 33),
            (9, 1, 3),
            // Column panels of B (`HALF_GEMM_PANEL_BYTES`): 32 columns of K = 2048 each.
            (2, 2048, 70),
            (1, 576, 300),
            (7, 1030, 130),
        ]
        .iter()
        .enumerate()
        {
            // bf16 also with `F32_A`: A's f32 values unrounded (the reference then does not
            // round them either, and the tolerance is far below bf16's rounding).
            let f32_a: &[u32] = if bdt == DType::Bf16 {
                &[0, matmul_flags::F32_A]
            } else {
                &[0]
            };
            for flags in 0..8 {
                for &x in f32_a {
                    let seed = i as u64 * 131 + flags as u64;
                    let layouts = Some(seed.is_multiple_of(3));
                    matmul_case_b(m_, k, n, seed, flags | x, [1, 1], layouts, None, bdt);
                }
            }
        }
        for seed in 0..8 {
            let f = (seed % 8) as u32 | matmul_flags::TRANSPOSE_B;
            matmul_case_b(5, 40, 7, seed, f, [2, 3], None, Some(true), bdt);
        }
    }
}

proptest! {
    #![proptest_config(cfg(60))]

    #[test]
    fn matmul_half_random(
        seed in any::<u64>(),
        m_ in 1usize..12,
        k in 1usize..100,
        n in 1usize..12,
        flags in 0u32..8,
        bf16 in any::<bool>(),
    ) {
        let bdt = if bf16 { DType::Bf16 } else { DType::F16 };
        matmul_case_b(m_, k, n, seed, flags, [1, 1], None, None, bdt);
    }
}

#[test]
fn matmul_epilogues_on_gemv_gemm_and_row_blocks() {
    // M ≤ 4 (GEMV), the GEMM crate, and N wide enough that the epilogue runs on several row
    // blocks with a short last one (`epilogue_block_rows(2048)` = 64 rows: 64 + 64 + 22).
    assert_eq!(nrt_kernels::matmul::epilogue_block_rows(2048), 64);
    for (i, &(m_, k, n)) in [
        (1, 40, 33),
        (3, 17, 70),
        (4, 64, 8),
        (9, 33, 47),
        (64, 64, 64),
        (150, 9, 2048),
        (65, 5, 4096),
    ]
    .iter()
    .enumerate()
    {
        for flags in 0..8 {
            for seed in 0..3u64 {
                let seed = i as u64 * 97 + flags as u64 * 7 + seed;
                let layouts = seed.is_multiple_of(2);
                matmul_case(m_, k, n, seed, flags, [1, 1], Some(layouts), Some(true));
            }
        }
    }
    // Batched, with the epilogue's operands following C's batches.
    for seed in 0..12 {
        matmul_case(5, 11, 13, seed, (seed % 8) as u32, [2, 3], None, Some(true));
    }
}

#[test]
fn matmul_batches_sharing_b_fold_into_m() {
    // [2, 3, M, K] · [K, N] broadcast over both batch dims, M = 1 and M = 5, and with A
    // transposed (batch folding must keep A's row stride).
    for (mm, flags) in [
        (1u32, 0u32),
        (5, 0),
        (5, matmul_flags::TRANSPOSE_A),
        (1, matmul_flags::ACCUMULATE),
    ] {
        let mut rng = Rng::new(mm as u64 + flags as u64);
        let mut m = Arena::new(ARENA);
        let (k, n) = (37u32, 29u32);
        let ta = flags & matmul_flags::TRANSPOSE_A != 0;
        let a = m.dense(DType::F32, if ta { [2, 3, k, mm] } else { [2, 3, mm, k] });
        let b = AccessPattern {
            shape: [2, 3, k, n],
            stride: [0, 0, n as i32, 1],
            ..m.dense(DType::F32, [1, 1, k, n])
        };
        let c = m.dense(DType::F32, [2, 3, mm, n]);
        m.fill_f32(&a, &mut rng, -1.0, 1.0);
        m.fill_f32(&b, &mut rng, -1.0, 1.0);
        m.fill_f32(&c, &mut rng, -1.0, 1.0);
        let c0 = m.read_f32(&c);
        m.run(
            &Op::MatMul(op::MatMul {
                a,
                b,
                c,
                alpha: 0.5,
                flags,
                epilogue: nrt_isa::Epilogue::NONE,
            }),
            &mut Workspace::new(),
        )
        .unwrap();
        let got = m.read_f32(&c);
        let mut want = Vec::new();
        for [b0, b1, i, j] in indices(c.shape) {
            let mut s = 0.0f64;
            for p in 0..k as usize {
                let av = m.get_f32(&a, if ta { [b0, b1, p, i] } else { [b0, b1, i, p] }) as f64;
                s += av * m.get_f32(&b, [b0, b1, p, j]) as f64;
            }
            let prev = if flags & matmul_flags::ACCUMULATE != 0 {
                c0[want.len()] as f64
            } else {
                0.0
            };
            want.push(0.5 * s + prev);
        }
        assert_close(&got, &want, 1e-5, 1e-5, "batched");
    }
}

proptest! {
    #![proptest_config(cfg(200))]

    /// MatMulInteger against the definition, every signedness pair, with and without zero
    /// points (runs the VNNI path where the CPU has it, the portable one elsewhere); with B
    /// unpacked or in the compiler's packed layout (`qmatmul_layout`, shared by the
    /// batches), with i32 results or scaled f32 ones (per column or per tensor). K and N
    /// cover the tails: K not a multiple of 4, N not a multiple of the 32-column tile.
    #[test]
    fn matmul_integer_random(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let mut m = Arena::new(ARENA);
        let at = if rng.chance(0.5) { DType::I8 } else { DType::U8 };
        let bt = if rng.chance(0.5) { DType::I8 } else { DType::U8 };
        // Sometimes past 32 rows and 64 k-quadruples (the AMX path's row blocks, its 16-row
        // last block and whole K chunks beside a partial one).
        let big = rng.chance(0.3);
        let (b2, mm, k, n) = (1 + rng.below(2) as u32, 1 + rng.below(if big { 40 } else { 9 }) as u32, rng.below(if big { 300 } else { 70 }) as u32, 1 + rng.below(70) as u32);
        let (packed, scaled, per_column) = (rng.chance(0.5), rng.chance(0.5), rng.chance(0.5));
        let a = m.random(&mut rng, at, [1, b2, mm, k], true);
        // A packed B is one matrix for every batch.
        let b = m.random(&mut rng, bt, [1, if packed { 1 } else { b2 }, k, n], true);
        let ct = if scaled { DType::F32 } else { DType::I32 };
        let c = m.random(&mut rng, ct, [1, b2, mm, n], false);
        let za = m.random(&mut rng, at, [1, b2, mm, 1], true);
        let zb = m.random(&mut rng, bt, [1, b2, 1, n], true);
        for ap in [&a, &b, &za, &zb] {
            m.fill_with(ap, || rng.below(256));
        }
        let scale = {
            // Per column, sometimes in a random layout (a reversed one too: a negative last
            // stride is not the unit-stride run the vector stores read).
            let mut sc = if rng.chance(0.5) { m.random(&mut rng, DType::F32, [1, b2, 1, n], false) } else { m.dense(DType::F32, [1, b2, 1, n]) };
            m.fill_f32(&sc, &mut rng, -2.0, 2.0);
            if !per_column {
                sc.stride = [0, 0, 0, 0];
                sc.shape = [1, b2, 1, n];
            }
            sc
        };
        let bq = if packed {
            let (ku, nu) = (k as usize, n as usize);
            let vals: Vec<u8> = (0..ku * nu).map(|x| m.get_raw(&b, [0, 0, x / nu, x % nu]) as u8).collect();
            let bytes = nrt_isa::qmatmul_layout::pack(ku, nu, bt == DType::I8, |p, j| vals[p * nu + j]).unwrap();
            let np4 = 4 * nrt_isa::qmatmul_layout::padded_columns(nu).unwrap() as u32;
            let ap = m.dense(bt, [1, 1, k.div_ceil(4) + 1, np4]);
            prop_assert_eq!(bytes.len(), ap.elements() as usize);
            for (x, &v) in bytes.iter().enumerate() {
                m.set_raw(&ap, [0, 0, x / np4 as usize, x % np4 as usize], v as u64);
            }
            ap
        } else {
            b
        };
        let (use_za, use_zb) = (rng.chance(0.6), rng.chance(0.6));
        let op = Op::MatMulInteger(op::MatMulInteger {
            a,
            b: bq,
            c,
            a_zero: use_za.then_some(za),
            b_zero: use_zb.then_some(zb),
            packed_b: packed,
            scale: scaled.then_some(scale),
        });
        // Through the encoding: the decoder accepts what the test built.
        let mut enc = Vec::new();
        nrt_isa::Instruction::new(op).encode(&mut enc);
        prop_assert_eq!(nrt_isa::Instruction::decode(&enc).map(|(i, _)| i.op), Ok(op));
        // On stale scratch: the packing must write every word it reads (tail padding too).
        m.run(&op, &mut Workspace::scribbled(1 << 20)).unwrap();
        let val = |bits: u64, t: DType| if t == DType::I8 { bits as u8 as i8 as i64 } else { bits as u8 as i64 };
        for q in 0..b2 as usize {
            let qb = if packed { 0 } else { q };
            for i in 0..mm as usize {
                for j in 0..n as usize {
                    let zav = if use_za { val(m.get_raw(&za, [0, q, i, 0]), at) } else { 0 };
                    let zbv = if use_zb { val(m.get_raw(&zb, [0, q, 0, j]), bt) } else { 0 };
                    let mut want = 0i64;
                    for kk in 0..k as usize {
                        want += (val(m.get_raw(&a, [0, q, i, kk]), at) - zav) * (val(m.get_raw(&b, [0, qb, kk, j]), bt) - zbv);
                    }
                    if scaled {
                        let want = want as i32 as f32 * m.get_f32(&scale, [0, q, 0, j]);
                        let got = m.get_f32(&c, [0, q, i, j]);
                        prop_assert_eq!(got.to_bits(), want.to_bits(), "at {:?} ({:?} x {:?}, k {}, packed {})", [q, i, j], at, bt, k, packed);
                    } else {
                        let got = m.get_raw(&c, [0, q, i, j]) as u32 as i32;
                        prop_assert_eq!(got, want as i32, "at {:?} ({:?} x {:?}, k {}, packed {})", [q, i, j], at, bt, k, packed);
                    }
                }
            }
        }
    }
}

/// Throughput of the int8 GEMM's paths — dispatched, AVX2, portable (`cargo test --release
/// -p nrt-kernels --test reference_matmul -- --ignored int8_gemm_throughput --nocapture`); prints
/// GOPS, checks the paths agree. Timings on a shared machine are indicative only.
#[test]
#[ignore]
fn int8_gemm_throughput() {
    use nrt_kernels::qmatmul::{
        Args, matmul_integer, matmul_integer_avx2, matmul_integer_portable,
    };
    let mut rng = Rng::new(3);
    let mut m = Arena::new(64 << 20);
    for (mm, k, n) in [(1u32, 512u32, 512u32), (64, 512, 512), (128, 768, 768)] {
        let a = m.dense(DType::U8, [1, 1, mm, k]);
        let b = m.dense(DType::I8, [1, 1, k, n]);
        let cs: Vec<_> = (0..3).map(|_| m.dense(DType::I32, [1, 1, mm, n])).collect();
        m.fill_with(&a, || rng.below(256));
        m.fill_with(&b, || rng.below(256));
        let mut ws = Workspace::new();
        let ops = 2.0 * mm as f64 * k as f64 * n as f64;
        let mut best = [f64::MAX; 3];
        for _ in 0..20 {
            for (p, c) in cs.iter().enumerate() {
                let args = Args {
                    a: &a,
                    b: &b,
                    c,
                    a_zero: None,
                    b_zero: None,
                    packed_b: false,
                    scale: None,
                };
                let mem = m.mem();
                let t = std::time::Instant::now();
                // SAFETY: operands inside the arena, aligned, shapes as the decoder checks.
                unsafe {
                    match p {
                        0 => matmul_integer(&args, mem, &mut ws),
                        1 => matmul_integer_avx2(&args, mem, &mut ws),
                        _ => matmul_integer_portable(&args, mem, &mut ws),
                    }
                }
                .unwrap();
                best[p] = best[p].min(t.elapsed().as_secs_f64());
            }
        }
        let r: Vec<_> = cs.iter().map(|c| m.read_raw(c)).collect();
        assert_eq!(r[0], r[2]);
        assert_eq!(r[1], r[2]);
        println!(
            "int8 GEMM {mm}x{k}x{n}: dispatched {:.1} GOPS, AVX2 {:.1} GOPS, portable {:.1} GOPS",
            ops / best[0] / 1e9,
            ops / best[1] / 1e9,
            ops / best[2] / 1e9
        );
    }
}

/// The int8 GEMM's paths — dispatched (AMX tiles where the process has them), VNNI alone,
/// AVX2, portable — agree exactly on shapes with row blocks, K chunks and tails, zero points and
/// packed B.
#[test]
fn matmul_integer_paths_agree() {
    use nrt_kernels::qmatmul::{
        Args, matmul_integer, matmul_integer_avx2, matmul_integer_portable, matmul_integer_vnni,
    };
    let mut rng = Rng::new(5);
    // Row counts that end on every tile height the paths pick (1, 2, 3 → 4, 4, 5..7 → 8).
    for (mm, k, n) in [
        (1u32, 5u32, 3u32),
        (33, 64, 40),
        (50, 257, 97),
        (64, 512, 64),
        (11, 40, 70),
        (4, 33, 33),
        (7, 129, 65),
    ] {
        let mut m = Arena::new(32 << 20);
        let a = m.dense(DType::U8, [1, 1, mm, k]);
        let b = m.dense(DType::I8, [1, 1, k, n]);
        let za = m.dense(DType::U8, [1, 1, mm, 1]);
        let zb = m.dense(DType::I8, [1, 1, 1, n]);
        for x in [&a, &b, &za, &zb] {
            m.fill_with(x, || rng.below(256));
        }
        let cs: Vec<_> = (0..4).map(|_| m.dense(DType::I32, [1, 1, mm, n])).collect();
        let mut ws = Workspace::new();
        for (path, c) in cs.iter().enumerate() {
            let args = Args {
                a: &a,
                b: &b,
                c,
                a_zero: Some(&za),
                b_zero: Some(&zb),
                packed_b: false,
                scale: None,
            };
            let mem = m.mem();
            // SAFETY: operands inside the arena, aligned, shapes as the decoder checks.
            unsafe {
                match path {
                    0 => matmul_integer(&args, mem, &mut ws),
                    1 => matmul_integer_vnni(&args, mem, &mut ws),
                    2 => matmul_integer_avx2(&args, mem, &mut ws),
                    _ => matmul_integer_portable(&args, mem, &mut ws),
                }
            }
            .unwrap();
        }
        let r: Vec<_> = cs.iter().map(|c| m.read_raw(c)).collect();
        assert_eq!(r[0], r[3], "dispatched vs portable, {mm}x{k}x{n}");
        assert_eq!(r[1], r[3], "VNNI vs portable, {mm}x{k}x{n}");
        assert_eq!(r[2], r[3], "AVX2 vs portable, {mm}x{k}x{n}");
    }
}

#[test]
fn an_epilogue_operand_overlapping_c_is_staged_not_undefined() {
    // Never compiled, possible in a hostile model: the residual is C itself. The product is
    // stored first, so each element becomes relu(2·(A·B)[i, j]) — defined, and the same on
    // every path (GEMV and GEMM).
    for (mm, k, n) in [(2usize, 9usize, 20usize), (70, 9, 20)] {
        let mut rng = Rng::new(mm as u64);
        let mut m = Arena::new(ARENA);
        let a = m.dense(DType::F32, [1, 1, mm as u32, k as u32]);
        let b = m.dense(DType::F32, [1, 1, k as u32, n as u32]);
        let c = m.dense(DType::F32, [1, 1, mm as u32, n as u32]);
        m.fill_f32(&a, &mut rng, -1.0, 1.0);
        m.fill_f32(&b, &mut rng, -1.0, 1.0);
        let epilogue = Epilogue {
            residual: Some(c),
            func: ActFunc::Relu,
            ..Epilogue::NONE
        };
        m.run(
            &Op::MatMul(op::MatMul {
                a,
                b,
                c,
                alpha: 1.0,
                flags: 0,
                epilogue,
            }),
            &mut Workspace::new(),
        )
        .unwrap();
        let got = m.read_f32(&c);
        let mut want = Vec::new();
        for [_, _, i, j] in indices(c.shape) {
            let mut s = 0.0f64;
            for p in 0..k {
                s += m.get_f32(&a, [0, 0, i, p]) as f64 * m.get_f32(&b, [0, 0, p, j]) as f64;
            }
            want.push((2.0 * s).max(0.0));
        }
        assert_close(&got, &want, 1e-5, 1e-5, "residual = C");
    }
}
