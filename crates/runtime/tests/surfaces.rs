//! One conformance suite, three surfaces: the same behavioural checks against the
//! synchronous surface, the implicit async worker pool and the explicit NRT 3.0 surface.
//!
//! What a surface legitimately does differently, and why:
//!
//! | behaviour | sync | implicit async | explicit async | reason |
//! |---|---|---|---|---|
//! | host tensors | cloned into device buffers | `NRT_INVALID` at submit | `NRT_INVALID` at submit | the seed: only the synchronous fork clones host tensors (`kbl_tensor_set_clone_to_physical_mem`); async binds in mode 0 |
//! | where the execution status arrives | return value | the registered callback | the status slot / `wait` | who drives the harvest: the caller vs the XU worker |
//! | too many in flight | the caller waits for a slot | `NRT_QUEUE_FULL` past the configured cap | `NRT_QUEUE_FULL` past 64 | async must never queue unboundedly (public docs) |
//! | validation errors (bad names/sizes) | return value | return value | return value | checked before anything is staged, on every surface |
//! | tensor read/write during a pending execution | n/a (caller is blocked) | waits for it | not ordered (use `is_completed`) | the public implicit-async contract; NRT 3.0 leaves ordering to the caller |

mod common;
use common::*;
use nrt_hal::Device;
use nrt_hal::NrtStatus;
use nrt_isa::op;
use nrt_runtime::builtin::near_null;
use nrt_runtime::{
    LoadOptions, Model, NrtError, Placement, Runtime, RuntimeConfig, SeqId, TensorSet, XuKind,
};
use nrt_sim::{FaultKind, FaultSpec, SimConfig, SoftDevice};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Sync,
    Implicit,
    Explicit,
}

const ALL: [Kind; 3] = [Kind::Sync, Kind::Implicit, Kind::Explicit];

type Reports = Arc<Mutex<Vec<(u32, u32, u64, NrtStatus)>>>;

struct Surface {
    kind: Kind,
    dev: Arc<SoftDevice>,
    rt: Runtime,
    reports: Reports,
}

impl Surface {
    fn new(kind: Kind) -> Surface {
        Surface::on(kind, device())
    }

    fn on(kind: Kind, dev: Arc<SoftDevice>) -> Surface {
        let cfg = RuntimeConfig {
            async_inflight: if kind == Kind::Implicit { 8 } else { 0 },
            ..Default::default()
        };
        let rt = runtime_on(&dev, cfg);
        let reports: Reports = Arc::new(Mutex::new(Vec::new()));
        if kind == Kind::Implicit {
            let r = reports.clone();
            rt.register_async_callback(Arc::new(move |m, v, j, s| {
                r.lock().unwrap().push((m, v, j, s))
            }))
            .unwrap();
        }
        Surface {
            kind,
            dev,
            rt,
            reports,
        }
    }

