//! Injected faults (hangs, dropped notifications, error kinds) seen through the device
//! contract: the records and error causes they leave, and the recovery after them.

mod common;

use common::*;
use nrt_hal::wire::cause;
use nrt_hal::{Device, Engine, ErrorSubtype, NqRecord, RecordKind};
use nrt_sim::testkit::DirectDriver;
use nrt_sim::{FaultKind, FaultSpec, SimConfig, SoftDevice};
use std::time::Duration;

fn run_with_fault(
    kind: FaultKind,
    engine: Option<Engine>,
) -> (Vec<NqRecord>, u32, u32, Vec<NqRecord>) {
    let dev = SoftDevice::new(SimConfig {
        memory_bytes: 1 << 30,
        hang_watchdog: Duration::from_millis(20),
        ..SimConfig::default()
    })
    .unwrap();
    let mut d = DirectDriver::new(&dev, 0).unwrap();
    let blocks = d.empty_blocks().unwrap();
    let mut spec = FaultSpec::new(kind);
    if let Some(e) = engine {
        spec = spec.on_engine(e);
    }
    dev.inject(spec).unwrap();
    d.stage(blocks, 1, 0, 0, 1);
    d.doorbell().unwrap();
    // Wait until the device finished, failed or timed out the execution; a fixed wait (it was
    // 300 ms) can end first on a machine whose CPUs are shared.
    let mut recs = Vec::new();
    wait_until_done(&dev, 1);
    d.drain(&mut recs);
    let c = d.cause();
    let dropped: u32 = Engine::ALL.iter().map(|&e| d.dropped(e)).sum();
    dev.interrupt_cause_clear(0, c).unwrap();
    if kind == FaultKind::Fatal {
        // A wedged core takes nothing until reset.
        d.stage(blocks, 2, 0, 0, 1);
        d.doorbell().unwrap();
        wait_until_done(&dev, 2); // the device took request 2 and is idle again
        let mut none = Vec::new();
        d.drain(&mut none);
        assert!(
            none.iter().all(|r| r.compute_idx != 2),
            "wedged core ran a request: {none:?}"
        );
        dev.nc_reset(0).unwrap();
    }
    // The next execution on the same core succeeds.
    d.stage(blocks, 3, 0, 0, 1);
    d.doorbell().unwrap();
    let next = d.wait_for_ends(5, T);
    (recs, c, dropped, next)
}

fn assert_clean(next: &[NqRecord]) {
    let ends: Vec<_> = kinds(next, RecordKind::End)
        .into_iter()
        .filter(|(i, _)| *i == 3)
        .collect();
    assert_eq!(ends.len(), 5, "next execution did not complete: {next:?}");
    assert!(
        next.iter()
            .all(|r| r.record_kind() != Some(RecordKind::Error)),
        "{next:?}"
    );
}

#[test]
fn fault_hang_sets_cause_bit_29_and_recovers() {
    let (recs, c, _, next) = run_with_fault(FaultKind::Hang, Some(Engine::Act));
    assert!(c & cause::EXEC_TIMEOUT != 0, "cause {c:#x}");
    assert!(c & cause::NQ_OVERFLOW == 0, "cause {c:#x}");
    let ends = kinds(&recs, RecordKind::End);
    assert_eq!(
        ends.len(),
        4,
        "every engine but the hung one ends: {ends:?}"
    );
    assert!(!ends.iter().any(|(_, e)| *e == Engine::Act as u8));
    assert!(errors(&recs).is_empty());
    assert_clean(&next);
}

#[test]
fn fault_dropped_notifications_count_overflow_and_recover() {
    let (recs, c, dropped, next) = run_with_fault(FaultKind::DropNotifications, Some(Engine::Pool));
    assert!(
        c & cause::NQ_OVERFLOW != 0 && c & cause::EXEC_TIMEOUT == 0,
        "cause {c:#x}"
    );
    assert_eq!(dropped, 2, "START and END of POOL were dropped");
    assert_eq!(kinds(&recs, RecordKind::End).len(), 4);
    assert_clean(&next);
}

#[test]
fn fault_records_for_each_error_kind() {
    let cases = [
        (FaultKind::Nan, ErrorSubtype::Numerical, false),
        (FaultKind::Transient, ErrorSubtype::Transient, false),
        (FaultKind::Parity, ErrorSubtype::Uncorrectable, true),
        (FaultKind::DmaAbort, ErrorSubtype::DmaAbort, true),
        (
            FaultKind::HbmUncorrectable,
            ErrorSubtype::HbmUncorrectable,
            true,
        ),
        (FaultKind::Fatal, ErrorSubtype::Fatal, true),
    ];
    for (kind, sub, aborts) in cases {
        let (recs, c, _, next) = run_with_fault(kind, None);
        let errs = errors(&recs);
        assert_eq!(
            errs,
            vec![(sub as u8, kind.default_engine() as u8)],
            "{kind:?}: {recs:?}"
        );
        assert!(c & cause::ERROR_NOTIFICATION != 0, "{kind:?} cause {c:#x}");
        assert_eq!(
            c & cause::FATAL != 0,
            kind == FaultKind::Fatal,
            "{kind:?} cause {c:#x}"
        );
        assert_eq!(c & cause::EXEC_TIMEOUT, 0, "{kind:?} cause {c:#x}");
        let ends = kinds(&recs, RecordKind::End).len();
        if aborts {
            assert!(ends < 5, "{kind:?} aborted but all engines ended");
        } else {
            assert_eq!(ends, 5, "{kind:?} completes");
        }
        assert_clean(&next);
    }
}
