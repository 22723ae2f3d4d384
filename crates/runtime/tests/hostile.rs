//! Hostile models through the whole load path (decode, validate, place, device): each is
//! refused with a status and a message naming the culprit — never a crash.

mod common;

use common::*;
use nrt_hal::{DType, Engine, NrtStatus};
use nrt_isa::op;
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
            Op::Fill(op::Fill { out: huge, bits: 0 })
        } else {
            Op::DmaCopy(op::DmaCopy {
                src: huge,
                dst: huge,
            })
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

/// NCM 1.4's instructions with hostile operands: an output bound past its plan entry, a
/// `Unique` shape template that disagrees with its operands, a `NonZero` output that is not
/// `[1, 1, rank, elements]`, a `RoiAlign` sampling grid past its cap, `DeformIm2col` offsets
/// that do not match its kernel. Each load fails with `NRT_INVALID` naming
/// the instruction and the field — nothing reaches a kernel.
#[test]
fn hostile_data_dependent_instructions_are_rejected_at_load() {
    let (_dev, rt) = runtime();
    fn dense(addr: u64, dtype: DType, shape: [u32; 4]) -> AccessPattern {
        AccessPattern {
            addr,
            dtype,
            shape,
            stride: nrt_isa::dense_strides(&shape),
        }
    }
    type Case = (&'static str, Box<dyn Fn(u64) -> Op>, &'static str);
    let cases: Vec<Case> = vec![
        (
            "nms selected past its plan entry",
            Box::new(|t| {
                Op::NonMaxSuppression(op::NonMaxSuppression {
                    boxes: dense(t, DType::F32, [1, 1, 4, 4]),
                    scores: dense(t, DType::F32, [1, 1, 1, 4]),
                    max_out: None,
                    iou: None,
                    score_threshold: None,
                    selected: dense(t, DType::I64, [1, 1, 1 << 20, 3]),
                    shape: dense(t, DType::I64, [1, 1, 1, 2]),
                    flags: 0,
                    max_out_const: 4,
                    iou_const: 0.5,
                    score_const: 0.0,
                })
            }),
            "plan entry",
        ),
        (
            "unique template disagreeing with its input",
            Box::new(|t| {
                Op::Unique(op::Unique {
                    input: dense(t, DType::F32, [1, 2, 3, 1]),
                    y: dense(t, DType::F32, [1, 2, 3, 1]),
                    indices: dense(t, DType::I64, [1, 1, 1, 3]),
                    inverse: dense(t, DType::I64, [1, 1, 1, 3]),
                    counts: dense(t, DType::I64, [1, 1, 1, 3]),
                    shape: dense(t, DType::I64, [1, 1, 1, 2]),
                    dims: nrt_isa::ShapeTemplate {
                        rank: 2,
                        axis: 1,
                        dims: [2, 300, 0, 0, 0, 0, 0, 0],
                    },
                    sorted: true,
                })
            }),
            "dims",
        ),
        (
            "non-zero output not [1, 1, rank, elements]",
            Box::new(|t| {
                Op::NonZero(op::NonZero {
                    input: dense(t, DType::F32, [1, 1, 2, 3]),
                    output: dense(t, DType::I64, [1, 1, 2, 5]),
                    shape: dense(t, DType::I64, [1, 1, 1, 2]),
                })
            }),
            "output.shape",
        ),
        (
            "roi align with a sampling grid past its cap",
            Box::new(|t| {
                Op::RoiAlign(op::RoiAlign {
                    input: dense(t, DType::F32, [1, 1, 4, 4]),
                    rois: dense(t, DType::F32, [1, 1, 1, 4]),
                    batch_indices: dense(t, DType::I64, [1, 1, 1, 1]),
                    output: dense(t, DType::F32, [1, 1, 2, 2]),
                    spatial_scale: 1.0,
                    sampling_ratio: u32::MAX,
                    flags: 0,
                })
            }),
            "sampling_ratio",
        ),
        (
            "deform im2col whose offsets do not match its kernel",
            Box::new(|t| {
                Op::DeformIm2col(op::DeformIm2col {
                    input: dense(t, DType::F32, [1, 2, 4, 4]),
                    offset: dense(t, DType::F32, [1, 7, 3, 3]),
                    mask: None,
                    cols: dense(t, DType::F32, [1, 8, 3, 3]),
                    window: nrt_isa::Window {
                        kernel: [2, 2],
                        stride: [1, 1],
                        pad: [0, 0, 0, 0],
                        dilation: [1, 1],
                    },
                    offset_groups: 1,
                })
            }),
            "offset.shape",
        ),
    ];
    for (what, op, field) in cases {
        let mut b = ModelBuilder::new("dyn", 1);
        let tmp = b.scratch(0, 4096, 64);
        b.push(0, Engine::Pool, Instruction::new(op(vaddr(tmp, 0))));
        let e = rt
            .load(&b.build().encode(), 0, &quick_timeout())
            .unwrap_err();
        assert_eq!(e.status, NrtStatus::Invalid, "{what}: {e:?}");
        assert!(
            e.message.contains("instruction 0") && e.message.contains(field),
            "{what}: {}",
            e.message
        );
    }
}

/// Work and scratch with no memory behind them: a Softmax over 2^32 − 1 elements whose
/// input and output are one element each (stride 0) ran for about a minute — past its
/// 300 ms timeout — and sized an infallible 16 GiB row buffer from the file. Now a written
/// view that repeats elements, and a broadcast read larger than both 2^32 and the
/// instruction's output, fail the load with `NRT_INVALID` naming the instruction and the
/// operand.
#[test]
fn views_that_repeat_elements_past_their_bounds_fail_load() {
    let (_dev, rt) = runtime();
    fn one(addr: u64, shape: [u32; 4]) -> AccessPattern {
        AccessPattern {
            addr,
            dtype: DType::F32,
            shape,
            stride: [0; 4],
        }
    }
    type Case = (
        &'static str,
        Engine,
        Box<dyn Fn(u64) -> Op>,
        &'static str,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (
            "softmax over a stride-0 row of 2^32 - 1",
            Engine::Pool,
            Box::new(|t| {
                Op::Softmax(op::Softmax {
                    input: one(t, [1, 1, 1, u32::MAX]),
                    output: one(t + 64, [1, 1, 1, u32::MAX]),
                    log: false,
                })
            }),
            "`output`",
            "written view repeats elements",
        ),
        (
            "a sum over 2^33 broadcast elements into one",
            Engine::Pool,
            Box::new(|t| {
                Op::Reduce(op::Reduce {
                    input: one(t, [1, 1, 1 << 16, 1 << 17]),
                    output: AccessPattern::dense(t + 64, DType::F32, &[1, 1, 1, 1]),
                    op: nrt_isa::ReduceOp::Sum,
                    axes: 0b1100,
                })
            }),
            "`input`",
            "more than 4294967296",
        ),
    ];
    for (what, engine, op, field, why) in cases {
        let mut b = ModelBuilder::new("repeat", 1);
        let tmp = b.scratch(0, 4096, 64);
        b.push(0, engine, Instruction::new(op(vaddr(tmp, 0))));
        let e = rt
            .load(&b.build().encode(), 0, &quick_timeout())
            .unwrap_err();
        assert_eq!(e.status, NrtStatus::Invalid, "{what}: {e:?}");
        for part in ["instruction 0", field, why] {
            assert!(e.message.contains(part), "{what}: {}", e.message);
        }
    }
}

