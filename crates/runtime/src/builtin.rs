//! Models built in code: the near-null model of the benchmarks and demos.

use nrt_hal::wire::{CUSTOM_SUB_ID_OUTPUT_DONE, CUSTOM_SUBTYPE_TENSOR};
use nrt_hal::{DType, Engine};
use nrt_isa::op;
use nrt_isa::{AccessPattern, GLOBAL_SEMAPHORES, Instruction, Op, SemRef};
use nrt_model::{ModelBuilder, vaddr};

/// The near-null model: `y = x` for `x: f32[1, 4]`, through the whole device path —
/// SP moves the input in through its descriptor, DVE copies it, SP moves the output out and
/// emits the streaming notification. With `cores = 2` it runs in lockstep on two cores,
/// which meet at a barrier before and after the copy. Its cost is the runtime's and the
/// device's per-execution overhead.
pub fn near_null(cores: u32) -> Vec<u8> {
    identity(
        if cores == 1 {
            "near-null"
        } else {
            "near-null-2c"
        },
        cores,
        4,
    )
}

/// The near-null model's program for `x, y: f32[1, elements]`, named `name`: its time grows
/// with the bytes moved (three passes over them: DMA in, copy, DMA out) — a model whose
/// execution takes as long as a test needs, with an output it can check.
pub fn identity(name: &str, cores: u32, elements: u32) -> Vec<u8> {
    let mut b = ModelBuilder::new(name, cores);
    let x = b.input("x", DType::F32, &[1, elements]);
    let y = b.output("y", DType::F32, &[1, elements]);
    let (xr, yr) = (b.io_mem_ref(x), b.io_mem_ref(y));
    let dx = b.io_descriptor(x);
    let dy = b.io_descriptor(y);
    let input_in = SemRef::local(4);
    let copied = SemRef::local(5);
    let barrier = SemRef::global(GLOBAL_SEMAPHORES - 1);
    let sp = Engine::Sp;
    b.push(
        0,
        sp,
        Instruction::new(Op::DmaDescriptors(op::DmaDescriptors {
            table: dx,
            count: 1,
        }))
        .signal(input_in, 1),
    );
    if cores > 1 {
        for c in 0..cores as u8 {
            b.push(
                c,
                sp,
                Instruction::new(Op::Barrier(op::Barrier {
                    sem: barrier,
                    count: cores,
                })),
            );
        }
    }
    b.push(
        0,
        Engine::Dve,
        Instruction::new(Op::Copy(op::Copy {
            input: AccessPattern::dense(vaddr(xr, 0), DType::F32, &[1, elements]),
            output: AccessPattern::dense(vaddr(yr, 0), DType::F32, &[1, elements]),
        }))
        .wait(input_in, 1)
        .signal(copied, 1),
    );
    b.push(
        0,
        sp,
        Instruction::new(Op::DmaDescriptors(op::DmaDescriptors {
            table: dy,
            count: 1,
        }))
        .wait(copied, 1),
    );
    b.push(
        0,
        sp,
        Instruction::new(Op::Notify(op::Notify {
            subtype: CUSTOM_SUBTYPE_TENSOR,
            sub_id: CUSTOM_SUB_ID_OUTPUT_DONE,
            payload: y,
        })),
    );
    b.build().encode()
}
