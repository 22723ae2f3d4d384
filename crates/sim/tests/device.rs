//! The software NeuronCore seen through the device contract only: doorbells, semaphores,
//! operand checks, parking, resets, predication, the instruction timeline and the presets.

mod common;

use common::*;
use nrt_hal::{Device, Engine, ErrorSubtype, HalError, NqRecord, RecordKind};
use nrt_isa::op;
use nrt_isa::{Instruction, Op, SemRef};
use nrt_sim::testkit::DirectDriver;
use nrt_sim::{SimConfig, SoftDevice};
use std::time::{Duration, Instant};

/// Per engine: the (kind, compute_idx) sequence seen on its ring.
fn per_engine(recs: &[NqRecord], e: Engine) -> Vec<(u8, u32)> {
    recs.iter()
        .filter(|r| r.engine == e as u8 && r.kind != RecordKind::Error as u8)
        .map(|r| (r.kind, r.compute_idx))
        .collect()
}

#[test]
fn two_requests_staged_back_to_back_one_doorbell() {
    let dev = device();
    let mut d = DirectDriver::new(&dev, 0).unwrap();
    let blocks = d.empty_blocks().unwrap();
    assert!(d.stage(blocks, 7, 0, 0, 1));
    assert!(d.stage(blocks, 8, 0, 0, 1));
    // Nothing runs before the doorbell.
    std::thread::sleep(Duration::from_millis(20));
    let mut early = Vec::new();
    d.drain(&mut early);
    assert!(
        early.is_empty(),
        "device ran before the doorbell: {early:?}"
    );
    d.doorbell().unwrap();
    let recs = d.wait_for_ends(10, T);
    for e in Engine::ALL {
        let s = RecordKind::Start as u8;
        let n = RecordKind::End as u8;
        assert_eq!(
            per_engine(&recs, e),
            vec![(s, 7), (n, 7), (s, 8), (n, 8)],
            "engine {e}"
        );
    }
    assert_eq!(dev.executions(0).unwrap(), 2);
}

#[test]
fn spurious_and_merged_doorbells_are_harmless() {
    let dev = device();
    let mut d = DirectDriver::new(&dev, 0).unwrap();
    let blocks = d.empty_blocks().unwrap();
    d.doorbell().unwrap(); // nothing staged
    d.doorbell().unwrap();
    for i in 0..3 {
        d.stage(blocks, i, 0, 0, 1);
    }
    d.doorbell().unwrap();
    d.doorbell().unwrap(); // merged with the previous one
    let recs = d.wait_for_ends(15, T);
    assert_eq!(kinds(&recs, RecordKind::End).len(), 15);
    std::thread::sleep(Duration::from_millis(10));
    let mut more = Vec::new();
    d.drain(&mut more);
    assert!(
        more.is_empty(),
        "extra records after a spurious doorbell: {more:?}"
    );
    assert_eq!(dev.executions(0).unwrap(), 3);
}

#[test]
fn engines_synchronize_through_semaphores_and_notify() {
    let dev = device();
    let mut d = DirectDriver::new(&dev, 0).unwrap();
    let sem = SemRef::local(10);
    // SP waits for PE's signal, then emits a custom record naming var_id 3.
    let pe = d
        .load_block(&[Instruction::new(Op::Nop(op::Nop)).signal(sem, 1)])
        .unwrap();
    let sp = d
        .load_block(&[Instruction::new(Op::Notify(op::Notify {
            subtype: 6,
            sub_id: 7,
            payload: 3,
        }))
        .wait(sem, 1)])
        .unwrap();
    let end = d.load_block(&[]).unwrap();
    for i in 0..3 {
        d.stage([pe, end, end, end, sp], i, 0, 0, 1);
        d.doorbell().unwrap();
        let recs = d.wait_for_ends(5, T);
        let custom: Vec<_> = recs
            .iter()
            .filter(|r| r.record_kind() == Some(RecordKind::Custom))
            .collect();
        assert_eq!(custom.len(), 1, "{recs:?}");
        assert_eq!(
            (
                custom[0].subtype,
                custom[0].sub_id,
                custom[0].payload,
                custom[0].compute_idx
            ),
            (6, 7, 3, i)
        );
        // Semaphores count per execution: the wait for value 1 must not pass from the previous
        // execution's signal, and must not deadlock either.
        assert_eq!(kinds(&recs, RecordKind::End).len(), 5);
    }
}