    /// Submits and waits for one execution; submission errors and execution errors both
    /// come back as `Err`.
    fn run(&self, m: &Model, ins: &TensorSet, outs: &TensorSet) -> Result<(), NrtError> {
        match self.kind {
            Kind::Sync => self.rt.execute(m, ins, outs),
            Kind::Implicit => {
                let before = self.reports.lock().unwrap().len();
                self.rt.execute(m, ins, outs)?;
                let t0 = Instant::now();
                loop {
                    if let Some(&(_, _, _, s)) = self.reports.lock().unwrap().get(before) {
                        return if s.is_success() {
                            Ok(())
                        } else {
                            Err(NrtError::new(s, "callback"))
                        };
                    }
                    assert!(t0.elapsed() < Duration::from_secs(20), "no callback");
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
            Kind::Explicit => {
                let seq = self.rt.execute_schedule(m, ins, outs)?;
                let s = self.rt.wait(seq)?;
                if s.is_success() {
                    Ok(())
                } else {
                    Err(NrtError::new(s, "wait"))
                }
            }
        }
    }
}

#[test]
fn outputs_are_correct_and_ordered_on_every_surface() {
    for kind in ALL {
        let s = Surface::new(kind);
        let m =
            s.rt.load(&near_null(1), 0, &LoadOptions::default())
                .unwrap();
        let (ins, outs, _k) = tensors(&s.rt, &m, Placement::Device);
        for k in 0..30 {
            let x = [k as f32, 2.0 * k as f32, -1.0, 0.5];
            ins.get("x").unwrap().write(&f32s(&x), 0).unwrap();
            s.run(&m, &ins, &outs).unwrap();
            assert_eq!(read_f32(outs.get("y").unwrap()), x, "{kind:?}");
        }
        if kind == Kind::Implicit {
            let r = s.reports.lock().unwrap();
            let jobs: Vec<u64> = r.iter().map(|x| x.2).collect();
            assert!(
                jobs.windows(2).all(|w| w[0] < w[1]),
                "callbacks in submission order: {jobs:?}"
            );
            assert!(
                r.iter()
                    .all(|x| x.0 == m.id() && x.1 == 0 && x.3 == NrtStatus::Success)
            );
        }
    }
}

#[test]
fn every_fault_status_on_every_surface() {
    let cases = [
        (FaultKind::Hang, NrtStatus::Timeout),
        (FaultKind::DropNotifications, NrtStatus::ExecSwNqOverflow),
        (FaultKind::Nan, NrtStatus::ExecCompletedWithNumErr),
        (FaultKind::Transient, NrtStatus::ExecCompletedWithErr),
        (FaultKind::Parity, NrtStatus::ExecHwErrNcUe),
        (FaultKind::DmaAbort, NrtStatus::ExecHwErrDmaAbort),
        (FaultKind::HbmUncorrectable, NrtStatus::ExecHwErrHbmUe),
    ];
    for kind in ALL {
        let s = Surface::new(kind);
        let m = s.rt.load(&near_null(1), 0, &quick_timeout()).unwrap();
        let (ins, outs, _k) = tensors(&s.rt, &m, Placement::Device);
        for (fault, want) in cases {
            let engine = if fault == FaultKind::Hang {
                nrt_hal::Engine::Dve
            } else {
                fault.default_engine()
            };
            s.dev
                .inject(FaultSpec::new(fault).on_engine(engine))
                .unwrap();
            let e = s.run(&m, &ins, &outs).unwrap_err();
            assert_eq!(e.status, want, "{kind:?} {fault:?}");
            s.run(&m, &ins, &outs)
                .unwrap_or_else(|e| panic!("{kind:?} after {fault:?}: {e}"));
        }
    }
}

#[test]
fn bad_inputs_on_every_surface() {
    for kind in ALL {
        let s = Surface::new(kind);
        let m =
            s.rt.load(&near_null(1), 0, &LoadOptions::default())
                .unwrap();
        let (ins, outs, _k) = tensors(&s.rt, &m, Placement::Device);
        let small =
            s.rt.allocate_tensor(Placement::Device, 0, 4, "small")
                .unwrap();
        let mut bad = ins.clone();
        bad.add("x", &small);
        let e = s.run(&m, &bad, &outs).unwrap_err();
        assert!(
            e.status == NrtStatus::Invalid && e.message.contains("'small'"),
            "{kind:?}: {e}"
        );
        let e = s.run(&m, &TensorSet::new(), &outs).unwrap_err();
        assert!(
            e.status == NrtStatus::Invalid && e.message.contains("'x'"),
            "{kind:?}: {e}"
        );
        // Host tensors: cloned by sync, rejected by both async surfaces.
        let (hi, ho, _h) = tensors(&s.rt, &m, Placement::Host);
        match (kind, s.run(&m, &hi, &ho)) {
            (Kind::Sync, r) => r.unwrap(),
            (_, Err(e)) => {
                assert_eq!(e.status, NrtStatus::Invalid, "{kind:?}");
                assert!(
                    e.message
                        .contains("Async exec mode only supports device allocated tensors"),
                    "{e}"
                );
            }
            (_, Ok(())) => panic!("{kind:?} accepted host tensors"),
        }
        s.run(&m, &ins, &outs).unwrap();
    }
}

#[test]
fn unload_and_close_while_in_flight_on_every_surface() {
    for kind in ALL {
        let s = Surface::new(kind);
        let m = s.rt.load(&near_null(1), 0, &quick_timeout()).unwrap();
        let (ins, outs, _k) = tensors(&s.rt, &m, Placement::Device);
        s.dev
            .inject(FaultSpec::new(FaultKind::Hang).on_engine(nrt_hal::Engine::Dve))
            .unwrap();
        // Submit one slow execution from another thread (sync) or directly (async).
        let before = s.dev.executions(0).unwrap();
        let pending: Option<std::thread::JoinHandle<_>> = match kind {
            Kind::Sync => {
                let (rt, m2, i, o) = (s.rt.clone(), m.clone(), ins.clone(), outs.clone());
                Some(std::thread::spawn(move || rt.execute(&m2, &i, &o)))
            }
            Kind::Implicit => {
                s.rt.execute(&m, &ins, &outs).unwrap();
                None
            }
            Kind::Explicit => {
                s.rt.execute_schedule(&m, &ins, &outs).unwrap();
                None
            }
        };
        wait_until_taken(&s.dev, 0, before); // in flight: not a fixed sleep
        s.rt.unload(&m).unwrap(); // waits for the execution
        if let Some(t) = pending {
            assert_eq!(t.join().unwrap().unwrap_err().status, NrtStatus::Timeout);
        }
        if kind == Kind::Implicit {
            assert_eq!(
                s.reports.lock().unwrap().last().unwrap().3,
                NrtStatus::Timeout
            );
        }
        // Close while something is in flight.
        let m = s.rt.load(&near_null(1), 0, &quick_timeout()).unwrap();
        let (ins, outs, _k) = tensors(&s.rt, &m, Placement::Device);
        s.dev
            .inject(FaultSpec::new(FaultKind::Hang).on_engine(nrt_hal::Engine::Dve))
            .unwrap();
        match kind {
            Kind::Sync => {
                let (rt, m2) = (s.rt.clone(), m.clone());
                let before = s.dev.executions(0).unwrap();
                let t = std::thread::spawn(move || rt.execute(&m2, &ins, &outs));
                wait_until_taken(&s.dev, 0, before);
                s.rt.close();
                assert_eq!(t.join().unwrap().unwrap_err().status, NrtStatus::Timeout);
            }
            Kind::Implicit => {
                s.rt.execute(&m, &ins, &outs).unwrap();
                s.rt.close();
                assert_eq!(
                    s.reports.lock().unwrap().last().unwrap().3,
                    NrtStatus::Timeout,
                    "reported before close returned"
                );
            }
            Kind::Explicit => {
                let mut st = -1i32;
                // SAFETY: `st` outlives the execution: close() below waits for it.
                let seq =
                    unsafe { s.rt.execute_schedule_raw(&m, &ins, &outs, 0, &mut st) }.unwrap();
                s.rt.close();
                assert_eq!(
                    st,
                    NrtStatus::Timeout.as_i32(),
                    "status slot written before close returned"
                );
                assert_eq!(
                    s.rt.is_completed(seq).unwrap_err().status,
                    NrtStatus::Closed
                );
            }
        }
        assert_eq!(
            s.rt.execute(&m, &TensorSet::new(), &TensorSet::new())
                .unwrap_err()
                .status,
            NrtStatus::Closed
        );
    }
}

#[test]
fn implicit_async_queue_full_drain_and_tensor_waits() {
    let dev = device();
    let rt = runtime_on(
        &dev,
        RuntimeConfig {
            async_inflight: 3,
            ..Default::default()
        },
    );
    assert!(rt.is_implicit_async());
    let m = rt.load(&near_null(1), 0, &quick_timeout()).unwrap();
    let (ins, outs, _k) = tensors(&rt, &m, Placement::Device);
    // Hold the core with a hanging execution so the queue fills up. The clock starts before
    // it is staged: its 300 ms deadline then lies at least 300 ms after `t0` however long
    // this thread is preempted, where a clock started at the read could start late.
    dev.inject(FaultSpec::new(FaultKind::Hang).on_engine(nrt_hal::Engine::Dve))
        .unwrap();
    let t0 = Instant::now();
    for _ in 0..3 {
        rt.execute(&m, &ins, &outs).unwrap();
    }
    let e = rt.execute(&m, &ins, &outs).unwrap_err();
    assert_eq!(e.status, NrtStatus::QueueFull, "{e}");
    assert!(
        e.message
            .contains("NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS"),
        "{e}"
    );
    // A tensor read waits for the pending executions that use the tensor — blocked on the
    // vcore's completion wake, not spinning: the hung execution is not expected to finish
    // soon, and the worker signals when it retires it (a spinning read held a vCPU for the
    // whole 300 ms, CPU time ≈ wall time).
    let (wall0, cpu0) = (Instant::now(), thread_cpu());
    let _ = read_f32(outs.get("y").unwrap());
    let (wall, cpu) = (wall0.elapsed(), thread_cpu() - cpu0);
    assert!(
        t0.elapsed() >= Duration::from_millis(100),
        "read did not wait for the pending execution"
    );
    assert!(
        cpu < wall / 4,
        "the read spun while it waited: {cpu:?} of CPU in {wall:?}"
    );
    rt.async_drain(0).unwrap();
    rt.execute(&m, &ins, &outs).unwrap();
    rt.async_drain(-1).unwrap();
    // Out-of-range cap is rejected at init.
    let e = Runtime::init(
        device(),
        RuntimeConfig {
            async_inflight: 64,
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(
        e.status == NrtStatus::Invalid && e.message.contains("63"),
        "{e}"
    );
    // The callback API is only for async mode.
    let sync_rt = runtime_on(&device(), RuntimeConfig::default());
    assert_eq!(
        sync_rt
            .register_async_callback(Arc::new(|_, _, _, _| {}))
            .unwrap_err()
            .status,
        NrtStatus::Invalid
    );
}

/// Under implicit async, a read of an execution's output returns once the execution is
/// retired — and then its place under the in-flight cap is free: an application that reads
/// the output and submits the next execution never gets `NRT_QUEUE_FULL` (the count dropped
/// after the pending marks, and a client fast enough to submit in between was refused).
#[test]
fn implicit_async_a_read_output_frees_its_place_in_the_queue() {
    let (_dev, rt) = {
        let dev = device();
        let rt = runtime_on(
            &dev,
            RuntimeConfig {
                async_inflight: 1,
                ..Default::default()
            },
        );
        (dev, rt)
    };
    let m = rt.load(&near_null(1), 0, &quick_timeout()).unwrap();
    let (ins, outs, _k) = tensors(&rt, &m, Placement::Device);
    let x = [1.0f32, -2.0, 3.5, 8.0];
    ins.get("x").unwrap().write(&f32s(&x), 0).unwrap();
    for i in 0..20_000 {
        if let Err(e) = rt.execute(&m, &ins, &outs) {
            panic!("execution {i}, submitted right after the previous one's output was read: {e}");
        }
        assert_eq!(read_f32(outs.get("y").unwrap()), x, "execution {i}");
    }
    rt.async_drain(-1).unwrap();
}

#[test]
fn explicit_async_sequences_eventfds_and_backpressure() {
    let (dev, rt) = runtime();
    let m = rt.load(&near_null(1), 0, &quick_timeout()).unwrap();
    let (ins, outs, _k) = tensors(&rt, &m, Placement::Device);
    let mut seqs: Vec<SeqId> = Vec::new();
    let mut status = vec![-7i32; 8];
    for st in status.iter_mut() {
        // SAFETY: `status` lives until the end of the test, after every wait below.
        seqs.push(unsafe { rt.execute_schedule_raw(&m, &ins, &outs, 0, st) }.unwrap());
    }
    let n: Vec<u64> = seqs.iter().map(|s| s.seq_num()).collect();
    assert!(
        n.windows(2).all(|w| w[1] == w[0] + 1),
        "strictly increasing by one: {n:?}"
    );
    assert!(
        seqs.iter().all(|s| s.xu_id() == 1),
        "compute XU of vnc 0 is xu_id 1"
    );
    for s in &seqs {
        assert_eq!(rt.wait(*s).unwrap(), NrtStatus::Success);
        assert!(rt.is_completed(*s).unwrap());
    }
    assert!(
        status.iter().all(|&s| s == 0),
        "status slots written: {status:?}"
    );
    assert_eq!(
        rt.get_sequence(0, XuKind::Compute, 0).unwrap(),
        *seqs.last().unwrap()
    );
    // Invalid sequences.
    let future = SeqId::new(1, n[7] + 100);
    assert_eq!(
        rt.is_completed(future).unwrap_err().status,
        NrtStatus::Invalid
    );
    assert_eq!(
        rt.is_completed(SeqId::new(1, 0)).unwrap_err().status,
        NrtStatus::Invalid
    );
    assert_eq!(
        rt.is_completed(SeqId::new(99, 1)).unwrap_err().status,
        NrtStatus::Invalid
    );
    assert!(rt.execute_schedule_raw_queue_check(&m, &ins, &outs));

    // Eventfds: one seq, already completed → signalled at once; every completion of the XU.
    let efd = eventfd();
    rt.register_seq_eventfd(seqs[0], efd).unwrap();
    assert_eq!(read_efd(efd), 1);
    let xfd = eventfd();
    rt.register_xu_eventfd(0, XuKind::Compute, 0, xfd).unwrap();
    let s = rt.execute_schedule(&m, &ins, &outs).unwrap();
    rt.register_seq_eventfd(s, efd).unwrap();
    assert_eq!(
        poll_efd(efd, 5000),
        1,
        "seq eventfd signalled on completion"
    );
    assert!(poll_efd(xfd, 5000) >= 1, "xu eventfd signalled");
    rt.register_xu_eventfd(0, XuKind::Compute, 0, -1).unwrap();
    // A client that polled and then blocks on an eventfd instead: the worker, which stayed
    // out of the way of the polls, takes over when the eventfd is armed.
    for _ in 0..200 {
        let s = rt.execute_schedule(&m, &ins, &outs).unwrap();
        let _ = rt.is_completed(s).unwrap();
        rt.register_seq_eventfd(s, efd).unwrap();
        assert_eq!(poll_efd(efd, 5000), 1, "seq {s:?}: eventfd after polling");
    }
    // Registration racing the retirement (another thread drives the harvest and retires
    // while this one registers): every eventfd is signalled, exactly once (the SeqEvent
    // handshake; its loom model covers the interleavings this only samples).
    for _ in 0..500 {
        let s = rt.execute_schedule(&m, &ins, &outs).unwrap();
        let rt2 = rt.clone();
        let retirer = std::thread::spawn(move || while !rt2.is_completed(s).unwrap() {});
        rt.register_seq_eventfd(s, efd).unwrap();
        retirer.join().unwrap();
        assert_eq!(poll_efd(efd, 5000), 1, "seq {s:?}: eventfd signalled once");
    }
    // SAFETY: closing fds we created.
    unsafe {
        libc::close(efd);
        libc::close(xfd);
    }

    // Backpressure: hold the core, fill all 64 slots, the next schedule is QUEUE_FULL.
    dev.inject(FaultSpec::new(FaultKind::Hang).on_engine(nrt_hal::Engine::Dve))
        .unwrap();
    let mut held = Vec::new();
    let full = loop {
        match rt.execute_schedule(&m, &ins, &outs) {
            Ok(s) => held.push(s),
            Err(e) => break e,
        }
        assert!(held.len() <= 64);
    };
    assert_eq!(full.status, NrtStatus::QueueFull, "{full}");
    assert_eq!(rt.wait(held[0]).unwrap(), NrtStatus::Timeout);
    for s in &held[1..] {
        assert_eq!(rt.wait(*s).unwrap(), NrtStatus::Success);
    }

    // A fatal core makes the XU unrecoverable until reset.
    dev.inject(FaultSpec::new(FaultKind::Fatal)).unwrap();
    let s = rt.execute_schedule(&m, &ins, &outs).unwrap();
    assert_eq!(rt.wait(s).unwrap(), NrtStatus::ExecUnitUnrecoverable);
    assert_eq!(
        rt.execute_schedule(&m, &ins, &outs).unwrap_err().status,
        NrtStatus::ExecUnitUnrecoverable
    );
    rt.reset_vnc(0).unwrap();
    let s = rt.execute_schedule(&m, &ins, &outs).unwrap();
    assert_eq!(rt.wait(s).unwrap(), NrtStatus::Success);

    // Tensor ops on the tensor-op XU.
    let t = rt.allocate_tensor(Placement::Device, 0, 16, "t").unwrap();
    let mut st = -1;
    // SAFETY: `st` outlives the call (tensor ops complete before returning).
    let w = unsafe { rt.tensor_write_schedule(&t, &[1u8; 16], 0, 0, 0, &mut st) }.unwrap();
    assert_eq!((w.xu_id(), st), (0, 0));
    assert!(rt.is_completed(w).unwrap());
    assert_eq!(rt.get_sequence(0, XuKind::TensorOp, 0).unwrap(), w);
}

trait QueueCheck {
    fn execute_schedule_raw_queue_check(&self, m: &Model, i: &TensorSet, o: &TensorSet) -> bool;
}

impl QueueCheck for Runtime {
    /// Queue must be 0.
    fn execute_schedule_raw_queue_check(&self, m: &Model, i: &TensorSet, o: &TensorSet) -> bool {
        // SAFETY: null status slot.
        let e =
            unsafe { self.execute_schedule_raw(m, i, o, 1, core::ptr::null_mut()) }.unwrap_err();
        e.status == NrtStatus::Invalid && e.message.contains("queue 1")
    }
}

/// The calling thread's CPU time.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn eventfd() -> i32 {
    // SAFETY: plain syscall.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK) };
    assert!(fd >= 0);
    fd
}

fn read_efd(fd: i32) -> u64 {
    let mut v = 0u64;
    // SAFETY: reading 8 bytes into a u64 from our eventfd.
    let n = unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
    if n == 8 { v } else { 0 }
}

fn poll_efd(fd: i32, timeout_ms: i32) -> u64 {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, timeout_ms) };
    read_efd(fd)
}

#[test]
fn streaming_output_is_seen_before_the_execution_is_done() {
    use nrt_hal::wire::{CUSTOM_SUB_ID_OUTPUT_DONE, CUSTOM_SUBTYPE_TENSOR};
    use nrt_hal::{DType, Engine};
    use nrt_isa::{AccessPattern, Instruction, Op, SemRef};
    use nrt_model::{ModelBuilder, vaddr};
    let n = 256u32;
    let mut b = ModelBuilder::new("streaming", 1);
    let x = b.input("x", DType::F32, &[n, n]);
    let first = b.output("first", DType::F32, &[n, n]);
    let last = b.output("last", DType::F32, &[n, n]);
    let bytes = (n * n * 4) as u64;
    let tmp = b.scratch(0, 2 * bytes, 64);
    let (xr, fr, lr) = (b.io_mem_ref(x), b.io_mem_ref(first), b.io_mem_ref(last));
    let ap = |mr: u32, off: u64| AccessPattern::dense(vaddr(mr, off), DType::F32, &[n, n]);
    let (inp, copied, product) = (SemRef::local(4), SemRef::local(5), SemRef::local(6));
    // The last product also waits for the host to raise this semaphore, which the watcher
    // does only after it saw the first output: "the last output is not final yet" does not
    // depend on how the threads are scheduled.
    let released = SemRef::local(7);
    let (dx, dfirst, dlast) = (
        b.io_descriptor(x),
        b.io_descriptor(first),
        b.io_descriptor(last),
    );
    let notify = |var| {
        Instruction::new(Op::Notify(op::Notify {
            subtype: CUSTOM_SUBTYPE_TENSOR,
            sub_id: CUSTOM_SUB_ID_OUTPUT_DONE,
            payload: var,
        }))
    };
    b.push(
        0,
        Engine::Sp,
        Instruction::new(Op::DmaDescriptors(op::DmaDescriptors {
            table: dx,
            count: 1,
        }))
        .signal(inp, 1),
    );
    b.push(
        0,
        Engine::Dve,
        Instruction::new(Op::Copy(op::Copy {
            input: ap(xr, 0),
            output: ap(fr, 0),
        }))
        .wait(inp, 1)
        .signal(copied, 1),
    );
    b.push(
        0,
        Engine::Sp,
        Instruction::new(Op::DmaDescriptors(op::DmaDescriptors {
            table: dfirst,
            count: 1,
        }))
        .wait(copied, 1),
    );
    b.push(0, Engine::Sp, notify(first));
    // A long chain of matmuls on PE before the last output is final.
    let chain = 60;
    b.push(
        0,
        Engine::Pe,
        Instruction::new(Op::MatMul(op::MatMul {
            a: ap(xr, 0),
            b: ap(xr, 0),
            c: ap(tmp, 0),
            alpha: 0.01,
            flags: 0,
            epilogue: nrt_isa::Epilogue::NONE,
        }))
        .wait(inp, 1),
    );
    for k in 0..chain {
        let (src, dst) = if k % 2 == 0 { (0, bytes) } else { (bytes, 0) };
        b.push(
            0,
            Engine::Pe,
            Instruction::new(Op::MatMul(op::MatMul {
                a: ap(tmp, src),
                b: ap(xr, 0),
                c: ap(tmp, dst),
                alpha: 0.01,
                flags: 0,
                epilogue: nrt_isa::Epilogue::NONE,
            })),
        );
    }
    b.push(
        0,
        Engine::Pe,
        Instruction::new(Op::MatMul(op::MatMul {
            a: ap(tmp, 0),
            b: ap(xr, 0),
            c: ap(lr, 0),
            alpha: 0.01,
            flags: 0,
            epilogue: nrt_isa::Epilogue::NONE,
        }))
        .wait(released, 1)
        .signal(product, 1),
    );
    b.push(
        0,
        Engine::Sp,
        Instruction::new(Op::DmaDescriptors(op::DmaDescriptors {
            table: dlast,
            count: 1,
        }))
        .wait(product, 1),
    );
    b.push(0, Engine::Sp, notify(last));
    let model_bytes = b.build().encode();

    for kind in ALL {
        // The held execution stalls until the watcher releases it: give the hang watchdog
        // room for a watcher descheduled on a busy machine.
        let dev = Arc::new(
            SoftDevice::new(SimConfig {
                memory_bytes: 2 << 30,
                hang_watchdog: Duration::from_secs(20),
                ..SimConfig::default()
            })
            .unwrap(),
        );
        let s = Surface::on(kind, dev);
        let m = s.rt.load(&model_bytes, 0, &LoadOptions::default()).unwrap();
        let (ins, outs, _k) = tensors(&s.rt, &m, Placement::Device);
        ins.get("x")
            .unwrap()
            .write(&f32s(&vec![0.5; (n * n) as usize]), 0)
            .unwrap();
        let (f, l) = (
            outs.get("first").unwrap().clone(),
            outs.get("last").unwrap().clone(),
        );
        f.reset_output_completion();
        l.reset_output_completion();
        let done = Arc::new(AtomicBool::new(false));
        let (d2, f2, l2, dev2) = (done.clone(), f.clone(), l.clone(), s.dev.clone());
        let watcher = std::thread::spawn(move || {
            f2.check_output_completion(None, 1).unwrap();
            // At this instant the last output is not final and the execution not done.
            let seen = (l2.completion_count(), d2.load(Ordering::SeqCst));
            dev2.semaphore_increment(0, 7, 1).unwrap();
            seen
        });
        s.run(&m, &ins, &outs).unwrap();
        done.store(true, Ordering::SeqCst);
        let (last_count, exec_done) = watcher.join().unwrap();
        assert_eq!(
            (last_count, exec_done),
            (0, false),
            "{kind:?}: first output surfaced before DONE"
        );
        assert_eq!(l.completion_count(), 1, "{kind:?}");
        l.check_output_completion(Some(Duration::from_millis(1)), 1)
            .unwrap();
        let e = l
            .check_output_completion(Some(Duration::from_millis(1)), 2)
            .unwrap_err();
        assert_eq!(e.status, NrtStatus::Timeout, "{kind:?}");
        assert_eq!(read_f32(&f)[..4], [0.5; 4]);
    }
}

/// Issue 11, D6: after a fatal fault, the executions queued behind it finish at once with
/// `NRT_EXEC_UNIT_UNRECOVERABLE` — on a 1-core and on a 2-core (lockstep) model — instead of
/// waiting out the timeout and reporting `NRT_TIMEOUT` or dropped notifications.
#[test]
fn d6_fatal_fault_fails_the_executions_queued_behind_it_at_once() {
    for lnc in [1u32, 2] {
        let dev = device();
        let rt = runtime_on(
            &dev,
            RuntimeConfig {
                logical_nc: lnc,
                ..RuntimeConfig::default()
            },
        );
        let opts = nrt_runtime::LoadOptions {
            exec_timeout: Some(std::time::Duration::from_secs(5)),
            ..Default::default()
        };
        let m = rt.load(&near_null(lnc), 0, &opts).unwrap();
        let (ins, outs, _t) = tensors(&rt, &m, Placement::Device);
        // The second execution of the (first) core is fatal.
        let first = rt.execute_schedule(&m, &ins, &outs).unwrap();
        assert_eq!(rt.wait(first).unwrap(), NrtStatus::Success);
        dev.inject(FaultSpec::new(FaultKind::Fatal)).unwrap();
        let start = std::time::Instant::now();
        let mut statuses = Vec::new();
        let mut seqs = Vec::new();
        for _ in 0..4 {
            match rt.execute_schedule(&m, &ins, &outs) {
                Ok(s) => seqs.push(s),
                Err(e) => statuses.push(e.status),
            }
        }
        for s in seqs {
            statuses.push(rt.wait(s).unwrap());
        }
        let took = start.elapsed();
        assert!(
            statuses
                .iter()
                .all(|s| *s == NrtStatus::ExecUnitUnrecoverable),
            "lnc {lnc}: {statuses:?}"
        );
        assert!(
            took < std::time::Duration::from_secs(2),
            "lnc {lnc}: {took:?}"
        );
        rt.reset_vnc(0).unwrap();
        let s = rt.execute_schedule(&m, &ins, &outs).unwrap();
        assert_eq!(rt.wait(s).unwrap(), NrtStatus::Success, "lnc {lnc}");
        rt.close();
    }
}

/// Unload and close race executions that already passed validation: the staging lock
/// re-checks the model and runtime state, so such an execution is either counted (and the
/// unload waits for it) or refused — never staged on a released model, where it waited out
/// its timeout (issue 11, seen with D3's test).
#[test]
fn unload_and_close_while_threads_keep_executing() {
    for close in [false, true] {
        let (_dev, rt) = runtime();
        let m = rt.load(&near_null(1), 0, &quick_timeout()).unwrap();
        let (ins, outs, _t) = tensors(&rt, &m, Placement::Device);
        let stop = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (rt, m, ins, outs, stop) = (
                    rt.clone(),
                    m.clone(),
                    ins.clone(),
                    outs.clone(),
                    stop.clone(),
                );
                std::thread::spawn(move || {
                    let (mut ok, mut refused) = (0u64, 0u64);
                    while !stop.load(Ordering::Relaxed) {
                        match rt.execute(&m, &ins, &outs) {
                            Ok(()) => ok += 1,
                            Err(e) => {
                                assert!(
                                    matches!(e.status, NrtStatus::Invalid | NrtStatus::Closed),
                                    "{e}"
                                );
                                refused += 1;
                            }
                        }
                    }
                    (ok, refused)
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(20));
        let t0 = Instant::now();
        if close {
            rt.close();
        } else {
            rt.unload(&m).unwrap();
        }
        let took = t0.elapsed();
        std::thread::sleep(Duration::from_millis(5));
        stop.store(true, Ordering::Relaxed);
        let mut refused = 0;
        for t in threads {
            refused += t.join().unwrap().1;
        }
        assert!(refused > 0, "close={close}");
        assert!(took < Duration::from_secs(5), "close={close}: {took:?}");
    }
}
