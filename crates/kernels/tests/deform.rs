//! `DeformIm2col` with planted cases: zero offsets give the plain im2col columns (integer
//! positions, zero padding outside), a half-pixel offset averages two neighbours, an offset
//! far outside the image gives zeros, and the mask scales each tap.

mod common;

use common::Arena;
use nrt_hal::DType;
use nrt_isa::op;
use nrt_isa::{AccessPattern, Op, Window};
use nrt_kernels::Workspace;

const H: usize = 4;
const W: usize = 5;

fn run(
    m: &mut Arena,
    offsets: impl Fn(usize) -> f32,
    mask: Option<f32>,
) -> (AccessPattern, Vec<f32>) {
    // One image, 2 channels, x[c, y, x] = 100c + 10y + x; a 2 × 2 kernel, padding 1.
    let input = m.dense(DType::F32, [1, 2, H as u32, W as u32]);
    for i in common::indices(input.shape) {
        m.set_f32(&input, i, (100 * i[1] + 10 * i[2] + i[3]) as f32);
    }
    let (oh, ow) = (H as u32 + 1, W as u32 + 1);
    let offset = m.dense(DType::F32, [1, 8, oh, ow]);
    for i in common::indices(offset.shape) {
        m.set_f32(&offset, i, offsets(i[1]));
    }
    let mask_ap = mask.map(|v| {
        let ap = m.dense(DType::F32, [1, 4, oh, ow]);
        m.fill_with(&ap, || v.to_bits() as u64);
        ap
    });
    let cols = m.dense(DType::F32, [1, 8, oh, ow]);
    let op = Op::DeformIm2col(op::DeformIm2col {
        input,
        offset,
        mask: mask_ap,
        cols,
        window: Window {
            kernel: [2, 2],
            stride: [1, 1],
            pad: [1, 1, 0, 0],
            dilation: [1, 1],
        },
        offset_groups: 1,
    });
    m.run(&op, &mut Workspace::new()).unwrap();
    (cols, m.read_f32(&cols))
}

/// The plain im2col value of channel `c`, tap `(i, j)`, output `(y, x)` (padding 1).
fn plain(c: usize, i: usize, j: usize, y: usize, x: usize) -> f32 {
    let (sy, sx) = (y as i64 - 1 + i as i64, x as i64 - 1 + j as i64);
    if sy < 0 || sx < 0 || sy >= H as i64 || sx >= W as i64 {
        0.0
    } else {
        (100 * c + 10 * sy as usize + sx as usize) as f32
    }
}

#[test]
fn zero_offsets_are_plain_im2col_and_the_mask_scales() {
    let mut m = Arena::new(1 << 20);
    for (mask, scale) in [(None, 1.0), (Some(0.5), 0.5)] {
        let (cols, v) = run(&mut m, |_| 0.0, mask);
        for idx in common::indices(cols.shape) {
            let [_, row, y, x] = idx;
            let (c, i, j) = (row / 4, (row / 2) % 2, row % 2);
            let got = v[((row * (H + 1)) + y) * (W + 1) + x];
            assert_eq!(got, scale * plain(c, i, j, y, x), "{idx:?}");
        }
    }
}

#[test]
fn half_pixel_offsets_interpolate_and_far_offsets_give_zero() {
    let mut m = Arena::new(1 << 20);
    // Δw = 0.5 for every tap: inside the image, the mean of two columns.
    let (_, v) = run(&mut m, |ch| if ch % 2 == 1 { 0.5 } else { 0.0 }, None);
    // Channel 0, tap (1, 1), output (2, 2): samples (2, 2.5) → 22.5.
    let row = 3;
    assert_eq!(v[(row * (H + 1) + 2) * (W + 1) + 2], 22.5);
    // Offsets of 1000 pixels: every sample is outside, every column zero.
    let (_, v) = run(&mut m, |_| 1000.0, None);
    assert!(v.iter().all(|&x| x == 0.0));
}
