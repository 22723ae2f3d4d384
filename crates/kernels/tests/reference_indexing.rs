//! Index-computing ops against a scalar reference: resize (the ONNX interpolation),
//! gather, gather/scatter elements and top-k.

// Reference code indexes dimensions explicitly: clearer than iterator chains here.
#![allow(clippy::needless_range_loop)]

mod common;

use common::reference::{ARENA, cfg, random_bits};
use common::{Arena, Rng, assert_close, indices, random_shape};
use nrt_hal::DType;
use nrt_isa::op;
use nrt_isa::{AccessPattern, CoordMode, NearestMode, Op, ResizeMode, ScatterReduce};
use nrt_kernels::{KernelError, Workspace};
use proptest::prelude::*;

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
