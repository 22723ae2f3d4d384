//! Activations, binary, tensor-scalar and select ops, and DynamicQuantize against a scalar
//! reference over random shapes and layouts (permuted, padded, reversed, broadcast, in place).

// Reference code indexes dimensions explicitly: clearer than iterator chains here.
#![allow(clippy::needless_range_loop)]

mod common;

use common::reference::{ARENA, act_ref, cfg, random_bits};
use common::{Arena, Rng, close, random_shape};
use nrt_hal::DType;
use nrt_isa::op;
use nrt_isa::{ActFunc, BinaryOp, Op};
use nrt_kernels::Workspace;
use proptest::prelude::*;

//===--- activation ------------------------------------------------------------------===//

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
