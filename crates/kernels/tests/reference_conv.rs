//! Convolution against the 7-loop f64 reference: im2col bands, the panel path, depthwise,
//! short-patch direct kernels and same-width rows.

// Reference code indexes dimensions explicitly: clearer than iterator chains here.
#![allow(clippy::needless_range_loop)]

mod common;

use common::reference::cfg;
use common::{Arena, Rng, assert_close, indices};
use nrt_hal::DType;
use nrt_isa::op;
use nrt_isa::{ActFunc, Op, Window};
use nrt_kernels::Workspace;
use proptest::prelude::*;

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