/// A MatMul whose bf16 B is one element broadcast over `[2^16, 2^15]` (2^31 elements: within
/// the load-time bound on broadcast reads). The kernel's f32 copy of B would be 8 GiB, past
/// the workspace's bound (`KERNEL_SCRATCH_MAX_BYTES`, 4 GiB): the execution fails with
/// `NRT_EXEC_BAD_INPUT` before anything is allocated — the process neither aborts nor
/// grows — and the device goes on to run the next model.
#[test]
fn an_instruction_whose_scratch_is_past_the_bound_fails_its_execution() {
    let (_dev, rt) = runtime();
    let (k, n) = (1u32 << 16, 1u32 << 15);
    let mut b = ModelBuilder::new("scratch", 1);
    let tmp = b.scratch(0, 1 << 20, 64);
    let w = AccessPattern {
        addr: vaddr(tmp, 0),
        dtype: DType::Bf16,
        shape: [1, 1, k, n],
        stride: [0; 4],
    };
    let a = AccessPattern::dense(vaddr(tmp, 64), DType::F32, &[1, k]);
    let c = AccessPattern::dense(vaddr(tmp, 64 + 4 * k as u64), DType::F32, &[1, n]);
    b.push(
        0,
        Engine::Pe,
        Instruction::new(Op::MatMul(op::MatMul {
            a,
            b: w,
            c,
            alpha: 1.0,
            flags: 0,
            epilogue: nrt_isa::Epilogue::NONE,
        })),
    );
    let m = rt.load(&b.build().encode(), 0, &quick_timeout()).unwrap();
    let none = nrt_runtime::TensorSet::new();
    let e = rt.execute(&m, &none, &none).unwrap_err();
    assert_eq!(e.status, NrtStatus::ExecBadInput, "{e:?}");

    // The device runs the next model.
    let mut b = ModelBuilder::new("fill", 1);
    let y = b.output("y", DType::F32, &[4]);
    let (yr, dy) = (b.io_mem_ref(y), b.io_descriptor(y));
    let filled = nrt_isa::SemRef::local(4);
    b.push(
        0,
        Engine::Dve,
        Instruction::new(Op::Fill(op::Fill {
            out: AccessPattern::dense(vaddr(yr, 0), DType::F32, &[4]),
            bits: u64::from(2.5f32.to_bits()),
        }))
        .signal(filled, 1),
    );
    b.push(
        0,
        Engine::Sp,
        Instruction::new(Op::DmaDescriptors(op::DmaDescriptors {
            table: dy,
            count: 1,
        }))
        .wait(filled, 1),
    );
    let m2 = rt.load(&b.build().encode(), 0, &quick_timeout()).unwrap();
    let (ins, outs, all) = tensors(&rt, &m2, nrt_runtime::Placement::Device);
    rt.execute(&m2, &ins, &outs).unwrap();
    assert_eq!(read_f32(&all[0]), [2.5; 4]);
}