#[test]
fn bad_dma_trigger_is_a_dma_abort_not_a_crash() {
    let dev = device();
    let mut d = DirectDriver::new(&dev, 0).unwrap();
    let blocks = d.empty_blocks().unwrap();
    // A descriptor table pointing far outside device memory.
    let table = d.load_block(&[]).unwrap(); // any allocated address
    let bogus = nrt_hal::TriggerPair::new(nrt_hal::DmaKind::Data, 1 << 50, table, 64, 0);
    dev.copy_in(table, &bogus.to_bytes()).unwrap();
    let sp = d
        .load_block(&[Instruction::new(Op::DmaDescriptors(op::DmaDescriptors {
            table,
            count: 1,
        }))])
        .unwrap();
    let mut b = blocks;
    b[Engine::Sp.index()] = sp;
    d.stage(b, 1, 0, 0, 1);
    d.doorbell().unwrap();
    let t0 = Instant::now();
    let mut recs = Vec::new();
    while errors(&recs).is_empty() && t0.elapsed() < T {
        d.drain(&mut recs);
    }
    assert_eq!(
        errors(&recs),
        vec![(ErrorSubtype::DmaAbort as u8, Engine::Sp as u8)]
    );
}

#[test]
fn instruction_operand_outside_memory_is_rejected_by_the_device() {
    let dev = device();
    let mut d = DirectDriver::new(&dev, 0).unwrap();
    let blocks = d.empty_blocks().unwrap();
    let fill = Instruction::new(Op::Fill(op::Fill {
        out: nrt_isa::AccessPattern::dense(1 << 40, nrt_hal::DType::F32, &[4]),
        bits: 0,
    }));
    let dve = d.load_block(&[fill]).unwrap();
    let mut b = blocks;
    b[Engine::Dve.index()] = dve;
    d.stage(b, 1, 0, 0, 1);
    d.doorbell().unwrap();
    let t0 = Instant::now();
    let mut recs = Vec::new();
    while errors(&recs).is_empty() && t0.elapsed() < T {
        d.drain(&mut recs);
    }
    assert_eq!(
        errors(&recs),
        vec![(ErrorSubtype::InvalidInstruction as u8, Engine::Dve as u8)]
    );
}

/// D1: an operand whose byte extent (~2^64 bytes) overflowed `i64` wrapped into range, passed
/// the device's operand check and made `kernels::copy::fill` write out of bounds (SIGSEGV).
/// The device must reject it when it decodes the block, for a DVE fill and an SP DMA alike.
#[test]
fn d1_device_rejects_operand_with_huge_stride() {
    let dev = device();
    let mut d = DirectDriver::new(&dev, 0).unwrap();
    let blocks = d.empty_blocks().unwrap();
    let area = dev.mem_alloc(64, 64).unwrap();
    let huge = nrt_isa::AccessPattern {
        addr: area,
        dtype: nrt_hal::DType::F32,
        shape: [1, 1, 1, 1 << 31],
        stride: [0, 0, 0, i32::MAX],
    };
    for (engine, op) in [
        (Engine::Dve, Op::Fill(op::Fill { out: huge, bits: 0 })),
        (
            Engine::Sp,
            Op::DmaCopy(op::DmaCopy {
                src: huge,
                dst: huge,
            }),
        ),
    ] {
        let blk = d.load_block(&[Instruction::new(op)]).unwrap();
        let mut b = blocks;
        b[engine.index()] = blk;
        d.stage(b, 1, 0, 0, 1);
        d.doorbell().unwrap();
        let t0 = Instant::now();
        let mut recs = Vec::new();
        while errors(&recs).is_empty() && t0.elapsed() < T {
            d.drain(&mut recs);
        }
        assert_eq!(
            errors(&recs),
            vec![(ErrorSubtype::InvalidInstruction as u8, engine as u8)],
            "{engine}"
        );
    }
}

#[test]
fn host_side_bad_arguments_name_the_culprit() {
    let dev = device();
    assert_eq!(
        dev.copy_in(1 << 20, &[0; 4]),
        Err(HalError::BadAddress {
            addr: 1 << 20,
            len: 4
        })
    );
    assert_eq!(dev.semaphore_increment(9, 0, 1), Err(HalError::BadCore(9)));
    assert_eq!(
        dev.semaphore_increment(0, 999, 1),
        Err(HalError::BadSemaphore(999))
    );
    let a = dev.mem_alloc(64, 64).unwrap();
    dev.mem_free(a).unwrap();
    assert_eq!(dev.mem_free(a), Err(HalError::NotAllocated(a)));
    let _d = DirectDriver::new(&dev, 1).unwrap();
    assert!(
        matches!(DirectDriver::new(&dev, 1), Err(HalError::BadQueue(_))),
        "double setup of core 1"
    );
}

