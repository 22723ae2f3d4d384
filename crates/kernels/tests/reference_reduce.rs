//! Reductions, pooling, softmax and layer norm against a scalar reference over random
//! shapes and layouts.

// Reference code indexes dimensions explicitly: clearer than iterator chains here.
#![allow(clippy::needless_range_loop)]

mod common;

use common::reference::{ARENA, cfg};
use common::{Arena, Rng, close, indices, random_shape};
use nrt_hal::DType;
use nrt_isa::op;
use nrt_isa::{Op, PoolOp, ReduceOp, Window};
use nrt_kernels::Workspace;
use proptest::prelude::*;

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