/// An instruction that computes past the execution's deadline (a product of broadcast
/// operands: 2^35 multiply-adds from a few bytes, within the load-time bounds, a second or
/// more on this machine): the waiter gets `NRT_TIMEOUT` at its 300 ms deadline — the core is
/// busy, which the device reports as cause bit 29 — not `NRT_EXEC_SW_NQ_OVERFLOW` (which
/// it got before: only a hung engine's watchdog raised the bit, and a thread inside a kernel
/// cannot).
#[test]
fn an_instruction_that_computes_past_the_deadline_times_out() {
    let (dev, rt) = runtime();
    let mut b = ModelBuilder::new("long", 1);
    let tmp = b.scratch(0, 1 << 16, 64);
    let k = 1u32 << 25;
    let broadcast = |shape| AccessPattern {
        addr: vaddr(tmp, 0),
        dtype: DType::F32,
        shape,
        stride: [0; 4],
    };
    b.push(
        0,
        Engine::Pe,
        Instruction::new(Op::MatMul(op::MatMul {
            a: broadcast([1, 1, 64, k]),
            b: broadcast([1, 1, k, 16]),
            c: AccessPattern::dense(vaddr(tmp, 64), DType::F32, &[64, 16]),
            alpha: 1.0,
            flags: 0,
            epilogue: nrt_isa::Epilogue::NONE,
        })),
    );
    let m = rt.load(&b.build().encode(), 0, &quick_timeout()).unwrap();
    // Submitted on the explicit surface, and waited for once the device thread runs it: a
    // waiter whose device thread is off its vCPU (a busy co-tenant, the other tests of this
    // binary) lends itself to the core and would run the product in its own thread — then
    // the execution simply finishes late, with its result.
    let none = nrt_runtime::TensorSet::new();
    let before = dev.executions(0).unwrap();
    let seq = rt.execute_schedule(&m, &none, &none).unwrap();
    wait_until_taken(&dev, 0, before);
    let t0 = std::time::Instant::now();
    let status = rt.wait(seq).unwrap();
    assert_eq!(status, NrtStatus::Timeout, "after {:?}", t0.elapsed());
}

/// Issue 54 S22: a completion descriptor must be an eventfd. A pipe was accepted, and once
/// full, signalling blocked the harvest forever in `write(2)`; an unopened descriptor was
/// accepted as well.
#[test]
fn s22_completion_descriptors_must_be_eventfds() {
    use nrt_runtime::XuKind;
    let (_dev, rt) = runtime();
    let mut pipe = [0i32; 2];
    // SAFETY: pipe writes two descriptors into the array.
    assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
    let e = rt
        .register_xu_eventfd(0, XuKind::Compute, 0, pipe[1])
        .unwrap_err();
    assert_eq!(e.status, NrtStatus::Invalid);
    assert!(e.message.contains("not an eventfd"), "{e}");
    let e = rt
        .register_xu_eventfd(0, XuKind::Compute, 0, 1_000_000)
        .unwrap_err();
    assert!(e.message.contains("not open"), "{e}");
    // SAFETY: eventfd returns a new descriptor or -1 (checked).
    let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    assert!(efd >= 0);
    rt.register_xu_eventfd(0, XuKind::Compute, 0, efd).unwrap();
    rt.register_xu_eventfd(0, XuKind::Compute, 0, -1).unwrap();
    // SAFETY: closing descriptors this test opened.
    unsafe {
        libc::close(efd);
        libc::close(pipe[0]);
        libc::close(pipe[1]);
    }
}