#[test]
fn idle_device_parks() {
    let dev = device();
    let mut d = DirectDriver::new(&dev, 0).unwrap();
    let blocks = d.empty_blocks().unwrap();
    d.stage(blocks, 0, 0, 0, 1);
    d.doorbell().unwrap();
    d.wait_for_ends(5, T);
    let t0 = Instant::now();
    while !dev.is_parked() && t0.elapsed() < T {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        dev.is_parked(),
        "device thread still spinning after the spin window"
    );
    // And a doorbell wakes it.
    d.stage(blocks, 1, 0, 0, 1);
    d.doorbell().unwrap();
    assert_eq!(kinds(&d.wait_for_ends(5, T), RecordKind::End).len(), 5);
}

/// A reset while the host has triggers staged that the device has not run yet (a device
/// thread that lags, as under a co-tenant): the reset runs their copies and skips their
/// requests, so the exec ring's tail word keeps up with the host and the next request after
/// the reset runs alone. Dropping them left the tail word behind: the core then ran the
/// stale slots in between (seen as a lockstep execution timing out after `nrt_reset_vnc`).
#[test]
fn reset_with_triggers_not_yet_run_keeps_the_exec_ring_consistent() {
    let dev = device();
    let mut d = DirectDriver::new(&dev, 0).unwrap();
    let blocks = d.empty_blocks().unwrap();
    // Let the device thread park: it looks at the trigger queue again only on a doorbell.
    wait_until_done(&dev, 0);
    assert!(d.stage(blocks, 7, 0, 0, 1), "staged, no doorbell");
    dev.nc_reset(0).unwrap();
    d.stage(blocks, 8, 0, 0, 1);
    d.doorbell().unwrap();
    let recs = d.wait_for_ends(5, T);
    wait_until_done(&dev, 1);
    let mut rest = Vec::new();
    d.drain(&mut rest);
    let all: Vec<_> = recs.iter().chain(&rest).copied().collect();
    assert!(errors(&all).is_empty(), "errors after the reset: {all:?}");
    assert!(
        all.iter().all(|r| r.compute_idx == 8),
        "only the request after the reset runs: {all:?}"
    );
    assert_eq!(kinds(&all, RecordKind::End).len(), 5);
    assert_eq!(
        dev.executions(0).unwrap(),
        1,
        "the skipped request never ran"
    );
}

/// Predication (NCM 1.6): behind a failing `Guard`, an engine's instructions only
/// synchronize — a Fill writes nothing and a Gather of index 100 of 4 rows does not fault,
/// yet their signals still count, so the engine waiting on them goes on; a lifted guard runs
/// what follows. With the condition the other way the same block runs them (the Gather, of
/// an index in range then, copies its row).
#[test]
fn a_failing_guard_leaves_only_the_synchronization() {
    use nrt_hal::DType;
    use nrt_isa::AccessPattern;
    let dev = device();
    let mut d = DirectDriver::new(&dev, 0).unwrap();
    let mem = dev.mem_alloc(4096, 64).unwrap();
    let (cond, a, b, data, idx, gathered) =
        (mem, mem + 64, mem + 128, mem + 192, mem + 256, mem + 320);
    dev.copy_in(data, &5.0f32.to_le_bytes()).unwrap();
    let sem = SemRef::local(10);
    let fill = |at: u64, v: f32| {
        Op::Fill(op::Fill {
            out: AccessPattern::dense(at, DType::F32, &[4]),
            bits: v.to_bits() as u64,
        })
    };
    // POOL: under `cond == 0`, fill A (which SP waits for) and gather; then, lifted, fill B.
    let pool = d
        .load_block(&[
            Instruction::new(Op::Guard(op::Guard {
                cond: Some(AccessPattern::dense(cond, DType::Bool, &[1])),
                when: false,
            })),
            Instruction::new(fill(a, 1.0)).signal(sem, 1),
            Instruction::new(Op::Gather(op::Gather {
                data: AccessPattern::dense(data, DType::F32, &[1, 1, 4, 1]),
                indices: AccessPattern::dense(idx, DType::I64, &[1, 1, 1, 1]),
                output: AccessPattern::dense(gathered, DType::F32, &[1, 1, 1, 1]),
            })),
            Instruction::new(Op::Guard(op::Guard {
                cond: None,
                when: false,
            })),
            Instruction::new(fill(b, 2.0)),
        ])
        .unwrap();
    let sp = d
        .load_block(&[Instruction::new(Op::Notify(op::Notify {
            subtype: 6,
            sub_id: 7,
            payload: 3,
        }))
        .wait(sem, 1)])
        .unwrap();
    let end = d.load_block(&[]).unwrap();
    let read = |at: u64| {
        let mut x = [0u8; 4];
        dev.copy_out(at, &mut x).unwrap();
        f32::from_le_bytes(x)
    };
    for (i, (c, index)) in [(1u8, 100i64), (0, 0)].into_iter().enumerate() {
        dev.copy_in(cond, &[c]).unwrap();
        dev.copy_in(idx, &index.to_le_bytes()).unwrap();
        dev.memset(a, 0, 128).unwrap();
        dev.memset(gathered, 0, 4).unwrap();
        d.stage([end, end, pool, end, sp], i as u32, 0, 0, 1);
        d.doorbell().unwrap();
        let recs = d.wait_for_ends(5, T);
        assert_eq!(errors(&recs), vec![], "cond {c}");
        let custom = recs
            .iter()
            .filter(|r| r.record_kind() == Some(RecordKind::Custom))
            .count();
        assert_eq!(
            custom, 1,
            "cond {c}: SP's wait on the guarded signal: {recs:?}"
        );
        assert_eq!(read(b), 2.0, "cond {c}: the lifted guard runs the fill");
        let ran = c == 0;
        assert_eq!(
            read(a),
            if ran { 1.0 } else { 0.0 },
            "cond {c}: the guarded fill"
        );
        assert_eq!(
            read(gathered),
            if ran { 5.0 } else { 0.0 },
            "cond {c}: the gather"
        );
    }
}

