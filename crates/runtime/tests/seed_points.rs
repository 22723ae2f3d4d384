//! Two points of the seed (`hot-inference-path.md`) that the rest of the suite exercised only
//! in passing, each pinned by a test of its own (issue 47 §3):
//!
//! - the inverted exec mode: the fork computes `async_exec_workers == NULL ? 1 : 0`, so the
//!   synchronous path binds in mode 1 — the seed's `EXPLICIT_ASYNC` label — and clones host
//!   tensors, while the async paths refuse them. Ours is [`BindMode`], named for what the
//!   bind does with host tensors;
//! - `NRTA_SEQ_NUM_MAX`: the seed reads 0xFFFFFFFFFFFE from `xuq_client_submit`, the public
//!   `nrt_async.h` defines `(1ull << 48) - 1`. We follow the header: 2^48 − 1 is the last
//!   sequence number a compute XU issues, and the submission after it is refused
//!   (`NRT_RESOURCE`), never wrapped.

mod common;
use common::*;
use nrt_hal::{NRTA_SEQ_NUM_MAX, NrtStatus};
use nrt_runtime::builtin::near_null;
use nrt_runtime::{BindMode, LoadOptions, Placement, RuntimeConfig, SeqId, XuKind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

const REFUSAL: &str = "Async exec mode only supports device allocated tensors";

#[test]
fn the_mode_the_bind_receives_clones_host_tensors_on_the_sync_path_only() {
    // The seed's discriminants, inverted: mode 1 (EXPLICIT_ASYNC) is the cloning one.
    assert_eq!(BindMode::CloneHostTensors as u8, 1);
    assert_eq!(BindMode::RefuseHostTensors as u8, 0);

    // No implicit worker pool: `execute` is synchronous, binds in mode 1, clones.
    let (_d, rt) = runtime();
    assert!(!rt.is_implicit_async());
    assert_eq!(rt.bind_mode(), BindMode::CloneHostTensors);
    let m = rt.load(&near_null(1), 0, &LoadOptions::default()).unwrap();
    let (hi, ho, _h) = tensors(&rt, &m, Placement::Host);
    for k in 0..3 {
        let x = [k as f32, -1.5, 2.0, 0.25];
        hi.get("x").unwrap().write(&f32s(&x), 0).unwrap();
        let before = rt.pipeline_counters(0).host_clone_binds;
        rt.execute(&m, &hi, &ho).unwrap();
        assert_eq!(
            rt.pipeline_counters(0).host_clone_binds,
            before + 1,
            "the synchronous bind cloned the host tensors"
        );
        assert_eq!(read_f32(ho.get("y").unwrap()), x, "execution {k}");
    }
    // Device tensors on the same path are bound in place, no clone.
    let (di, dout, _k) = tensors(&rt, &m, Placement::Device);
    let before = rt.pipeline_counters(0).host_clone_binds;
    rt.execute(&m, &di, &dout).unwrap();
    assert_eq!(rt.pipeline_counters(0).host_clone_binds, before);

    // The explicit surface: the seed stores mode 1 for it too, but it refuses host tensors
    // before binding — and ours binds it in RefuseHostTensors.
    let before = rt.pipeline_counters(0);
    let e = rt.execute_schedule(&m, &hi, &ho).unwrap_err();
    assert_eq!(e.status, NrtStatus::Invalid, "{e}");
    assert!(e.message.contains(REFUSAL), "{e}");
    let after = rt.pipeline_counters(0);
    assert_eq!(after.host_clone_binds, before.host_clone_binds);
    assert_eq!(after.publishes, before.publishes, "nothing was staged");

    // With the implicit worker pool: `execute` binds in mode 0 and refuses host tensors.
    let dev = device();
    let rt = runtime_on(
        &dev,
        RuntimeConfig {
            async_inflight: 4,
            ..Default::default()
        },
    );
    let done = Arc::new(AtomicU64::new(0));
    let d = done.clone();
    rt.register_async_callback(Arc::new(move |_, _, _, s| {
        assert_eq!(s, NrtStatus::Success);
        d.fetch_add(1, Ordering::AcqRel);
    }))
    .unwrap();
    assert!(rt.is_implicit_async());
    assert_eq!(rt.bind_mode(), BindMode::RefuseHostTensors);
    let m = rt.load(&near_null(1), 0, &LoadOptions::default()).unwrap();
    let (hi, ho, _h) = tensors(&rt, &m, Placement::Host);
    let before = rt.pipeline_counters(0);
    let e = rt.execute(&m, &hi, &ho).unwrap_err();
    assert_eq!(e.status, NrtStatus::Invalid, "{e}");
    assert!(e.message.contains(REFUSAL), "{e}");
    let after = rt.pipeline_counters(0);
    assert_eq!(after.host_clone_binds, before.host_clone_binds);
    assert_eq!(after.publishes, before.publishes, "nothing was staged");
    // Device tensors go through.
    let (di, dout, _k) = tensors(&rt, &m, Placement::Device);
    di.get("x")
        .unwrap()
        .write(&f32s(&[1.0, 2.0, 3.0, 4.0]), 0)
        .unwrap();
    rt.execute(&m, &di, &dout).unwrap();
    // A read waits for the pending implicit execution.
    assert_eq!(read_f32(dout.get("y").unwrap()), [1.0, 2.0, 3.0, 4.0]);
    assert_eq!(rt.pipeline_counters(0).host_clone_binds, 0);
}

#[test]
fn nrta_seq_num_max_is_the_last_sequence_number_and_the_next_submission_is_refused() {
    // The public header's value, not the seed's 0xFFFFFFFFFFFE.
    assert_eq!(NRTA_SEQ_NUM_MAX, (1 << 48) - 1);
    assert_eq!(NRTA_SEQ_NUM_MAX, 0xFFFF_FFFF_FFFF);

    let (_d, rt) = runtime();
    let m = rt.load(&near_null(1), 0, &LoadOptions::default()).unwrap();
    let (ins, outs, _k) = tensors(&rt, &m, Placement::Device);
    // The hook refuses to go past the maximum.
    assert_eq!(
        rt.fast_forward_compute_xu(0, NRTA_SEQ_NUM_MAX + 1)
            .unwrap_err()
            .status,
        NrtStatus::Invalid
    );
    rt.fast_forward_compute_xu(0, NRTA_SEQ_NUM_MAX - 2).unwrap();
    // vnc 0's compute XU: xu_id = vnc × NRTA_XU_TYPE_NUM + NRTA_XU_COMPUTE.
    let xu = XuKind::Compute as u16;

    // The last two numbers: one synchronous, one explicit, which gets NRTA_SEQ_NUM_MAX.
    rt.execute(&m, &ins, &outs).unwrap();
    assert_eq!(rt.staged_on_core(0), Some(NRTA_SEQ_NUM_MAX - 1));
    let a = rt.execute_schedule(&m, &ins, &outs).unwrap();
    assert_eq!(a.seq_num(), NRTA_SEQ_NUM_MAX);
    assert_eq!(a.xu_id(), xu, "the number did not spill into the XU id");
    assert_eq!(rt.wait(a).unwrap(), NrtStatus::Success);
    assert!(rt.is_completed(a).unwrap());
    assert_eq!(
        rt.get_sequence(0, XuKind::Compute, 0).unwrap(),
        SeqId::new(xu, NRTA_SEQ_NUM_MAX)
    );

    // Past it: refused on every surface, before anything is staged; nothing wraps to 0.
    let publishes = rt.pipeline_counters(0).publishes;
    let past = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rt.execute_schedule(&m, &ins, &outs)
    }));
    let e = match past {
        Ok(Err(e)) => e,
        wrong => {
            // Issued (or a check inside staging panicked with the submission half done):
            // the runtime cannot settle a number past 48 bits, and closing or freeing would
            // wait for it forever, so fail without either.
            std::mem::forget((rt, m, ins, outs, _k, _d));
            panic!("the submission past NRTA_SEQ_NUM_MAX was not refused: {wrong:?}");
        }
    };
    assert_eq!(e.status, NrtStatus::Resource, "{e}");
    assert!(e.message.contains("NRTA_SEQ_NUM_MAX"), "{e}");
    let e = rt.execute(&m, &ins, &outs).unwrap_err();
    assert_eq!(e.status, NrtStatus::Resource, "{e}");
    assert_eq!(rt.pipeline_counters(0).publishes, publishes);
    assert_eq!(rt.staged_on_core(0), Some(NRTA_SEQ_NUM_MAX));
    assert_eq!(
        rt.get_sequence(0, XuKind::Compute, 0).unwrap().seq_num(),
        NRTA_SEQ_NUM_MAX
    );
    // The refusals left the model usable elsewhere: unload and close are clean.
    rt.unload(&m).unwrap();
}
