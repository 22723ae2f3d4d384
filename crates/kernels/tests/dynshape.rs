//! The data-dependent-extent kernels (`NonZero`, `Unique`, `NonMaxSuppression`) against
//! straightforward references, with planted edge cases: an all-zero input, all-equal
//! elements, tied scores. Every output operand starts full of stale bits, so a kernel that
//! forgets the zero-fill past the actual extent fails.

#![allow(clippy::needless_range_loop)]

mod common;

use common::{Arena, Rng, indices};
use nrt_hal::DType;
use nrt_isa::op;
use nrt_isa::{AccessPattern, Op, ShapeTemplate, nms_flags};
use nrt_kernels::Workspace;
use proptest::prelude::*;

const ARENA: usize = 1 << 20;
const STALE: u64 = 0xA5A5_A5A5_A5A5_A5A5;

fn stale(m: &mut Arena, ap: &AccessPattern) {
    m.fill_with(ap, || STALE);
}

fn i64s(m: &mut Arena, ap: &AccessPattern) -> Vec<i64> {
    m.read_raw(ap).into_iter().map(|v| v as i64).collect()
}

//===--- NonZero ------------------------------------------------------------------------===//

fn run_non_zero(m: &mut Arena, input: AccessPattern, rank: u32) -> (Vec<i64>, Vec<i64>) {
    let n = input.elements() as u32;
    let output = m.dense(DType::I64, [1, 1, rank, n]);
    let shape = m.dense(DType::I64, [1, 1, 1, 2]);
    stale(m, &output);
    stale(m, &shape);
    let op = Op::NonZero(op::NonZero {
        input,
        output,
        shape,
    });
    m.run(&op, &mut Workspace::new()).unwrap();
    (i64s(m, &output), i64s(m, &shape))
}

#[test]
fn non_zero_of_all_zero_input_is_empty_and_zero_filled() {
    let mut m = Arena::new(ARENA);
    let input = m.dense(DType::F32, [1, 1, 2, 3]);
    // +0.0 and -0.0 are both zero.
    let mut k = 0;
    m.fill_with(&input, || {
        k += 1;
        if k % 2 == 0 {
            (-0.0f32).to_bits() as u64
        } else {
            0
        }
    });
    let (out, shape) = run_non_zero(&mut m, input, 2);
    assert_eq!(shape, [2, 0]);
    assert!(out.iter().all(|&v| v == 0), "{out:?}");
}

