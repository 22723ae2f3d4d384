//! `RoiAlign` with planted cases whose answer is known without a reference: a constant
//! image, a region outside the image, a linear ramp (bilinear sampling is exact on it), and
//! a batch index out of range (a device error, nothing written).

mod common;

use common::Arena;
use nrt_hal::DType;
use nrt_isa::op;
use nrt_isa::{AccessPattern, Op, roi_flags};
use nrt_kernels::{KernelError, Workspace};

struct Roi {
    input: AccessPattern,
    rois: AccessPattern,
    batch: AccessPattern,
    output: AccessPattern,
}

fn setup(
    m: &mut Arena,
    x: impl Fn(usize, usize, usize, usize) -> f32,
    rois: &[[f32; 4]],
    batch: &[i64],
) -> Roi {
    let (n, c, h, w) = (2u32, 2u32, 6u32, 8u32);
    let input = m.dense(DType::F32, [n, c, h, w]);
    for i in common::indices([n, c, h, w]) {
        m.set_f32(&input, i, x(i[0], i[1], i[2], i[3]));
    }
    let nr = rois.len() as u32;
    let r = m.dense(DType::F32, [1, 1, nr, 4]);
    let b = m.dense(DType::I64, [1, 1, 1, nr]);
    for (k, roi) in rois.iter().enumerate() {
        for (j, &v) in roi.iter().enumerate() {
            m.set_f32(&r, [0, 0, k, j], v);
        }
        m.set_raw(&b, [0, 0, 0, k], batch[k] as u64);
    }
    let output = m.dense(DType::F32, [nr, c, 3, 3]);
    m.fill_with(&output, || 0x7fc0_0001); // stale NaNs
    Roi {
        input,
        rois: r,
        batch: b,
        output,
    }
}

fn run(m: &mut Arena, r: &Roi, flags: u32, sampling_ratio: u32) -> Result<Vec<f32>, KernelError> {
    let op = Op::RoiAlign(op::RoiAlign {
        input: r.input,
        rois: r.rois,
        batch_indices: r.batch,
        output: r.output,
        spatial_scale: 1.0,
        sampling_ratio,
        flags,
    });
    m.run(&op, &mut Workspace::new())?;
    Ok(m.read_f32(&r.output))
}

#[test]
fn constant_image_gives_the_constant_and_outside_gives_zero() {
    let mut m = Arena::new(1 << 20);
    let rois = [[1.0, 1.0, 5.0, 4.0], [100.0, 100.0, 120.0, 130.0]];
    let r = setup(
        &mut m,
        |b, c, _, _| 1.0 + b as f32 + 10.0 * c as f32,
        &rois,
        &[1, 0],
    );
    for flags in [0, roi_flags::HALF_PIXEL] {
        for ratio in [0, 2] {
            let y = run(&mut m, &r, flags, ratio).unwrap();
            // Region 0 on image 1: channel c is 2 + 10c everywhere; region 1 lies outside.
            for (k, v) in y.iter().enumerate() {
                let (roi, c) = (k / 18, (k / 9) % 2);
                let want = if roi == 0 { 2.0 + 10.0 * c as f32 } else { 0.0 };
                assert!(
                    (v - want).abs() < 1e-5,
                    "flags {flags} ratio {ratio} [{k}]: {v} vs {want}"
                );
            }
        }
    }
}

#[test]
fn a_linear_ramp_is_sampled_exactly() {
    // x(h, w) = w inside the image: the average of a cell is its centre's column.
    let mut m = Arena::new(1 << 20);
    let rois = [[1.0, 1.0, 4.0, 4.0]];
    let r = setup(&mut m, |_, _, _, w| w as f32, &rois, &[0]);
    let y = run(&mut m, &r, roi_flags::HALF_PIXEL, 2).unwrap();
    // half_pixel: the region spans columns 0.5..3.5, cells of width 1 centred at 1, 2, 3.
    for (k, v) in y.iter().enumerate() {
        let want = 1.0 + (k % 3) as f32;
        assert!((v - want).abs() < 1e-5, "[{k}]: {v} vs {want}");
    }
}

#[test]
fn a_batch_index_out_of_range_is_a_device_error_and_writes_nothing() {
    let mut m = Arena::new(1 << 20);
    let r = setup(
        &mut m,
        |_, _, _, _| 1.0,
        &[[0.0, 0.0, 2.0, 2.0]; 2],
        &[0, 2],
    );
    let e = run(&mut m, &r, 0, 0).unwrap_err();
    assert_eq!(
        e,
        KernelError::IndexOutOfRange {
            position: 1,
            index: 2,
            limit: 2
        }
    );
    assert!(m.read_f32(&r.output).iter().all(|v| v.is_nan()));
}
