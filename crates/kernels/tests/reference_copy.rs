//! Copies, conversions and fills of every element type pair against a scalar reference, over
//! random shapes and layouts; and the scheduler ops, which are not kernels.

// Reference code indexes dimensions explicitly: clearer than iterator chains here.
#![allow(clippy::needless_range_loop)]

mod common;

use common::reference::{ARENA, cfg, random_bits};
use common::{Arena, Rng, indices, random_shape};
use nrt_hal::DType;
use nrt_isa::op;
use nrt_isa::{AccessPattern, Op};
use nrt_kernels::elem::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use nrt_kernels::{KernelError, Workspace};
use proptest::prelude::*;

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