/// The instruction timeline: with room reserved, a traced execution (`exec_flags::TRACE`)
/// leaves one event per compute instruction — on its engine, with its pc, in order, inside
/// the execution's device time — and none for sync-only instructions; an untraced execution
/// leaves none; a full room records no more (no allocation while executing); no room, none.
#[test]
fn instruction_timeline_records_traced_compute_instructions_within_its_room() {
    let dev = device();
    let mut d = DirectDriver::new(&dev, 0).unwrap();
    let area = dev.mem_alloc(4096, 64).unwrap();
    let fill = |at: u64| {
        Instruction::new(Op::Fill(op::Fill {
            out: nrt_isa::AccessPattern::dense(area + at, nrt_hal::DType::F32, &[64]),
            bits: u64::from(1.0f32.to_bits()),
        }))
    };
    // DVE: Fill, Nop (sync only), Fill, End.
    let dve = d
        .load_block(&[
            fill(0),
            Instruction::new(Op::Nop(op::Nop)),
            fill(256),
            Instruction::new(Op::End(op::End)),
        ])
        .unwrap();
    let mut b = d.empty_blocks().unwrap();
    b[Engine::Dve.index()] = dve;
    let run = |d: &mut DirectDriver, idx: u32, flags: u16| {
        let before = dev.clock_ns();
        assert!(d.stage(b, idx, flags, 0, 1));
        d.doorbell().unwrap();
        let ends = d.wait_for_ends(5, T);
        assert_eq!(kinds(&ends, RecordKind::End).len(), 5, "{ends:?}");
        (before, dev.clock_ns())
    };
    let trace = nrt_hal::wire::exec_flags::TRACE;
    // No room (the default): nothing, traced or not.
    run(&mut d, 1, trace);
    assert!(dev.instruction_events().is_empty());

    dev.record_instructions(3).unwrap();
    run(&mut d, 2, 0);
    assert!(
        dev.instruction_events().is_empty(),
        "an untraced execution records nothing"
    );
    let (t0, t1) = run(&mut d, 3, trace);
    let ev = dev.instruction_events();
    assert_eq!(ev.len(), 2, "the two Fills, not the Nop: {ev:?}");
    for (e, pc) in ev.iter().zip([0u32, 2]) {
        assert_eq!(
            (e.core, e.engine, e.exec_idx, e.pc, e.op),
            (0, Engine::Dve, 3, pc, "Fill")
        );
        assert!(
            t0 <= e.start_ns && e.start_ns <= e.end_ns && e.end_ns <= t1,
            "{e:?}"
        );
    }
    assert!(ev[0].end_ns <= ev[1].start_ns, "in the order they ran");
    // Two more executions: room for 3 events in all, the first two were taken: 3 more fit.
    run(&mut d, 4, trace);
    run(&mut d, 5, trace);
    let ev = dev.instruction_events();
    assert_eq!(
        ev.iter().map(|e| (e.exec_idx, e.pc)).collect::<Vec<_>>(),
        vec![(4, 0), (4, 2), (5, 0)],
        "a full room records no more"
    );
    dev.record_instructions(0).unwrap();
    run(&mut d, 6, trace);
    assert!(dev.instruction_events().is_empty(), "room 0 turns it off");
}

#[test]
fn every_listed_instance_preset_starts_a_device() {
    // trn2.48xlarge (128 cores) was refused by a 64-core limit of the device while the host
    // shape allowed 256 (issue 54, S12).
    for &(name, ..) in nrt_sim::host::PRESETS {
        let shape = nrt_sim::HostShape::preset(name).unwrap();
        let dev =
            SoftDevice::new(SimConfig::for_host(&shape)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(dev.info().num_cores, shape.total_cores(), "{name}");
    }
}
