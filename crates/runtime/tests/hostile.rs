//! Hostile models through the whole load path (decode, validate, place, device): each is
//! refused with a status and a message naming the culprit — never a crash.

mod common;

use common::*;
use nrt_hal::{DType, Engine, NrtStatus};
use nrt_isa::{AccessPattern, Instruction, Op};
use nrt_model::{ModelBuilder, vaddr};

/// D1: a Fill / DmaCopy whose extent (~2^64 bytes) wrapped `i64` validated, loaded and then
/// wrote out of bounds on the device (SIGSEGV). The load must fail with `NRT_INVALID`.
#[test]
fn d1_load_of_huge_stride_operand_fails_invalid() {
    let (_dev, rt) = runtime();
    for engine in [Engine::Dve, Engine::Sp] {
        let mut b = ModelBuilder::new("d1", 1);
        let tmp = b.scratch(0, 64, 64);
        let huge = AccessPattern {
            addr: vaddr(tmp, 0),
            dtype: DType::F32,
            shape: [1, 1, 1, 1 << 31],
            stride: [0, 0, 0, i32::MAX],
        };
        let op = if engine == Engine::Dve {
            Op::Fill { out: huge, bits: 0 }
        } else {
            Op::DmaCopy {
                src: huge,
                dst: huge,
            }
        };
        b.push(0, engine, Instruction::new(op));
        let bytes = b.build().encode();
        let e = rt.load(&bytes, 0, &quick_timeout()).unwrap_err();
        assert_eq!(e.status, NrtStatus::Invalid, "{engine}: {e:?}");
        assert!(
            e.message.contains("instruction 0") && e.message.contains("plan entry"),
            "{engine}: {}",
            e.message
        );
    }
}

/// D7: an output of shape `[2^31, 2^31, 4]` whose size wrapped to 0 loaded, ran and reported
/// size 0. The load must fail with `NRT_INVALID`, naming the tensor's shape.
#[test]
fn d7_load_of_io_tensor_whose_size_overflows_fails_invalid() {
    let (_dev, rt) = runtime();
    let mut b = ModelBuilder::new("d7", 1);
    let y = b.output("y", DType::F32, &[1 << 31, 1 << 31, 4]);
    let yr = b.io_mem_ref(y);
    let mut m = b.build();
    m.mem_refs[yr as usize].size = 0;
    let e = rt.load(&m.encode(), 0, &quick_timeout()).unwrap_err();
    assert_eq!(e.status, NrtStatus::Invalid, "{e:?}");
    assert!(e.message.contains("io[0].shape"), "{}", e.message);
}
