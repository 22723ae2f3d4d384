//! Every op against a straightforward scalar reference (f64 where it matters), over random
//! shapes and layouts: permuted, padded and reversed strides, stride-0 broadcasts, empty
//! shapes, and in-place aliasing.

// Reference code indexes dimensions explicitly: clearer than iterator chains here.
#![allow(clippy::needless_range_loop)]

mod common;

use common::{Arena, Rng, assert_close, close, erf64, indices, random_shape};
use nrt_hal::DType;
use nrt_isa::op;
use nrt_isa::{
    AccessPattern, ActFunc, BinaryOp, CoordMode, Epilogue, NearestMode, Op, PoolOp, ReduceOp,
    ResizeMode, ScatterReduce, Window, matmul_flags,
};
use nrt_kernels::elem::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use nrt_kernels::{KernelError, Workspace};
use proptest::prelude::*;

const ARENA: usize = 4 << 20;

fn cfg(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

//===--- copies and conversions ------------------------------------------------------===//

/// A value as the reference sees it.
#[derive(Clone, Copy, Debug)]
enum Val {
    F(f64),
    I(i128),
    B(bool),
}

fn decode(d: DType, bits: u64) -> Val {
    match d {
        DType::F32 => Val::F(f32::from_bits(bits as u32) as f64),
        DType::F16 => Val::F(f16_to_f32(bits as u16) as f64),
        DType::Bf16 => Val::F(bf16_to_f32(bits as u16) as f64),
        DType::I8 => Val::I(bits as u8 as i8 as i128),
        DType::U8 => Val::I(bits as u8 as i128),
        DType::I16 => Val::I(bits as u16 as i16 as i128),
        DType::U16 => Val::I(bits as u16 as i128),
        DType::I32 => Val::I(bits as u32 as i32 as i128),
        DType::U32 => Val::I(bits as u32 as i128),
        DType::I64 => Val::I(bits as i64 as i128),
        DType::U64 => Val::I(bits as i128),
        DType::Bool => Val::B(bits as u8 != 0),
        DType::F64 => Val::F(f64::from_bits(bits)),
    }
}

fn encode(d: DType, v: Val) -> u64 {
    let f = |v: Val| -> f32 {
        match v {
            Val::F(x) => x as f32,
            Val::I(i) => i as f32,
            Val::B(b) => b as u8 as f32,
        }
    };
    let int = |v: Val| -> Option<i128> {
        match v {
            Val::I(i) => Some(i),
            Val::B(b) => Some(b as i128),
            Val::F(_) => None,
        }
    };
    macro_rules! to_int {
        ($t:ty) => {
            match int(v) {
                Some(i) => i as $t as u64,
                None => (f(v) as $t) as u64,
            }
        };
    }
    match d {
        DType::F32 => f(v).to_bits() as u64,
        // Storage only: the device converts through f32.
        DType::F64 => (f(v) as f64).to_bits(),
        DType::F16 => f32_to_f16(f(v)) as u64,
        DType::Bf16 => f32_to_bf16(f(v)) as u64,
        DType::I8 => to_int!(i8) & 0xff,
        DType::U8 => to_int!(u8),
        DType::I16 => to_int!(i16) & 0xffff,
        DType::U16 => to_int!(u16),
        DType::I32 => to_int!(i32) & 0xffff_ffff,
        DType::U32 => to_int!(u32),
        DType::I64 => to_int!(i64),
        DType::U64 => to_int!(u64),
        DType::Bool => match v {
            Val::F(x) => (x != 0.0) as u64,
            Val::I(i) => (i != 0) as u64,
            Val::B(b) => b as u64,
        },
    }
}

/// Random element bits for a type: small and edge values, NaN and infinities for floats.
fn random_bits(rng: &mut Rng, d: DType) -> u64 {
    match d {
        DType::F32 | DType::F16 | DType::Bf16 => {
            let x = match rng.below(10) {
                0 => f32::NAN,
                1 => [f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0][rng.below(4) as usize],
                2 => rng.f32(-1e6, 1e6),
                3 => rng.f32(-70000.0, 70000.0),
                _ => rng.f32(-300.0, 300.0),
            };
            match d {
                DType::F32 => x.to_bits() as u64,
                DType::F16 => f32_to_f16(x) as u64,
                _ => f32_to_bf16(x) as u64,
            }
        }
        DType::Bool => rng.below(3),
        DType::F64 => match rng.below(10) {
            0 => f64::NAN,
            1 => [f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0][rng.below(4) as usize],
            _ => rng.f32(-1e6, 1e6) as f64 * (1.0 + 1e-9),
        }
        .to_bits(),
        _ => {
            let bits = rng.next();
            let w = d.size() * 8;
            if w == 64 { bits } else { bits & ((1 << w) - 1) }
        }
    }
}

proptest! {
    #![proptest_config(cfg(400))]

    #[test]
    fn copy_converts_any_pair(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let mut m = Arena::new(ARENA);
        let sd = DType::ALL[rng.below(DType::ALL.len() as u64) as usize];
        let dd = DType::ALL[rng.below(DType::ALL.len() as u64) as usize];
        let shape = random_shape(&mut rng, [3, 4, 5, 9], true);
        let src = m.random(&mut rng, sd, shape, true);
        let dst = m.random(&mut rng, dd, shape, false);
        m.fill_with(&src, || random_bits(&mut rng, sd));
        let op = if sd == dd && rng.chance(0.5) {
            Op::DmaCopy(op::DmaCopy { src, dst })
        } else {
            Op::Copy(op::Copy { input: src, output: dst })
        };
        m.run(&op, &mut Workspace::new()).unwrap();
        for idx in indices(shape) {
            let raw = m.get_raw(&src, idx);
            let v = decode(sd, raw);
            // Same type: a bit copy. Otherwise the conversion.
            let want = if sd == dd { raw } else { encode(dd, v) };
            let got = m.get_raw(&dst, idx);
            let nan_ok = matches!(dd, DType::F32 | DType::F16 | DType::Bf16 | DType::F64)
                && matches!(v, Val::F(x) if x.is_nan())
                && decode(dd, got).is_nan_val();
            prop_assert!(got == want || nan_ok, "{sd}->{dd} at {idx:?}: {v:?} got {got:#x} want {want:#x}");
        }
    }

    #[test]
    fn fill_writes_every_element(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let mut m = Arena::new(ARENA);
        let d = DType::ALL[rng.below(DType::ALL.len() as u64) as usize];
        let shape = random_shape(&mut rng, [3, 3, 4, 7], true);
        let out = m.random(&mut rng, d, shape, false);
        let bits = random_bits(&mut rng, d);
        m.run(&Op::Fill(op::Fill { out, bits }), &mut Workspace::new()).unwrap();
        for v in m.read_raw(&out) {
            prop_assert_eq!(v, bits);
        }
    }
}

trait IsNan {
    fn is_nan_val(&self) -> bool;
}
impl IsNan for Val {
    fn is_nan_val(&self) -> bool {
        matches!(self, Val::F(x) if x.is_nan())
    }
}

#[test]
fn copy_transposes_pads_and_concats() {
    let mut m = Arena::new(ARENA);
    let mut ws = Workspace::new();
    // Transpose [2,3] → [3,2] through permuted strides.
    let src = m.dense(DType::F32, [1, 1, 2, 3]);
    let dst = m.dense(DType::F32, [1, 1, 3, 2]);
    for (i, idx) in indices(src.shape).enumerate() {
        m.set_f32(&src, idx, i as f32);
    }
    let src_t = AccessPattern {
        shape: [1, 1, 3, 2],
        stride: [6, 6, 1, 3],
        ..src
    };
    m.run(
        &Op::Copy(op::Copy {
            input: src_t,
            output: dst,
        }),
        &mut ws,
    )
    .unwrap();
    assert_eq!(m.read_f32(&dst), vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    // Concat two [2] into the halves of a [4], and a pad by writing into an offset window.
    let a = m.dense(DType::I32, [1, 1, 1, 2]);
    let out = m.dense(DType::I32, [1, 1, 1, 4]);
    m.set_raw(&a, [0, 0, 0, 0], 7);
    m.set_raw(&a, [0, 0, 0, 1], 8);
    m.run(&Op::Fill(op::Fill { out, bits: 0 }), &mut ws)
        .unwrap();
    let hi = AccessPattern {
        addr: out.addr + 8,
        shape: [1, 1, 1, 2],
        ..out
    };
    m.run(
        &Op::Copy(op::Copy {
            input: a,
            output: hi,
        }),
        &mut ws,
    )
    .unwrap();
    assert_eq!(m.read_raw(&out), vec![0, 0, 7, 8]);
}

#[test]
fn copy_transposes_large_tiles() {
    // Sizes straddling the transpose tile, every element width, batch dims around.
    for (i, d) in [DType::U8, DType::Bf16, DType::F32, DType::I64]
        .into_iter()
        .enumerate()
    {
        let mut rng = Rng::new(i as u64);
        let mut m = Arena::new(ARENA);
        let (b, r, c) = (3u32, 70u32, 45u32);
        let src = m.dense(d, [1, b, r, c]);
        m.fill_with(&src, || {
            rng.next() & ((1u64 << (8 * d.size() as u32 - 1)) - 1)
        });
        // View the source as [1, b, c, r] (permuted strides); the destination is dense.
        let src_t = AccessPattern {
            shape: [1, b, c, r],
            stride: [0, (r * c) as i32, 1, c as i32],
            ..src
        };
        let dst = m.dense(d, [1, b, c, r]);
        m.run(
            &Op::Copy(op::Copy {
                input: src_t,
                output: dst,
            }),
            &mut Workspace::new(),
        )
        .unwrap();
        for idx in indices(dst.shape) {
            assert_eq!(m.get_raw(&dst, idx), m.get_raw(&src_t, idx), "{d} {idx:?}");
        }
    }
}

//===--- matmul ----------------------------------------------------------------------===//

/// A random epilogue for a `csh` output: a bias broadcast per column, per row, as a scalar
/// or full, a residual in a random layout, and an activation, each maybe absent.
fn random_epilogue(rng: &mut Rng, m: &mut Arena, csh: [u32; 4]) -> Epilogue {
    let n = csh[3];
    let mut e = Epilogue::NONE;
    e.bias = match rng.below(5) {
        0 => None,
        1 => Some(m.random(rng, DType::F32, csh, true)),
        2 => Some(AccessPattern {
            shape: csh,
            stride: [0, 0, 1, 0],
            ..m.dense(DType::F32, [1, 1, 1, csh[2]])
        }),
        3 => Some(AccessPattern {
            shape: csh,
            stride: [0; 4],
            ..m.dense(DType::F32, [1, 1, 1, 1])
        }),
        _ => Some(AccessPattern {
            shape: csh,
            stride: [0, 0, 0, 1],
            ..m.dense(DType::F32, [1, 1, 1, n])
        }),
    };
    if rng.chance(0.5) {
        e.residual = Some(m.random(rng, DType::F32, csh, true));
    }
    const FUNCS: [ActFunc; 8] = [
        ActFunc::Identity,
        ActFunc::Relu,
        ActFunc::LeakyRelu,
        ActFunc::Sigmoid,
        ActFunc::Tanh,
        ActFunc::GeluErf,
        ActFunc::GeluTanh,
        ActFunc::Clip,
    ];
    e.func = FUNCS[rng.below(FUNCS.len() as u64) as usize];
    (e.act_alpha, e.act_beta) = match e.func {
        ActFunc::LeakyRelu => (0.1, 0.0),
        ActFunc::Clip => (-0.5, 0.75),
        _ => (0.0, 0.0),
    };
    for x in [&e.bias, &e.residual].into_iter().flatten() {
        m.fill_f32(x, rng, -1.0, 1.0);
    }
    e
}

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
                    av = bf16_to_f32(f32_to_bf16(av));
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
    // B stored [N, K] (TRANSPOSE_B, K contiguous: the vectorized path when the CPU has it)
    // and [K, N] or random layouts (the widening fallback), with K tails of every length mod
    // 32 and row/column blocks of 1–4, with and without an epilogue.
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
        ]
        .iter()
        .enumerate()
        {
            for flags in 0..8 {
                let seed = i as u64 * 131 + flags as u64;
                let layouts = Some(seed.is_multiple_of(3));
                matmul_case_b(m_, k, n, seed, flags, [1, 1], layouts, None, bdt);
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

//===--- conv ------------------------------------------------------------------------===//

#[allow(clippy::too_many_arguments)]
fn conv_case(seed: u64) {
    let mut rng = Rng::new(seed);
    let mut m = Arena::new(16 << 20);
    let groups = [1u32, 1, 2, 3][rng.below(4) as usize];
    let depthwise = rng.chance(0.2);
    let cg = 1 + rng.below(4) as u32;
    let c = if depthwise { groups } else { groups * cg };
    let og = if depthwise {
        1
    } else {
        1 + rng.below(4) as u32
    };
    let o = groups * og;
    let n = 1 + rng.below(2) as u32;
    let one_d = rng.chance(0.2);
    let h = if one_d { 1 } else { 1 + rng.below(9) as u32 };
    // Up to 40 wide sometimes: the direct kernel's 16-column strips need room.
    let wmax = if rng.chance(0.3) { 40 } else { 11 };
    let w = 1 + rng.below(wmax) as u32;
    let kh = if one_d { 1 } else { 1 + rng.below(3) as u32 };
    // Sometimes 5 or 7 wide: the depthwise kernel's unrolled widths.
    let kw = if rng.chance(0.15) {
        [5, 7][rng.below(2) as usize]
    } else {
        1 + rng.below(4) as u32
    };
    let mut win = Window {
        kernel: [0, 0],
        stride: [1 + rng.below(2) as u32, 1 + rng.below(3) as u32],
        pad: [0; 4],
        dilation: [1 + rng.below(2) as u32, 1 + rng.below(2) as u32],
    };
    if rng.chance(0.6) {
        for p in &mut win.pad {
            *p = rng.below(3) as u32;
        }
    }
    if one_d {
        win.pad[0] = 0;
        win.pad[2] = 0;
    }
    let (Some(oh), Some(ow)) = (win.out_dim(0, h, kh), win.out_dim(1, w, kw)) else {
        return;
    };
    let input = m.random(&mut rng, DType::F32, [n, c, h, w], false);
    let weight = if rng.chance(0.7) {
        m.dense(DType::F32, [o, c / groups, kh, kw])
    } else {
        m.random(&mut rng, DType::F32, [o, c / groups, kh, kw], false)
    };
    let output = if rng.chance(0.7) {
        m.dense(DType::F32, [n, o, oh, ow])
    } else {
        m.random(&mut rng, DType::F32, [n, o, oh, ow], false)
    };
    let bias = rng.chance(0.5).then(|| m.dense(DType::F32, [1, 1, 1, o]));
    let workspace = rng.chance(0.6).then(|| {
        let need = (c / groups) * kh * kw * oh * ow;
        m.dense(DType::F32, [1, 1, 1, need])
    });
    m.fill_f32(&input, &mut rng, -1.0, 1.0);
    m.fill_f32(&weight, &mut rng, -1.0, 1.0);
    if let Some(b) = &bias {
        m.fill_f32(b, &mut rng, -1.0, 1.0);
    }
    m.fill_f32(&output, &mut rng, 100.0, 200.0);
    // The fused activation: on every path (direct, pointwise, im2col by bands).
    let act = match rng.below(4) {
        0 => (ActFunc::Relu, 0.0, 0.0),
        1 => (ActFunc::LeakyRelu, 0.1, 0.0),
        2 => (ActFunc::Sigmoid, 0.0, 0.0),
        _ => (ActFunc::Identity, 0.0, 0.0),
    };
    let op = Op::Conv(op::Conv {
        input,
        weight,
        output,
        bias,
        workspace,
        window: win,
        groups,
        act,
    });
    conv_check(&mut m, &op, &format!("conv seed {seed}"));
}

/// Runs a convolution and compares it with the 7-loop reference in f64.
fn conv_check(m: &mut Arena, op: &Op, what: &str) {
    let Op::Conv(op::Conv {
        input,
        weight,
        output,
        bias,
        window: win,
        groups,
        act,
        ..
    }) = *op
    else {
        unreachable!()
    };
    let [n, c, h, w] = input.shape;
    let [o, _, kh, kw] = weight.shape;
    let [_, _, oh, ow] = output.shape;
    m.run(op, &mut Workspace::new()).unwrap();
    let got = m.read_f32(&output);
    let mut want = Vec::new();
    let cgs = (c / groups) as usize;
    let ogs = (o / groups) as usize;
    for [nn, oo, y, x] in indices([n, o, oh, ow]) {
        let grp = oo / ogs;
        let mut s = bias.map_or(0.0, |b| m.get_f32(&b, [0, 0, 0, oo]) as f64);
        for ci in 0..cgs {
            for ky in 0..kh as usize {
                for kx in 0..kw as usize {
                    let iy = (y * win.stride[0] as usize + ky * win.dilation[0] as usize) as i64
                        - win.pad[0] as i64;
                    let ix = (x * win.stride[1] as usize + kx * win.dilation[1] as usize) as i64
                        - win.pad[1] as i64;
                    if iy < 0 || ix < 0 || iy >= h as i64 || ix >= w as i64 {
                        continue;
                    }
                    let iv = m.get_f32(&input, [nn, grp * cgs + ci, iy as usize, ix as usize]);
                    let wv = m.get_f32(&weight, [oo, ci, ky, kx]);
                    s += iv as f64 * wv as f64;
                }
            }
        }
        want.push(match act.0 {
            ActFunc::Relu => s.max(0.0),
            ActFunc::LeakyRelu if s < 0.0 => act.1 as f64 * s,
            ActFunc::Sigmoid => 1.0 / (1.0 + (-s).exp()),
            _ => s,
        });
    }
    assert_close(&got, &want, 1e-5, 1e-5, &format!("{what} {op:?}"));
}

#[test]
fn conv_im2col_in_several_bands() {
    // 64 channels × 3×3 × 56 columns: 129 KiB of patches per output row, so the 512 KiB band
    // holds 4 of the 10 output rows (bands 4, 4, 2); with and without bias, and 2 groups.
    for (groups, with_bias) in [(1u32, true), (2, false)] {
        let mut rng = Rng::new(groups as u64);
        let mut m = Arena::new(16 << 20);
        let (c, o, h, w) = (64 * groups, 8u32, 10u32, 56u32);
        let input = m.dense(DType::F32, [1, c, h, w]);
        let weight = m.dense(DType::F32, [o, c / groups, 3, 3]);
        let output = m.dense(DType::F32, [1, o, h, w]);
        let bias = with_bias.then(|| m.dense(DType::F32, [1, 1, 1, o]));
        let workspace = Some(m.dense(DType::F32, [1, 1, 1, (c / groups) * 9 * h * w]));
        m.fill_f32(&input, &mut rng, -1.0, 1.0);
        m.fill_f32(&weight, &mut rng, -1.0, 1.0);
        if let Some(b) = &bias {
            m.fill_f32(b, &mut rng, -1.0, 1.0);
        }
        let window = Window {
            kernel: [0, 0],
            stride: [1, 1],
            pad: [1; 4],
            dilation: [1, 1],
        };
        let op = Op::Conv(op::Conv {
            input,
            weight,
            output,
            bias,
            workspace,
            window,
            groups,
            act: (ActFunc::Identity, 0.0, 0.0),
        });
        conv_check(&mut m, &op, "banded im2col");
    }
}

/// The panel path's row blocks and K blocks (AVX-512: 14-row register tiles, K in blocks of
/// 512): 30 output channels (tiles of 14, 14, 2), K = 60·3·3 = 540, strides 1 and 2 with
/// odd sizes (panels of 32 pixels straddle output rows, the last one partial), bias and Relu
/// in the tile epilogue, and a Sigmoid applied after.
#[test]
fn conv_panels_many_channels_and_long_k() {
    for (case, (stride, act)) in [
        (1u32, ActFunc::Relu),
        (2, ActFunc::Identity),
        (2, ActFunc::Sigmoid),
    ]
    .into_iter()
    .enumerate()
    {
        let mut rng = Rng::new(40 + case as u64);
        let mut m = Arena::new(16 << 20);
        let (c, o, h, w) = (60u32, 30u32, 9u32, 13u32);
        let window = Window {
            kernel: [0, 0],
            stride: [stride, stride],
            pad: [1, 0, 1, 2],
            dilation: [1, 1],
        };
        let (oh, ow) = (
            window.out_dim(0, h, 3).unwrap(),
            window.out_dim(1, w, 3).unwrap(),
        );
        let input = m.dense(DType::F32, [1, c, h, w]);
        let weight = m.dense(DType::F32, [o, c, 3, 3]);
        let output = m.dense(DType::F32, [1, o, oh, ow]);
        let bias = (case != 1).then(|| m.dense(DType::F32, [1, 1, 1, o]));
        let workspace = Some(m.dense(DType::F32, [1, 1, 1, c * 9 * oh * ow]));
        m.fill_f32(&input, &mut rng, -1.0, 1.0);
        m.fill_f32(&weight, &mut rng, -1.0, 1.0);
        if let Some(b) = &bias {
            m.fill_f32(b, &mut rng, -1.0, 1.0);
        }
        let op = Op::Conv(op::Conv {
            input,
            weight,
            output,
            bias,
            workspace,
            window,
            groups: 1,
            act: (act, 0.0, 0.0),
        });
        conv_check(&mut m, &op, "panels, many channels");
    }
}

/// The panel path with weight rows a multiple of 4 KiB apart (K = Cg·4·4 = 1024 and 2048: a
/// DCGAN discriminator's convolutions), which it multiplies from a padded copy: two groups
/// of 16 output channels (tiles of 14 and 2) and one group of 20, stride 2, bias and Relu.
#[test]
fn conv_panels_weight_rows_4k_apart() {
    for (case, (c, o, groups)) in [(128u32, 32u32, 2u32), (128, 20, 1)]
        .into_iter()
        .enumerate()
    {
        let mut rng = Rng::new(70 + case as u64);
        let mut m = Arena::new(16 << 20);
        let (h, w) = (9u32, 11u32);
        let window = Window {
            kernel: [0, 0],
            stride: [2, 2],
            pad: [1, 1, 1, 1],
            dilation: [1, 1],
        };
        let (oh, ow) = (
            window.out_dim(0, h, 4).unwrap(),
            window.out_dim(1, w, 4).unwrap(),
        );
        let cg = c / groups;
        let input = m.dense(DType::F32, [1, c, h, w]);
        let weight = m.dense(DType::F32, [o, cg, 4, 4]);
        let output = m.dense(DType::F32, [1, o, oh, ow]);
        let bias = Some(m.dense(DType::F32, [1, 1, 1, o]));
        let workspace = Some(m.dense(DType::F32, [1, 1, 1, cg * 16 * oh * ow]));
        m.fill_f32(&input, &mut rng, -1.0, 1.0);
        m.fill_f32(&weight, &mut rng, -1.0, 1.0);
        if let Some(b) = &bias {
            m.fill_f32(b, &mut rng, -1.0, 1.0);
        }
        let op = Op::Conv(op::Conv {
            input,
            weight,
            output,
            bias,
            workspace,
            window,
            groups,
            act: (ActFunc::Relu, 0.0, 0.0),
        });
        conv_check(&mut m, &op, "panels, weight rows 4 KiB apart");
    }
}

/// Square depthwise kernels (3×3, 5×5, 7×7: the unrolled depthwise path), strides 1 and 2,
/// dilations 1 and 2, padding on every side (rows above and below the image read a row of
/// zeros), output heights even and odd (rows go in pairs), widths that leave a
/// partial last strip of 16, two images, bias, and Relu or Sigmoid after.
#[test]
fn conv_depthwise_square_kernels() {
    let mut case = 0u64;
    for k in [3u32, 5, 7] {
        // Three input heights: output heights of both parities at each stride (the depthwise
        // kernel pairs output rows).
        for (stride, dil, h) in [(1u32, 1u32), (2, 1), (1, 2)]
            .into_iter()
            .flat_map(|(s, d)| [10u32, 11, 12].map(move |h| (s, d, h)))
        {
            case += 1;
            let mut rng = Rng::new(90 + case);
            let mut m = Arena::new(16 << 20);
            let (n, c, w) = (2u32, 3u32, 37u32);
            let window = Window {
                kernel: [0, 0],
                stride: [stride, stride],
                pad: [k / 2, k / 2 + 1, k / 2 + 1, k / 2],
                dilation: [dil, dil],
            };
            let (Some(oh), Some(ow)) = (window.out_dim(0, h, k), window.out_dim(1, w, k)) else {
                continue;
            };
            let input = m.dense(DType::F32, [n, c, h, w]);
            let weight = m.dense(DType::F32, [c, 1, k, k]);
            let output = m.dense(DType::F32, [n, c, oh, ow]);
            let bias = Some(m.dense(DType::F32, [1, 1, 1, c]));
            m.fill_f32(&input, &mut rng, -1.0, 1.0);
            m.fill_f32(&weight, &mut rng, -1.0, 1.0);
            if let Some(b) = &bias {
                m.fill_f32(b, &mut rng, -1.0, 1.0);
            }
            let act = if case.is_multiple_of(2) {
                ActFunc::Relu
            } else {
                ActFunc::Sigmoid
            };
            let op = Op::Conv(op::Conv {
                input,
                weight,
                output,
                bias,
                workspace: None,
                window,
                groups: c,
                act: (act, 0.0, 0.0),
            });
            conv_check(
                &mut m,
                &op,
                &format!("depthwise {k}x{k} stride {stride} dilation {dil}"),
            );
        }
    }
}

/// Short-patch convolutions (an RGB input layer: 3 channels, 3×3 or 5×5), the AVX-512 direct
/// kernel's shapes: a partial block of 8 output channels (20), rows of 16 or more outputs
/// with a partial last strip (and an odd number of strips), strides 1 and 2, asymmetric padding up to 2 on the right (the
/// last strip's taps past the row), bias, Relu or Sigmoid after.
#[test]
fn conv_short_patch_direct() {
    for (case, (o, k, stride, pads, act)) in [
        (16u32, 3u32, 1u32, [1u32, 1, 1, 1], ActFunc::Relu),
        (20, 3, 2, [0, 0, 2, 2], ActFunc::Identity),
        (20, 5, 1, [2, 1, 2, 2], ActFunc::Sigmoid),
        (16, 5, 2, [1, 2, 0, 2], ActFunc::Relu),
    ]
    .into_iter()
    .enumerate()
    {
        let mut rng = Rng::new(60 + case as u64);
        let mut m = Arena::new(16 << 20);
        let (c, h, w) = (3u32, 9u32, 37u32);
        let window = Window {
            kernel: [0, 0],
            stride: [stride, stride],
            pad: pads,
            dilation: [1, 1],
        };
        let (oh, ow) = (
            window.out_dim(0, h, k).unwrap(),
            window.out_dim(1, w, k).unwrap(),
        );
        assert!(ow >= 16, "case {case}: {ow} columns");
        let input = m.dense(DType::F32, [2, c, h, w]);
        let weight = m.dense(DType::F32, [o, c, k, k]);
        let output = m.dense(DType::F32, [2, o, oh, ow]);
        let bias = m.dense(DType::F32, [1, 1, 1, o]);
        let workspace = Some(m.dense(DType::F32, [1, 1, 1, c * k * k * oh * ow]));
        m.fill_f32(&input, &mut rng, -1.0, 1.0);
        m.fill_f32(&weight, &mut rng, -1.0, 1.0);
        m.fill_f32(&bias, &mut rng, -1.0, 1.0);
        // Whatever follows the input rows in memory: a read past a row must show.
        let after = m.dense(DType::F32, [1, 1, 1, 64]);
        m.fill_f32(&after, &mut rng, 50.0, 60.0);
        let op = Op::Conv(op::Conv {
            input,
            weight,
            output,
            bias: Some(bias),
            workspace,
            window,
            groups: 1,
            act: (act, 0.0, 0.0),
        });
        conv_check(&mut m, &op, &format!("short-patch conv case {case}"));
    }
}

/// Stride-1 convolutions whose rows are as wide as the input's ("same" padding, split any
/// way between left and right, with dilation): im2col's flat path, which copies a band's
/// rows as one run and then zeroes the pad columns.
fn conv_same_width_case(seed: u64) {
    let mut rng = Rng::new(seed);
    let mut m = Arena::new(16 << 20);
    let (c, o) = (1 + rng.below(4) as u32, 2 + rng.below(4) as u32);
    let (h, w) = (1 + rng.below(9) as u32, 1 + rng.below(20) as u32);
    let (kh, kw) = (1 + rng.below(3) as u32, 1 + rng.below(4) as u32);
    let (dh, dw) = (1 + rng.below(2) as u32, 1 + rng.below(2) as u32);
    let span = (kw - 1) * dw;
    let pl = rng.below(span as u64 + 1) as u32;
    let win = Window {
        kernel: [0, 0],
        stride: [1, 1],
        pad: [rng.below(3) as u32, pl, rng.below(3) as u32, span - pl],
        dilation: [dh, dw],
    };
    let (Some(oh), Some(ow)) = (win.out_dim(0, h, kh), win.out_dim(1, w, kw)) else {
        return;
    };
    assert_eq!(ow, w);
    let input = m.random(&mut rng, DType::F32, [1, c, h, w], false);
    let weight = m.dense(DType::F32, [o, c, kh, kw]);
    let output = m.dense(DType::F32, [1, o, oh, ow]);
    let workspace = Some(m.dense(DType::F32, [1, 1, 1, c * kh * kw * oh * ow]));
    m.fill_f32(&input, &mut rng, -1.0, 1.0);
    m.fill_f32(&weight, &mut rng, -1.0, 1.0);
    m.fill_f32(&output, &mut rng, 100.0, 200.0);
    let op = Op::Conv(op::Conv {
        input,
        weight,
        output,
        bias: None,
        workspace,
        window: win,
        groups: 1,
        act: (ActFunc::Identity, 0.0, 0.0),
    });
    conv_check(&mut m, &op, &format!("same-width conv seed {seed}"));
}

proptest! {
    #![proptest_config(cfg(300))]

    #[test]
    fn conv_random(seed in any::<u64>()) {
        conv_case(seed);
    }

    #[test]
    fn conv_same_width_random(seed in any::<u64>()) {
        conv_same_width_case(seed);
    }
}

//===--- activation ------------------------------------------------------------------===//

fn act_ref(f: ActFunc, x: f64, alpha: f64, beta: f64) -> f64 {
    use ActFunc::*;
    match f {
        Identity => x,
        Relu => {
            if x < 0.0 {
                0.0
            } else {
                x
            }
        }
        LeakyRelu => {
            if x < 0.0 {
                alpha * x
            } else {
                x
            }
        }
        Sigmoid => 1.0 / (1.0 + (-x).exp()),
        HardSigmoid => (alpha * x + beta).clamp(0.0, 1.0),
        Tanh => x.tanh(),
        GeluErf => 0.5 * x * (1.0 + erf64(x / 2f64.sqrt())),
        GeluTanh => {
            0.5 * x
                * (1.0 + ((2.0 / core::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
        }
        Erf => erf64(x),
        Exp => x.exp(),
        Log => x.ln(),
        Sqrt => x.sqrt(),
        Rsqrt => 1.0 / x.sqrt(),
        Reciprocal => 1.0 / x,
        Clip => {
            if x < alpha {
                alpha
            } else if x > beta {
                beta
            } else {
                x
            }
        }
        Abs => x.abs(),
        Neg => -x,
        Elu => {
            if x < 0.0 {
                alpha * x.exp_m1()
            } else {
                x
            }
        }
        Softplus => x.exp().ln_1p(),
        Floor => x.floor(),
        Ceil => x.ceil(),
        Square => x * x,
        Tan => x.tan(),
        Asin => x.asin(),
        Acos => x.acos(),
        Atan => x.atan(),
        Sinh => x.sinh(),
        Cosh => x.cosh(),
        Asinh => x.asinh(),
        Acosh => x.acosh(),
        Atanh => x.atanh(),
        Round => x.round_ties_even(),
    }
}

proptest! {
    #![proptest_config(cfg(500))]

    #[test]
    fn activation_random(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let mut m = Arena::new(ARENA);
        let func = ActFunc::ALL[rng.below(ActFunc::ALL.len() as u64) as usize];
        let shape = random_shape(&mut rng, [2, 3, 6, 40], true);
        let input = m.random(&mut rng, DType::F32, shape, true);
        let in_place = rng.chance(0.2) && (0..4).all(|d| input.stride[d] != 0 || shape[d] <= 1);
        let output = if in_place { input } else { m.random(&mut rng, DType::F32, shape, false) };
        let bias = rng.chance(0.4).then(|| m.random(&mut rng, DType::F32, shape, true));
        let range = match func {
            ActFunc::Exp | ActFunc::Sigmoid | ActFunc::Softplus | ActFunc::Elu => 90.0,
            ActFunc::Log | ActFunc::Sqrt | ActFunc::Rsqrt => 1e4,
            _ => 8.0,
        };
        m.fill_f32(&input, &mut rng, -range, range);
        if rng.chance(0.1) && input.elements() > 0 {
            m.set_f32(&input, [0, 0, 0, 0], f32::NAN);
        }
        if let Some(b) = &bias {
            m.fill_f32(b, &mut rng, -1.0, 1.0);
        }
        let scale = if rng.chance(0.5) { 1.0 } else { rng.f32(-2.0, 2.0) };
        let (alpha, beta) = if func == ActFunc::Clip { (-0.5, 0.7) } else { (rng.f32(0.0, 1.0), rng.f32(0.0, 1.0)) };
        let xs = m.read_f32(&input);
        let bs = bias.map(|b| m.read_f32(&b));
        m.run(&Op::Activation(op::Activation { input, output, bias, func, scale, alpha, beta }), &mut Workspace::new()).unwrap();
        let got = m.read_f32(&output);
        for (i, x) in xs.iter().enumerate() {
            // The reference applies f to the f32 pre-activation, as the engine does.
            let pre = match &bs { Some(b) => x.mul_add(scale, b[i]), None => x * scale };
            // Rounded to f32 (overflow to infinity included).
            let want = act_ref(func, pre as f64, alpha as f64, beta as f64) as f32 as f64;
            let (rtol, atol) = match func {
                ActFunc::GeluErf | ActFunc::GeluTanh | ActFunc::Elu | ActFunc::Softplus => (2e-6, 1e-6),
                _ => (2e-6, 1e-7),
            };
            prop_assert!(close(got[i], want, rtol, atol), "{func:?}({pre}) = {} want {want}", got[i]);
        }
    }
}

//===--- binary, tensor-scalar, select -------------------------------------------------===//

fn bin_ref_f(op: BinaryOp, a: f32, b: f32) -> f64 {
    use BinaryOp::*;
    let (x, y) = (a as f64, b as f64);
    match op {
        Add => (a + b) as f64,
        Sub => (a - b) as f64,
        Mul => (a * b) as f64,
        Div => (a / b) as f64,
        Max => {
            if x.is_nan() || y.is_nan() {
                f64::NAN
            } else {
                x.max(y)
            }
        }
        Min => {
            if x.is_nan() || y.is_nan() {
                f64::NAN
            } else {
                x.min(y)
            }
        }
        Pow => a.powf(b) as f64,
        Equal => (a == b) as u8 as f64,
        Less => (a < b) as u8 as f64,
        Greater => (a > b) as u8 as f64,
        And | Or | BitAnd | BitOr | BitXor | ShiftLeft | ShiftRight => unreachable!(),
    }
}

fn bin_ref_i(op: BinaryOp, a: i64, b: i64, bits: u32) -> i64 {
    use BinaryOp::*;
    let wrap = |v: i128| -> i64 {
        if bits == 32 {
            v as i32 as i64
        } else {
            v as i64
        }
    };
    let (x, y) = (a as i128, b as i128);
    match op {
        Add => wrap(x + y),
        Sub => wrap(x - y),
        Mul => wrap(x * y),
        Div => {
            if b == 0 {
                0
            } else {
                wrap(x / y)
            }
        }
        Max => a.max(b),
        Min => a.min(b),
        Pow => {
            if b < 0 {
                match a {
                    1 => 1,
                    -1 => {
                        if b % 2 == 0 {
                            1
                        } else {
                            -1
                        }
                    }
                    _ => 0,
                }
            } else {
                let mut r: i128 = 1;
                for _ in 0..b {
                    r = wrap(r * x) as i128;
                }
                r as i64
            }
        }
        Equal => (a == b) as i64,
        Less => (a < b) as i64,
        Greater => (a > b) as i64,
        BitAnd => a & b,
        BitOr => a | b,
        BitXor => a ^ b,
        ShiftLeft | ShiftRight => {
            let mask = if bits == 32 { 0xffff_ffffu64 } else { u64::MAX };
            let u = a as u64 & mask;
            if !(0..bits as i64).contains(&b) {
                0
            } else if op == ShiftLeft {
                wrap(((u << b) & mask) as i128)
            } else {
                wrap((u >> b) as i128)
            }
        }
        And | Or => unreachable!(),
    }
}

proptest! {
    #![proptest_config(cfg(600))]

    #[test]
    fn binary_random(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let mut m = Arena::new(ARENA);
        let op = BinaryOp::ALL[rng.below(BinaryOp::ALL.len() as u64) as usize];
        let dt = if op.is_logical() { DType::Bool } else if op.is_bitwise() { [DType::I32, DType::I64][rng.below(2) as usize] } else { [DType::F32, DType::I32, DType::I64][rng.below(3) as usize] };
        let odt = if op.is_comparison() { DType::Bool } else { dt };
        // Sometimes 16 rows or more: a transposed input goes tile by tile then.
        let rows = if rng.chance(0.3) { 40 } else { 5 };
        let shape = random_shape(&mut rng, [2, 3, rows, 37], true);
        let a = m.random(&mut rng, dt, shape, true);
        let b = m.random(&mut rng, dt, shape, true);
        let dense_a = (0..4).all(|d| a.stride[d] != 0 || shape[d] <= 1);
        let out = if odt == dt && dense_a && rng.chance(0.25) { a } else { m.random(&mut rng, odt, shape, false) };
        match dt {
            DType::F32 => {
                let small = op == BinaryOp::Pow;
                m.fill_with(&a, || {
                    let v = if small { rng.f32(-3.0, 3.0) } else if rng.chance(0.05) { f32::NAN } else { (rng.f32(-5.0, 5.0) * 4.0).round() / 4.0 };
                    v.to_bits() as u64
                });
                m.fill_with(&b, || {
                    let v = if small { [2.0, 0.5, -1.0, 3.0, rng.f32(-3.0, 3.0)][rng.below(5) as usize] } else { (rng.f32(-5.0, 5.0) * 4.0).round() / 4.0 };
                    v.to_bits() as u64
                });
            }
            DType::Bool => {
                m.fill_with(&a, || rng.below(3));
                m.fill_with(&b, || rng.below(3));
            }
            _ => {
                let pow = op == BinaryOp::Pow;
                let mask = if dt == DType::I32 { 0xffff_ffff } else { u64::MAX };
                m.fill_with(&a, || (if pow { rng.below(7) as i64 - 3 } else if rng.chance(0.5) { rng.next() as i64 } else { rng.below(21) as i64 - 10 }) as u64 & mask);
                m.fill_with(&b, || (if pow { rng.below(12) as i64 - 2 } else if rng.chance(0.5) { rng.next() as i64 } else { rng.below(21) as i64 - 10 }) as u64 & mask);
            }
        }
        let av = m.read_raw(&a);
        let bv = m.read_raw(&b);
        m.run(&Op::Binary(op::Binary { a, b, out, op }), &mut Workspace::new()).unwrap();
        let got = m.read_raw(&out);
        for i in 0..av.len() {
            match dt {
                DType::Bool => {
                    let (x, y) = (av[i] != 0, bv[i] != 0);
                    let want = if op == BinaryOp::And { x && y } else { x || y };
                    prop_assert_eq!(got[i], want as u64);
                }
                DType::F32 => {
                    let (x, y) = (f32::from_bits(av[i] as u32), f32::from_bits(bv[i] as u32));
                    let want = bin_ref_f(op, x, y);
                    let g = if op.is_comparison() { got[i] as f32 } else { f32::from_bits(got[i] as u32) };
                    prop_assert!(close(g, want, 1e-6, 0.0), "{op:?}({x}, {y}) = {g} want {want}");
                }
                _ => {
                    let bits = dt.size() as u32 * 8;
                    let sx = |v: u64| if bits == 32 { v as u32 as i32 as i64 } else { v as i64 };
                    let want = bin_ref_i(op, sx(av[i]), sx(bv[i]), bits);
                    let g = if op.is_comparison() { got[i] as i64 } else { sx(got[i]) };
                    prop_assert_eq!(g, want, "{:?}({}, {})", op, sx(av[i]), sx(bv[i]));
                }
            }
        }
    }

    #[test]
    fn tensor_scalar_random(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let mut m = Arena::new(ARENA);
        let ops = [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Max, BinaryOp::Min, BinaryOp::Pow];
        let op = ops[rng.below(ops.len() as u64) as usize];
        let shape = random_shape(&mut rng, [2, 3, 5, 37], true);
        let a = m.random(&mut rng, DType::F32, shape, true);
        let out = m.random(&mut rng, DType::F32, shape, false);
        m.fill_f32(&a, &mut rng, -4.0, 4.0);
        let scalar = [2.0, 0.5, -1.0, 1.0, rng.f32(-3.0, 3.0)][rng.below(5) as usize];
        let reverse = rng.chance(0.5);
        let av = m.read_f32(&a);
        m.run(&Op::TensorScalar(op::TensorScalar { a, out, op, scalar, reverse }), &mut Workspace::new()).unwrap();
        let got = m.read_f32(&out);
        for i in 0..av.len() {
            let want = if reverse { bin_ref_f(op, scalar, av[i]) } else { bin_ref_f(op, av[i], scalar) };
            prop_assert!(close(got[i], want, 1e-6, 0.0), "{op:?} rev={reverse} {} {scalar} = {} want {want}", av[i], got[i]);
        }
    }

    #[test]
    fn select_random(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let mut m = Arena::new(ARENA);
        let dt = DType::ALL[rng.below(DType::ALL.len() as u64) as usize];
        let shape = random_shape(&mut rng, [2, 3, 5, 37], true);
        let cond = m.random(&mut rng, DType::Bool, shape, true);
        let a = m.random(&mut rng, dt, shape, true);
        let b = m.random(&mut rng, dt, shape, true);
        let out = m.random(&mut rng, dt, shape, false);
        m.fill_with(&cond, || rng.below(3));
        m.fill_with(&a, || random_bits(&mut rng, dt));
        m.fill_with(&b, || random_bits(&mut rng, dt));
        let (cv, av, bv) = (m.read_raw(&cond), m.read_raw(&a), m.read_raw(&b));
        m.run(&Op::Select(op::Select { cond, a, b, out }), &mut Workspace::new()).unwrap();
        let got = m.read_raw(&out);
        for i in 0..got.len() {
            prop_assert_eq!(got[i], if cv[i] != 0 { av[i] } else { bv[i] });
        }
    }
}

//===--- reduce ----------------------------------------------------------------------===//

proptest! {
    #![proptest_config(cfg(400))]

    #[test]
    fn reduce_random(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let mut m = Arena::new(ARENA);
        let op = ReduceOp::ALL[rng.below(4) as usize];
        let dt = if op == ReduceOp::Mean { DType::F32 } else { [DType::F32, DType::I32, DType::I64][rng.below(3) as usize] };
        let shape = random_shape(&mut rng, [3, 4, 6, 50], true);
        let axes = rng.below(16) as u8;
        let mut oshape = shape;
        for d in 0..4 {
            if axes & (1 << d) != 0 { oshape[d] = 1; }
        }
        let input = m.random(&mut rng, dt, shape, true);
        let output = m.random(&mut rng, dt, oshape, false);
        match dt {
            DType::F32 => m.fill_f32(&input, &mut rng, -10.0, 10.0),
            DType::I32 => m.fill_with(&input, || (rng.next() as u32 >> rng.below(32)) as u64),
            _ => m.fill_with(&input, || rng.next() >> rng.below(64)),
        }
        // A few NaNs in some inputs: every reduction over one propagates it (the max and min
        // folds track them beside their 16 vector lanes).
        if dt == DType::F32 && !shape.contains(&0) && rng.chance(0.4) {
            for _ in 0..1 + rng.below(3) {
                let idx: [usize; 4] = core::array::from_fn(|d| rng.below(shape[d] as u64) as usize);
                m.set_f32(&input, idx, f32::NAN);
            }
        }
        m.run(&Op::Reduce(op::Reduce { input, output, op, axes }), &mut Workspace::new()).unwrap();
        if oshape.contains(&0) { return Ok(()); }
        for oidx in indices(oshape) {
            let mut sum_f = 0.0f64;
            let mut sum_abs = 0.0f64;
            let (mut mx, mut mn) = (f64::NEG_INFINITY, f64::INFINITY);
            let (mut si, mut mxi, mut mni) = (0i128, i128::MIN, i128::MAX);
            let mut count = 0u64;
            let mut nan = false;
            for idx in indices(shape) {
                if (0..4).any(|d| axes & (1 << d) == 0 && idx[d] != oidx[d]) { continue; }
                count += 1;
                let raw = m.get_raw(&input, idx);
                match dt {
                    DType::F32 => {
                        let v = f32::from_bits(raw as u32) as f64;
                        nan |= v.is_nan();
                        sum_f += v; sum_abs += v.abs(); mx = mx.max(v); mn = mn.min(v);
                    }
                    DType::I32 => { let v = raw as u32 as i32 as i128; si += v; mxi = mxi.max(v); mni = mni.min(v); }
                    _ => { let v = raw as i64 as i128; si += v; mxi = mxi.max(v); mni = mni.min(v); }
                }
            }
            let got = m.get_raw(&output, oidx);
            match dt {
                DType::F32 => {
                    let g = f32::from_bits(got as u32);
                    let (want, tol) = match op {
                        ReduceOp::Sum => (sum_f, 1e-6 * sum_abs + 1e-6),
                        ReduceOp::Mean => (sum_f / count as f64, (1e-6 * sum_abs + 1e-6) / count.max(1) as f64),
                        ReduceOp::Max => (mx, 0.0),
                        ReduceOp::Min => (mn, 0.0),
                    };
                    if (count == 0 && op == ReduceOp::Mean) || nan {
                        prop_assert!(g.is_nan(), "{op:?} axes {axes:#b} at {oidx:?}: {g}, want NaN");
                    } else {
                        prop_assert!(close(g, want, 0.0, tol), "{op:?} axes {axes:#b} at {oidx:?}: {g} vs {want}");
                    }
                }
                _ => {
                    let bits = dt.size() * 8;
                    let want = match op {
                        ReduceOp::Sum => if bits == 32 { si as i32 as i64 } else { si as i64 },
                        ReduceOp::Max => if count == 0 { if bits == 32 { i32::MIN as i64 } else { i64::MIN } } else { mxi as i64 },
                        _ => if count == 0 { if bits == 32 { i32::MAX as i64 } else { i64::MAX } } else { mni as i64 },
                    };
                    let g = if bits == 32 { got as u32 as i32 as i64 } else { got as i64 };
                    prop_assert_eq!(g, want, "{:?} axes {:#b}", op, axes);
                }
            }
        }
    }
}

//===--- pool ------------------------------------------------------------------------===//

proptest! {
    #![proptest_config(cfg(300))]

    #[test]
    fn pool_random(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let mut m = Arena::new(ARENA);
        let op = if rng.chance(0.5) { PoolOp::Max } else { PoolOp::Avg };
        // Sometimes wide rows: the AVX-512 strips take 16 outputs at a time (a tail after).
        let wide = rng.chance(0.3);
        let (n, c, h, w) = (1 + rng.below(2) as u32, 1 + rng.below(3) as u32, 1 + rng.below(9) as u32, 1 + rng.below(if wide { 75 } else { 12 }) as u32);
        let global = rng.chance(0.15);
        let kernel = if global { [h, w] } else { [1 + rng.below(3) as u32, 1 + rng.below(4) as u32] };
        let mut win = Window {
            kernel,
            stride: if global { [1, 1] } else { [1 + rng.below(3) as u32, 1 + rng.below(3) as u32] },
            pad: [0; 4],
            dilation: if global { [1, 1] } else { [1 + rng.below(2) as u32, 1 + rng.below(2) as u32] },
        };
        if !global && rng.chance(0.5) {
            // Pads smaller than the kernel so every window sees at least one cell.
            win.pad = [
                rng.below(kernel[0] as u64) as u32, rng.below(kernel[1] as u64) as u32,
                rng.below(kernel[0] as u64) as u32, rng.below(kernel[1] as u64) as u32,
            ];
        }
        let (Some(oh), Some(ow)) = (win.out_dim(0, h, kernel[0]), win.out_dim(1, w, kernel[1])) else { return Ok(()); };
        let cip = rng.chance(0.5);
        let input = m.random(&mut rng, DType::F32, [n, c, h, w], false);
        let output = m.random(&mut rng, DType::F32, [n, c, oh, ow], false);
        // Sometimes a few NaNs: a window holding one pools to NaN.
        let nan = rng.chance(0.2);
        m.fill_with(&input, || {
            let v = if nan && rng.chance(0.05) { f32::NAN } else { rng.f32(-5.0, 5.0) };
            v.to_bits() as u64
        });
        m.run(&Op::Pool(op::Pool { input, output, window: win, op, count_include_pad: cip }), &mut Workspace::new()).unwrap();
        for [a, b, y, x] in indices([n, c, oh, ow]) {
            let (mut s, mut mx, mut cnt, mut has_nan) = (0.0f64, f64::NEG_INFINITY, 0, false);
            for ky in 0..kernel[0] as usize {
                for kx in 0..kernel[1] as usize {
                    let iy = (y * win.stride[0] as usize + ky * win.dilation[0] as usize) as i64 - win.pad[0] as i64;
                    let ix = (x * win.stride[1] as usize + kx * win.dilation[1] as usize) as i64 - win.pad[1] as i64;
                    if iy < 0 || ix < 0 || iy >= h as i64 || ix >= w as i64 { continue; }
                    let v = m.get_f32(&input, [a, b, iy as usize, ix as usize]) as f64;
                    has_nan |= v.is_nan();
                    s += v; mx = mx.max(v); cnt += 1;
                }
            }
            if has_nan {
                let g = m.get_f32(&output, [a, b, y, x]);
                prop_assert!(g.is_nan(), "{op:?} {win:?} at {:?}: {g}, want NaN", [a, b, y, x]);
                continue;
            }
            let want = match op {
                PoolOp::Max => mx,
                PoolOp::Avg if cip => s / (kernel[0] * kernel[1]) as f64,
                PoolOp::Avg => s / cnt as f64,
            };
            let g = m.get_f32(&output, [a, b, y, x]);
            prop_assert!(close(g, want, 1e-5, 1e-5), "{op:?} {win:?} at {:?}: {g} vs {want}", [a, b, y, x]);
        }
    }
}

proptest! {
    #![proptest_config(cfg(200))]

    /// The 2×2 stride-2 fast path (and the global pool's lane sums): random odd and even
    /// sizes (up to 72 wide: the AVX-512 path takes 16 outputs a step), NaNs planted for max
    /// pooling (they must propagate).
    #[test]
    fn pool_2x2_stride2_and_global(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let mut m = Arena::new(ARENA);
        let op = if rng.chance(0.5) { PoolOp::Max } else { PoolOp::Avg };
        let (n, c, h, w) = (1 + rng.below(2) as u32, 1 + rng.below(3) as u32, 2 + rng.below(19) as u32, 2 + rng.below(72) as u32);
        let global = rng.chance(0.3);
        let win = Window {
            kernel: if global { [h, w] } else { [2, 2] },
            stride: if global { [1, 1] } else { [2, 2] },
            pad: [0; 4],
            dilation: [1, 1],
        };
        let (oh, ow) = if global { (1, 1) } else { (h / 2, w / 2) };
        let input = m.random(&mut rng, DType::F32, [n, c, h, w], false);
        let output = m.random(&mut rng, DType::F32, [n, c, oh, ow], false);
        m.fill_f32(&input, &mut rng, -5.0, 5.0);
        let nan_at = (op == PoolOp::Max && rng.chance(0.5)).then(|| {
            [rng.below(n as u64) as usize, rng.below(c as u64) as usize, rng.below(h as u64) as usize, rng.below(w as u64) as usize]
        });
        if let Some(at) = nan_at {
            m.set_f32(&input, at, f32::NAN);
        }
        m.run(&Op::Pool(op::Pool { input, output, window: win, op, count_include_pad: false }), &mut Workspace::new()).unwrap();
        for [a, b, y, x] in indices([n, c, oh, ow]) {
            let (mut s, mut mx, mut nan) = (0.0f64, f64::NEG_INFINITY, false);
            let (kh, kw) = (win.kernel[0] as usize, win.kernel[1] as usize);
            for ky in 0..kh {
                for kx in 0..kw {
                    let (iy, ix) = (y * win.stride[0] as usize + ky, x * win.stride[1] as usize + kx);
                    let v = m.get_f32(&input, [a, b, iy, ix]) as f64;
                    nan |= v.is_nan();
                    s += v; mx = mx.max(v);
                }
            }
            let g = m.get_f32(&output, [a, b, y, x]);
            match op {
                PoolOp::Max if nan => prop_assert!(g.is_nan(), "NaN lost at {:?}: {g}", [a, b, y, x]),
                PoolOp::Max => prop_assert!(close(g, mx, 1e-6, 1e-6), "max at {:?}: {g} vs {mx}", [a, b, y, x]),
                PoolOp::Avg => {
                    let want = s / (kh * kw) as f64;
                    prop_assert!(close(g, want, 1e-5, 1e-5), "avg at {:?}: {g} vs {want}", [a, b, y, x]);
                }
            }
        }
    }
}

//===--- softmax, layer norm -----------------------------------------------------------===//

proptest! {
    #![proptest_config(cfg(300))]

    #[test]
    fn softmax_random(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let mut m = Arena::new(ARENA);
        let shape = random_shape(&mut rng, [2, 3, 4, 70], true);
        let input = m.random(&mut rng, DType::F32, shape, false);
        let in_place = rng.chance(0.3);
        let output = if in_place { input } else { m.random(&mut rng, DType::F32, shape, false) };
        let log = rng.chance(0.5);
        let spread = [1.0, 10.0, 80.0][rng.below(3) as usize];
        m.fill_f32(&input, &mut rng, -spread, spread);
        let xs = m.read_f32(&input);
        m.run(&Op::Softmax(op::Softmax { input, output, log }), &mut Workspace::new()).unwrap();
        let got = m.read_f32(&output);
        let l = shape[3] as usize;
        for r in 0..xs.len() / l.max(1) {
            let row = &xs[r * l..(r + 1) * l];
            let mx = row.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
            let s: f64 = row.iter().map(|&x| (x as f64 - mx).exp()).sum();
            for j in 0..l {
                let want = if log { row[j] as f64 - mx - s.ln() } else { (row[j] as f64 - mx).exp() / s };
                prop_assert!(close(got[r * l + j], want, 1e-5, 1e-6), "log={log} {} vs {want}", got[r * l + j]);
            }
        }
    }

    #[test]
    fn layer_norm_random(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let mut m = Arena::new(ARENA);
        let shape = random_shape(&mut rng, [2, 3, 4, 70], true);
        let input = m.random(&mut rng, DType::F32, shape, false);
        let gamma = m.random(&mut rng, DType::F32, shape, true);
        let beta = rng.chance(0.6).then(|| m.random(&mut rng, DType::F32, shape, true));
        let output = if rng.chance(0.3) { input } else { m.random(&mut rng, DType::F32, shape, false) };
        let eps = [1e-5f32, 1e-3, 0.0][rng.below(3) as usize];
        let offset = rng.f32(-100.0, 100.0);
        m.fill_f32(&input, &mut rng, offset - 3.0, offset + 3.0);
        m.fill_f32(&gamma, &mut rng, -2.0, 2.0);
        if let Some(b) = &beta { m.fill_f32(b, &mut rng, -2.0, 2.0); }
        let xs = m.read_f32(&input);
        let gs = m.read_f32(&gamma);
        let bs = beta.map(|b| m.read_f32(&b));
        m.run(&Op::LayerNorm(op::LayerNorm { input, gamma, beta, output, eps }), &mut Workspace::new()).unwrap();
        let got = m.read_f32(&output);
        let l = shape[3] as usize;
        for r in 0..xs.len() / l.max(1) {
            let row = &xs[r * l..(r + 1) * l];
            let mean = row.iter().map(|&x| x as f64).sum::<f64>() / l as f64;
            let var = row.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / l as f64;
            if var + (eps as f64) < 1e-6 { continue; } // ill-conditioned: constant row, eps 0
            let rstd = 1.0 / (var + eps as f64).sqrt();
            for j in 0..l {
                let k = r * l + j;
                let want = (row[j] as f64 - mean) * rstd * gs[k] as f64 + bs.as_ref().map_or(0.0, |b| b[k] as f64);
                // f32 input quantization relative to the offset dominates the error.
                let tol = 2e-5 * (1.0 + offset.abs() as f64 * rstd) * (gs[k].abs() as f64 + 1.0);
                prop_assert!(close(got[k], want, 0.0, tol), "{} vs {want}", got[k]);
            }
        }
    }
}

//===--- resize ----------------------------------------------------------------------===//

/// The ONNX reference's 1-D interpolation of one output index (`_interpolate_1d_along_axis`
/// for a 2-tap kernel), transcribed: returns (indices, coefficients) before clamping.
fn onnx_1d(
    mode: ResizeMode,
    coord: CoordMode,
    nearest: NearestMode,
    scale: f64,
    inp: usize,
    out: usize,
    y: usize,
) -> ([i64; 2], [f64; 2]) {
    let out_f = scale * inp as f64;
    let yf = y as f64;
    let x = match coord {
        CoordMode::AlignCorners => {
            if out_f == 1.0 {
                0.0
            } else {
                yf * (inp as f64 - 1.0) / (out_f - 1.0)
            }
        }
        CoordMode::Asymmetric => yf / scale,
        CoordMode::PytorchHalfPixel => {
            if out_f == 1.0 {
                -0.5
            } else {
                (yf + 0.5) / scale - 0.5
            }
        }
        CoordMode::HalfPixel => (yf + 0.5) / scale - 0.5,
        CoordMode::HalfPixelSymmetric => {
            let adj = out as f64 / out_f;
            let center = inp as f64 / 2.0;
            center * (1.0 - adj) + (yf + 0.5) / scale - 0.5
        }
        CoordMode::TfHalfPixelForNearest => (yf + 0.5) / scale,
    };
    let xi = x.floor();
    let ratio = if x == xi { 1.0 } else { x - xi };
    let coeffs = match mode {
        ResizeMode::Linear => [1.0 - ratio, ratio],
        ResizeMode::Nearest => {
            if ratio == 1.0 || ratio.fract() == 0.0 {
                [0.0, 1.0]
            } else {
                match nearest {
                    NearestMode::RoundPreferFloor => {
                        [(ratio <= 0.5) as u8 as f64, (ratio > 0.5) as u8 as f64]
                    }
                    NearestMode::RoundPreferCeil => {
                        [(ratio < 0.5) as u8 as f64, (ratio >= 0.5) as u8 as f64]
                    }
                    NearestMode::Floor => [1.0, 0.0],
                    NearestMode::Ceil => [0.0, 1.0],
                }
            }
        }
    };
    // Even kernel: window starts at p−1 when x is integral (ties to the smaller centre).
    let xp = x + 1.0;
    let p = xp.floor();
    let start = if xp == p { p as i64 - 1 } else { p as i64 };
    ([start - 1, start], coeffs)
}

proptest! {
    #![proptest_config(cfg(400))]

    #[test]
    fn resize_matches_the_onnx_reference(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let mut m = Arena::new(ARENA);
        let mode = ResizeMode::ALL[rng.below(2) as usize];
        let coord = CoordMode::ALL[rng.below(6) as usize];
        let nearest = NearestMode::ALL[rng.below(4) as usize];
        let ishape = random_shape(&mut rng, [2, 3, 6, 7], false);
        let mut oshape = ishape;
        let mut scales = [0f32; 4];
        for d in 0..4 {
            if d < 2 && rng.chance(0.7) { continue; }
            if rng.chance(0.5) {
                // Scales given: out = floor(in · scale).
                let s = [0.5f32, 1.5, 2.0, 3.0, 0.75, 1.0, 0.6][rng.below(7) as usize];
                let o = (ishape[d] as f32 * s).floor() as u32;
                if o == 0 { continue; }
                scales[d] = s;
                oshape[d] = o;
            } else {
                oshape[d] = 1 + rng.below(2 * ishape[d] as u64 + 2) as u32;
            }
        }
        let input = m.random(&mut rng, DType::F32, ishape, false);
        let output = m.random(&mut rng, DType::F32, oshape, false);
        m.fill_f32(&input, &mut rng, -10.0, 10.0);
        let xs = m.read_f32(&input);
        m.run(&Op::Resize(op::Resize { input, output, mode, coord, nearest, scales }), &mut Workspace::new()).unwrap();
        let got = m.read_f32(&output);
        // Separable reference in f64, one axis at a time (identity axes skipped).
        let mut data: Vec<f64> = xs.iter().map(|&x| x as f64).collect();
        let mut shape = ishape.map(|d| d as usize);
        for d in 0..4 {
            let (inp, out) = (ishape[d] as usize, oshape[d] as usize);
            if scales[d] == 0.0 && inp == out { continue; }
            let scale = if scales[d] > 0.0 { scales[d] as f64 } else { out as f64 / inp as f64 };
            let mut nshape = shape;
            nshape[d] = out;
            let mut nd = vec![0.0; nshape.iter().product()];
            for (k, v) in nd.iter_mut().enumerate() {
                let mut idx = [0usize; 4];
                let mut r = k;
                for e in (0..4).rev() { idx[e] = r % nshape[e]; r /= nshape[e]; }
                let (ids, cs) = onnx_1d(mode, coord, nearest, scale, inp, out, idx[d]);
                let mut s = 0.0;
                for t in 0..2 {
                    if cs[t] == 0.0 { continue; }
                    let mut src = idx;
                    src[d] = ids[t].clamp(0, inp as i64 - 1) as usize;
                    let off = ((src[0] * shape[1] + src[1]) * shape[2] + src[2]) * shape[3] + src[3];
                    s += cs[t] * data[off];
                }
                *v = s;
            }
            data = nd;
            shape = nshape;
        }
        assert_close(&got, &data, 1e-5, 1e-5, &format!("{mode:?} {coord:?} {nearest:?} {ishape:?}->{oshape:?} {scales:?}"));
    }
}

//===--- gather ----------------------------------------------------------------------===//

proptest! {
    #![proptest_config(cfg(300))]

    #[test]
    fn gather_random(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let mut m = Arena::new(ARENA);
        let dt = DType::ALL[rng.below(DType::ALL.len() as u64) as usize];
        let a = 1 + rng.below(6) as u32;
        let n = rng.below(8) as u32;
        let dshape = [1 + rng.below(2) as u32, 1 + rng.below(3) as u32, a, 1 + rng.below(9) as u32];
        let data = m.random(&mut rng, dt, dshape, true);
        let it = if rng.chance(0.5) { DType::I32 } else { DType::I64 };
        let indices_ap = m.random(&mut rng, it, [1, 1, 1, n], false);
        let output = m.random(&mut rng, dt, [dshape[0], dshape[1], n, dshape[3]], false);
        m.fill_with(&data, || random_bits(&mut rng, dt));
        let bad = rng.chance(0.15) && n > 0;
        let mut idxs = Vec::new();
        for _ in 0..n {
            let v = rng.below(2 * a as u64) as i64 - a as i64;
            idxs.push(v);
        }
        if bad {
            let p = rng.below(n as u64) as usize;
            idxs[p] = if rng.chance(0.5) { a as i64 + rng.below(3) as i64 } else { -(a as i64) - 1 - rng.below(3) as i64 };
        }
        for (i, v) in idxs.iter().enumerate() {
            let bits = if it == DType::I32 { *v as i32 as u32 as u64 } else { *v as u64 };
            m.set_raw(&indices_ap, [0, 0, 0, i], bits);
        }
        let before = m.read_raw(&output);
        let r = m.run(&Op::Gather(op::Gather { data, indices: indices_ap, output }), &mut Workspace::new());
        if bad {
            let first = idxs.iter().position(|&v| v < -(a as i64) || v >= a as i64).unwrap();
            prop_assert_eq!(r, Err(KernelError::IndexOutOfRange { position: first as u64, index: idxs[first], limit: a }));
            prop_assert_eq!(m.read_raw(&output), before, "output untouched");
            return Ok(());
        }
        r.unwrap();
        for [p, q, i, d] in indices([dshape[0], dshape[1], n, dshape[3]]) {
            let src = if idxs[i] < 0 { idxs[i] + a as i64 } else { idxs[i] } as usize;
            prop_assert_eq!(m.get_raw(&output, [p, q, i, d]), m.get_raw(&data, [p, q, src, d]));
        }
    }
}

/// Random i32/i64 indices for `ap` (shape `shape`) within `[-a, a)`, one of them out of
/// range when `bad`; returns them in row-major order.
fn put_indices(
    m: &mut Arena,
    rng: &mut Rng,
    ap: &AccessPattern,
    shape: [u32; 4],
    a: u32,
    bad: bool,
) -> Vec<i64> {
    let mut idxs = Vec::new();
    for p in indices(shape) {
        let v = rng.below(2 * a as u64) as i64 - a as i64;
        idxs.push(v);
        let bits = if ap.dtype == DType::I32 {
            v as i32 as u32 as u64
        } else {
            v as u64
        };
        m.set_raw(ap, p, bits);
    }
    if bad && !idxs.is_empty() {
        let k = rng.below(idxs.len() as u64) as usize;
        let v = if rng.chance(0.5) {
            a as i64 + rng.below(3) as i64
        } else {
            -(a as i64) - 1 - rng.below(3) as i64
        };
        idxs[k] = v;
        let p = indices(shape).nth(k).unwrap();
        let bits = if ap.dtype == DType::I32 {
            v as i32 as u32 as u64
        } else {
            v as u64
        };
        m.set_raw(ap, p, bits);
    }
    idxs
}

proptest! {
    #![proptest_config(cfg(300))]

    #[test]
    fn gather_elements_random(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let mut m = Arena::new(ARENA);
        let dt = DType::ALL[rng.below(12) as usize];
        let axis = rng.below(4) as usize;
        let a = 1 + rng.below(5) as u32;
        let shape = [1 + rng.below(2) as u32, 1 + rng.below(3) as u32, rng.below(4) as u32, 1 + rng.below(4) as u32];
        let mut dshape = shape;
        dshape[axis] = a;
        let data = m.random(&mut rng, dt, dshape, true);
        let it = if rng.chance(0.5) { DType::I32 } else { DType::I64 };
        let idx = m.random(&mut rng, it, shape, false);
        let output = m.random(&mut rng, dt, shape, false);
        m.fill_with(&data, || random_bits(&mut rng, dt));
        let bad = rng.chance(0.15);
        let idxs = put_indices(&mut m, &mut rng, &idx, shape, a, bad);
        let before = m.read_raw(&output);
        let r = m.run(&Op::GatherElements(op::GatherElements { data, indices: idx, output, axis: axis as u8 }), &mut Workspace::new());
        if let Some(first) = idxs.iter().position(|&v| v < -(a as i64) || v >= a as i64) {
            prop_assert_eq!(r, Err(KernelError::IndexOutOfRange { position: first as u64, index: idxs[first], limit: a }));
            prop_assert_eq!(m.read_raw(&output), before, "output untouched");
            return Ok(());
        }
        r.unwrap();
        for (k, p) in indices(shape).enumerate() {
            let mut q = p;
            q[axis] = if idxs[k] < 0 { idxs[k] + a as i64 } else { idxs[k] } as usize;
            prop_assert_eq!(m.get_raw(&output, p), m.get_raw(&data, q));
        }
    }

    #[test]
    fn scatter_elements_random(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let mut m = Arena::new(ARENA);
        let reduce = ScatterReduce::ALL[rng.below(5) as usize];
        let dt = if reduce == ScatterReduce::None {
            DType::ALL[rng.below(12) as usize]
        } else {
            [DType::F32, DType::I32, DType::I64][rng.below(3) as usize]
        };
        let axis = rng.below(4) as usize;
        let a = 1 + rng.below(5) as u32;
        let shape = [1 + rng.below(2) as u32, 1 + rng.below(3) as u32, rng.below(4) as u32, 1 + rng.below(4) as u32];
        let mut oshape = shape;
        oshape[axis] = a;
        let output = m.random(&mut rng, dt, oshape, false);
        let it = if rng.chance(0.5) { DType::I32 } else { DType::I64 };
        let idx = m.random(&mut rng, it, shape, false);
        let updates = m.random(&mut rng, dt, shape, false);
        let small = |rng: &mut Rng| match dt {
            DType::F32 => (rng.below(9) as f32 - 4.0).to_bits() as u64,
            DType::I32 => (rng.below(9) as i32 - 4) as u32 as u64,
            DType::I64 => (rng.below(9) as i64 - 4) as u64,
            _ => random_bits(rng, dt),
        };
        m.fill_with(&output, || small(&mut rng));
        m.fill_with(&updates, || small(&mut rng));
        let bad = rng.chance(0.15);
        let idxs = put_indices(&mut m, &mut rng, &idx, shape, a, bad);
        let before = m.read_raw(&output);
        let r = m.run(&Op::ScatterElements(op::ScatterElements { indices: idx, updates, output, axis: axis as u8, reduce }), &mut Workspace::new());
        if let Some(first) = idxs.iter().position(|&v| v < -(a as i64) || v >= a as i64) {
            prop_assert_eq!(r, Err(KernelError::IndexOutOfRange { position: first as u64, index: idxs[first], limit: a }));
            prop_assert_eq!(m.read_raw(&output), before, "output untouched");
            return Ok(());
        }
        r.unwrap();
        // The reference: the same updates in row-major order on a copy of the output.
        let mut want: std::collections::HashMap<[usize; 4], u64> = indices(oshape).zip(before.iter().copied()).collect();
        for (k, p) in indices(shape).enumerate() {
            let mut q = p;
            q[axis] = if idxs[k] < 0 { idxs[k] + a as i64 } else { idxs[k] } as usize;
            let (old, u) = (want[&q], m.get_raw(&updates, p));
            let v = match (reduce, dt) {
                (ScatterReduce::None, _) => u,
                (r, DType::F32) => {
                    let (x, y) = (f32::from_bits(old as u32), f32::from_bits(u as u32));
                    (match r { ScatterReduce::Add => x + y, ScatterReduce::Mul => x * y, ScatterReduce::Max => x.max(y), _ => x.min(y) }).to_bits() as u64
                }
                (r, DType::I32) => {
                    let (x, y) = (old as u32 as i32, u as u32 as i32);
                    (match r { ScatterReduce::Add => x.wrapping_add(y), ScatterReduce::Mul => x.wrapping_mul(y), ScatterReduce::Max => x.max(y), _ => x.min(y) }) as u32 as u64
                }
                (r, _) => {
                    let (x, y) = (old as i64, u as i64);
                    (match r { ScatterReduce::Add => x.wrapping_add(y), ScatterReduce::Mul => x.wrapping_mul(y), ScatterReduce::Max => x.max(y), _ => x.min(y) }) as u64
                }
            };
            want.insert(q, v);
        }
        for p in indices(oshape) {
            prop_assert_eq!(m.get_raw(&output, p), want[&p], "at {:?}", p);
        }
    }
}

proptest! {
    #![proptest_config(cfg(300))]

    #[test]
    fn top_k_random(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let mut m = Arena::new(ARENA);
        let dt = [DType::F32, DType::I32, DType::I64, DType::U8, DType::U64][rng.below(5) as usize];
        let n = 1 + rng.below(12) as u32;
        let k = rng.below(n as u64 + 1) as u32;
        let shape = [1 + rng.below(2) as u32, 1 + rng.below(2) as u32, 1 + rng.below(3) as u32, n];
        let vshape = [shape[0], shape[1], shape[2], k];
        let input = m.random(&mut rng, dt, shape, true);
        let values = m.random(&mut rng, dt, vshape, false);
        let idx = m.random(&mut rng, DType::I64, vshape, false);
        // Few distinct values, so that ties (lower index first) are common; some NaN.
        m.fill_with(&input, || {
            let v = rng.below(5);
            match dt {
                DType::F32 if rng.chance(0.05) => f32::NAN.to_bits() as u64,
                DType::F32 => (v as f32 - 2.0).to_bits() as u64,
                _ => v,
            }
        });
        let largest = rng.chance(0.5);
        m.run(&Op::TopK(op::TopK { input, values, indices: idx, largest }), &mut Workspace::new()).unwrap();
        for [a, b, c, _] in indices([shape[0], shape[1], shape[2], 1]) {
            let mut keys = Vec::new();
            for j in 0..n as usize {
                let bits = m.get_raw(&input, [a, b, c, j]);
                let x = match dt {
                    DType::F32 => {
                        let x = f32::from_bits(bits as u32) as f64;
                        if x.is_nan() { f64::INFINITY } else { x }
                    }
                    _ => bits as f64,
                };
                keys.push((x, j));
            }
            let mut order: Vec<usize> = (0..n as usize).collect();
            order.sort_by(|&x, &y| {
                let o = keys[x].0.partial_cmp(&keys[y].0).unwrap();
                (if largest { o.reverse() } else { o }).then(x.cmp(&y))
            });
            for j in 0..k as usize {
                let got = m.get_raw(&idx, [a, b, c, j]) as usize;
                prop_assert_eq!(got, order[j], "row {:?} rank {}", [a, b, c], j);
                prop_assert_eq!(m.get_raw(&values, [a, b, c, j]), m.get_raw(&input, [a, b, c, got]));
            }
        }
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

//===--- scheduler ops ---------------------------------------------------------------===//

#[test]
fn scheduler_ops_are_not_kernels() {
    let mut m = Arena::new(1024);
    for op in [
        Op::End(op::End),
        Op::Nop(op::Nop),
        Op::DmaDescriptors(op::DmaDescriptors { table: 0, count: 1 }),
        Op::SemSet(op::SemSet {
            sem: nrt_isa::SemRef(8),
            value: 1,
        }),
        Op::Notify(op::Notify {
            subtype: 6,
            sub_id: 7,
            payload: 0,
        }),
        Op::Barrier(op::Barrier {
            sem: nrt_isa::SemRef::global(0),
            count: 2,
        }),
    ] {
        assert!(matches!(
            m.run(&op, &mut Workspace::new()),
            Err(KernelError::Unsupported(_))
        ));
    }
}

/// Throughput of the int8 GEMM's paths — dispatched, AVX2, portable (`cargo test --release
/// -p nrt-kernels --test reference -- --ignored int8_gemm_throughput --nocapture`); prints
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

proptest! {
    #![proptest_config(cfg(300))]

    /// DynamicQuantize against ONNX's definition computed here element by element: random
    /// shapes (row lengths off the 16- and 64-lane steps), random layouts (permuted, padded,
    /// reversed and broadcast inputs), and inputs that are all zeros, only positive, only
    /// negative, with NaNs, or far outside u8 after scaling.
    #[test]
    fn dynamic_quantize_random(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let mut m = Arena::new(ARENA);
        let big = rng.chance(0.3);
        let shape = [
            1 + rng.below(2) as u32,
            1 + rng.below(3) as u32,
            1 + rng.below(5) as u32,
            1 + rng.below(if big { 300 } else { 40 }) as u32,
        ];
        let input = m.random(&mut rng, DType::F32, shape, true);
        let output = m.random(&mut rng, DType::U8, shape, false);
        let scale = m.dense(DType::F32, [1, 1, 1, 1]);
        let zero_point = m.dense(DType::U8, [1, 1, 1, 1]);
        let (lo, hi) = match rng.below(5) {
            0 => (0.0, 0.0),
            1 => (0.5, 40.0),
            2 => (-7.0, -0.25),
            _ => (rng.f32(-10.0, 0.0), rng.f32(0.0, 10.0)),
        };
        let nan = rng.chance(0.2);
        m.fill_with(&input, || {
            let v = if nan && rng.chance(0.1) { f32::NAN } else { rng.f32(lo, hi) };
            v.to_bits() as u64
        });
        m.fill_with(&output, || 0xAA);
        m.run(&Op::DynamicQuantize(op::DynamicQuantize { input, output, scale, zero_point }), &mut Workspace::new()).unwrap();

        let x = m.read_f32(&input);
        let (mut mn, mut mx) = (0f32, 0f32);
        for &v in &x {
            if v < mn { mn = v; }
            if v > mx { mx = v; }
        }
        let s = if mx == mn { 1.0 } else { (mx - mn) / 255.0 };
        let z = (-(mn / s)).clamp(0.0, 255.0).round_ties_even();
        prop_assert_eq!(m.get_f32(&scale, [0; 4]).to_bits(), s.to_bits(), "scale");
        prop_assert_eq!(m.get_raw(&zero_point, [0; 4]), z as u64, "zero point");
        let y = m.read_raw(&output);
        for (i, (&v, &q)) in x.iter().zip(&y).enumerate() {
            let want = if v.is_nan() {
                0
            } else {
                ((v / s).round_ties_even() + z).clamp(0.0, 255.0) as u64
            };
            prop_assert_eq!(q, want, "element {} of {:?}: x = {}", i, shape, v);
        }
    }
}

#[test]
fn dynamic_quantize_saturates_and_keeps_the_onnx_example() {
    // ONNX's own example (the node test's data): x = [0, 2, −3, −2.5, 1.34, 0.5].
    let mut m = Arena::new(ARENA);
    let input = m.dense(DType::F32, [1, 1, 1, 6]);
    let output = m.dense(DType::U8, [1, 1, 1, 6]);
    let scale = m.dense(DType::F32, [1, 1, 1, 1]);
    let zero_point = m.dense(DType::U8, [1, 1, 1, 1]);
    for (i, v) in [0.0f32, 2.0, -3.0, -2.5, 1.34, 0.5].into_iter().enumerate() {
        m.set_f32(&input, [0, 0, 0, i], v);
    }
    let op = Op::DynamicQuantize(op::DynamicQuantize {
        input,
        output,
        scale,
        zero_point,
    });
    m.run(&op, &mut Workspace::new()).unwrap();
    assert_eq!(m.read_raw(&output), vec![153, 255, 0, 26, 221, 179]);
    assert_eq!(m.get_raw(&zero_point, [0; 4]), 153);
    assert!((m.get_f32(&scale, [0; 4]) - 0.019_607_844).abs() < 1e-9);
}