#[test]
fn non_zero_example() {
    // ONNX's test_nonzero_example: [[1, 0], [1, 1]] (bool) → [[0, 1, 1], [0, 0, 1]].
    let mut m = Arena::new(ARENA);
    let input = m.dense(DType::Bool, [1, 1, 2, 2]);
    let v = [1u64, 0, 1, 1];
    let mut k = 0;
    m.fill_with(&input, || {
        k += 1;
        v[k - 1]
    });
    let (out, shape) = run_non_zero(&mut m, input, 2);
    assert_eq!(shape, [2, 3]);
    assert_eq!(out, [0, 1, 1, 0, 0, 1, 0, 0]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn non_zero_random(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let mut m = Arena::new(ARENA);
        let dt = [DType::F32, DType::I32, DType::I64, DType::U8, DType::Bool, DType::F16][rng.below(6) as usize];
        let rank = 1 + rng.below(4) as u32;
        let mut shape = [1u32; 4];
        for d in 4 - rank as usize..4 {
            shape[d] = rng.below(4) as u32;
        }
        let input = m.random(&mut rng, dt, shape, false);
        m.fill_with(&input, || if rng.chance(0.5) { 0 } else { 1 + rng.below(3) });
        let mut want: Vec<[usize; 4]> = Vec::new();
        for i in indices(shape) {
            if m.get_raw(&input, i) != 0 {
                want.push(i);
            }
        }
        let (out, got_shape) = run_non_zero(&mut m, input, rank);
        let c = want.len();
        prop_assert_eq!(got_shape, vec![rank as i64, c as i64]);
        for r in 0..rank as usize {
            for k in 0..c {
                prop_assert_eq!(out[r * c + k], want[k][4 - rank as usize + r] as i64);
            }
        }
        prop_assert!(out[rank as usize * c..].iter().all(|&v| v == 0));
    }
}

//===--- Unique -------------------------------------------------------------------------===//

struct UniqueOut {
    y: Vec<u64>,
    indices: Vec<i64>,
    inverse: Vec<i64>,
    counts: Vec<i64>,
    shape: Vec<i64>,
}

/// Unique over `input` `[1, outer, a, inner]`; `y`'s ONNX shape is `[outer, a, inner]`.
fn run_unique(m: &mut Arena, input: AccessPattern, sorted: bool) -> UniqueOut {
    let [_, outer, a, inner] = input.shape;
    let y = m.dense(input.dtype, input.shape);
    let idx = m.dense(DType::I64, [1, 1, 1, a]);
    let inv = m.dense(DType::I64, [1, 1, 1, a]);
    let cnt = m.dense(DType::I64, [1, 1, 1, a]);
    let shape = m.dense(DType::I64, [1, 1, 1, 3]);
    for ap in [&y, &idx, &inv, &cnt, &shape] {
        stale(m, ap);
    }
    let op = Op::Unique(op::Unique {
        input,
        y,
        indices: idx,
        inverse: inv,
        counts: cnt,
        shape,
        dims: ShapeTemplate {
            rank: 3,
            axis: 1,
            dims: [outer, a, inner, 0, 0, 0, 0, 0],
        },
        sorted,
    });
    m.run(&op, &mut Workspace::new()).unwrap();
    UniqueOut {
        y: m.read_raw(&y),
        indices: i64s(m, &idx),
        inverse: i64s(m, &inv),
        counts: i64s(m, &cnt),
        shape: i64s(m, &shape),
    }
}

#[test]
fn unique_of_all_equal_elements_is_one() {
    let mut m = Arena::new(ARENA);
    let input = m.dense(DType::F32, [1, 1, 5, 1]);
    m.fill_with(&input, || 7.5f32.to_bits() as u64);
    for sorted in [true, false] {
        let u = run_unique(&mut m, input, sorted);
        assert_eq!(u.shape, [1, 1, 1]);
        assert_eq!(u.y, [7.5f32.to_bits() as u64, 0, 0, 0, 0]);
        assert_eq!(u.indices, [0, 0, 0, 0, 0]);
        assert_eq!(u.counts, [5, 0, 0, 0, 0]);
        assert_eq!(u.inverse, [0, 0, 0, 0, 0]);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn unique_random(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let mut m = Arena::new(ARENA);
        let dt = [DType::F32, DType::I32, DType::I64, DType::U8][rng.below(4) as usize];
        let (outer, a, inner) = (1 + rng.below(2) as u32, rng.below(7) as u32, 1 + rng.below(2) as u32);
        let input = m.random(&mut rng, dt, [1, outer, a, inner], false);
        // Few distinct values so that equal slices are common.
        m.fill_with(&input, || {
            let v = rng.below(3);
            if dt == DType::F32 { (v as f32 - 1.0).to_bits() as u64 } else { v }
        });
        let sorted = rng.chance(0.5);
        let slice = |m: &mut Arena, j: usize| -> Vec<i64> {
            let mut s = Vec::new();
            for o in 0..outer as usize {
                for i in 0..inner as usize {
                    let b = m.get_raw(&input, [0, o, j, i]);
                    s.push(if dt == DType::F32 { f32::from_bits(b as u32) as i64 } else { b as i64 });
                }
            }
            s
        };
        let slices: Vec<Vec<i64>> = (0..a as usize).map(|j| slice(&mut m, j)).collect();
        // Reference: distinct slices by first occurrence, then sorted if asked.
        let mut groups: Vec<(Vec<i64>, usize, i64)> = Vec::new();
        for (j, s) in slices.iter().enumerate() {
            match groups.iter_mut().find(|g| &g.0 == s) {
                Some(g) => g.2 += 1,
                None => groups.push((s.clone(), j, 1)),
            }
        }
        if sorted {
            groups.sort_by(|x, y| x.0.cmp(&y.0));
        }
        let u = run_unique(&mut m, input, sorted);
        let ng = groups.len();
        prop_assert_eq!(u.shape.clone(), vec![outer as i64, ng as i64, inner as i64]);
        for (k, g) in groups.iter().enumerate() {
            prop_assert_eq!(u.indices[k], g.1 as i64);
            prop_assert_eq!(u.counts[k], g.2);
        }
        prop_assert!(u.indices[ng..].iter().all(|&v| v == 0));
        prop_assert!(u.counts[ng..].iter().all(|&v| v == 0));
        for (j, s) in slices.iter().enumerate() {
            let want = groups.iter().position(|g| &g.0 == s).unwrap();
            prop_assert_eq!(u.inverse[j], want as i64);
        }
        // y packed as [outer, U, inner]: element (o, k, i) is slice k's (o, i).
        for o in 0..outer as usize {
            for (k, g) in groups.iter().enumerate() {
                for i in 0..inner as usize {
                    let got = u.y[(o * ng + k) * inner as usize + i];
                    let want = m.get_raw(&input, [0, o, g.1, i]);
                    prop_assert_eq!(got, want);
                }
            }
        }
        prop_assert!(u.y[outer as usize * ng * inner as usize..].iter().all(|&v| v == 0));
    }
}

//===--- NonMaxSuppression ----------------------------------------------------------------===//

struct Nms {
    boxes: AccessPattern,
    scores: AccessPattern,
    iou: AccessPattern,
    selected: AccessPattern,
    shape: AccessPattern,
}

fn nms_setup(m: &mut Arena, boxes: &[[f32; 4]], scores: &[f32], bound: u32) -> Nms {
    let s = boxes.len() as u32;
    let b = m.dense(DType::F32, [1, 1, s, 4]);
    let sc = m.dense(DType::F32, [1, 1, 1, s]);
    for (j, bx) in boxes.iter().enumerate() {
        for k in 0..4 {
            m.set_f32(&b, [0, 0, j, k], bx[k]);
        }
        m.set_f32(&sc, [0, 0, 0, j], scores[j]);
    }
    let iou = m.dense(DType::F32, [1, 1, 1, 1]);
    let selected = m.dense(DType::I64, [1, 1, bound, 3]);
    let shape = m.dense(DType::I64, [1, 1, 1, 2]);
    Nms {
        boxes: b,
        scores: sc,
        iou,
        selected,
        shape,
    }
}

fn run_nms(m: &mut Arena, n: &Nms, iou: f32, max_out: u32) -> (Vec<i64>, Vec<i64>) {
    m.set_f32(&n.iou, [0, 0, 0, 0], iou);
    stale(m, &n.selected);
    stale(m, &n.shape);
    let op = Op::NonMaxSuppression(op::NonMaxSuppression {
        boxes: n.boxes,
        scores: n.scores,
        max_out: None,
        iou: Some(n.iou),
        score_threshold: None,
        selected: n.selected,
        shape: n.shape,
        flags: nms_flags::IOU,
        max_out_const: max_out,
        iou_const: 0.0,
        score_const: 0.0,
    });
    m.run(&op, &mut Workspace::new()).unwrap();
    (i64s(m, &n.selected), i64s(m, &n.shape))
}

#[test]
fn nms_ties_take_the_lower_index_first() {
    let mut m = Arena::new(ARENA);
    // Boxes 1 and 3 are identical with the same top score; box 2 is disjoint, tied with 0.
    let boxes = [
        [0.0, 0.0, 1.0, 1.0],
        [5.0, 5.0, 6.0, 6.0],
        [10.0, 10.0, 11.0, 11.0],
        [5.0, 5.0, 6.0, 6.0],
    ];
    let n = nms_setup(&mut m, &boxes, &[0.5, 0.9, 0.5, 0.9], 4);
    let (sel, shape) = run_nms(&mut m, &n, 0.5, 4);
    assert_eq!(shape, [3, 3]);
    assert_eq!(sel, [0, 0, 1, 0, 0, 0, 0, 0, 2, 0, 0, 0]);
    // The IoU threshold is read at execution: at 1.0 identical boxes (IoU 1) no longer
    // suppress each other.
    let (sel, shape) = run_nms(&mut m, &n, 1.0, 4);
    assert_eq!(shape, [4, 3]);
    assert_eq!(sel, [0, 0, 1, 0, 0, 3, 0, 0, 0, 0, 0, 2]);
    // At most one per class; and a bound smaller than the selections stops at the bound.
    let (sel, shape) = run_nms(&mut m, &n, 0.5, 1);
    assert_eq!(shape, [1, 3]);
    assert_eq!(sel[..3], [0, 0, 1]);
    assert!(sel[3..].iter().all(|&v| v == 0));
    let small = nms_setup(&mut m, &boxes, &[0.5, 0.9, 0.5, 0.9], 2);
    let (sel, shape) = run_nms(&mut m, &small, 0.5, 4);
    assert_eq!(shape, [2, 3]);
    assert_eq!(sel, [0, 0, 1, 0, 0, 0]);
}
