//! Loom models of the lock-free protocols the runtime and the device share: the SPSC ring,
//! the notification plane (and its watch), the park handshake, the completion wake, the
//! admission gate of handles, the slot ticket, the per-execution eventfd handshake, the
//! host-served core's release, its serve start and the doorbells rung under it, the
//! hand-off between a synchronous caller serving a core and one queued behind it, and a
//! model's unload against a late binder.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p nrt-hal --release --test loom`
//! (`.ci/run` does, with `LOOM_MAX_PREEMPTIONS=3`).
#![cfg(loom)]

use loom::sync::Arc;
use loom::sync::atomic::{AtomicU32, Ordering};
use nrt_hal::{
    CompletionWake, ExecutionWakes, GateRefused, IdleGate, LockstepParts, NqRecord, SeqEvent,
    Served, ServedCore, SlotTicket, UseGate, plane, ring,
};

/// Producer and consumer on a 2-slot ring: every value arrives once, in order, across a wrap.
#[test]
fn spsc_ring_preserves_order_across_wrap() {
    loom::model(|| {
        let (mut p, mut c) = ring::<u32>(2);
        let t = loom::thread::spawn(move || {
            let mut next = 0;
            while next < 3 {
                if p.try_push(next).is_ok() {
                    next += 1;
                } else {
                    loom::thread::yield_now();
                }
            }
        });
        let mut expect = 0;
        while expect < 3 {
            match c.pop() {
                Some(v) => {
                    assert_eq!(v, expect);
                    expect += 1;
                }
                None => loom::thread::yield_now(),
            }
        }
        t.join().unwrap();
    });
}

/// A batch push is published with one store; a drain sees all of it or none of it.
#[test]
fn spsc_ring_batches_are_atomic() {
    loom::model(|| {
        let (mut p, mut c) = ring::<u32>(4);
        let t = loom::thread::spawn(move || {
            assert!(p.push_slice(&[1, 2, 3]));
        });
        let mut got = Vec::new();
        c.drain(|v| got.push(v));
        assert!(got.is_empty() || got == [1, 2, 3], "{got:?}");
        t.join().unwrap();
    });
}

/// A full notification ring drops and counts; the consumer sees exactly the kept records.
#[test]
fn spsc_ring_overflow_counts_drops() {
    loom::model(|| {
        let (mut p, mut c) = ring::<u32>(2);
        let t = loom::thread::spawn(move || {
            let mut kept = 0;
            for v in 0..3 {
                if p.push_or_drop(v) {
                    kept += 1;
                }
            }
            kept
        });
        let mut seen = 0;
        while c.pop().is_some() {
            seen += 1;
        }
        let kept = t.join().unwrap();
        while c.pop().is_some() {
            seen += 1;
        }
        assert_eq!(seen, kept);
        assert_eq!(kept + c.dropped(), 3);
    });
}

/// The doorbell vs park handshake: a device thread that goes to sleep and a host that
/// publishes work then notifies. The model fails (deadlock) if a wake-up can be lost.
#[test]
fn park_handshake_never_loses_a_wakeup() {
    loom::model(|| {
        let gate = Arc::new(IdleGate::new());
        let doorbell = Arc::new(AtomicU32::new(0));
        let (g, d) = (gate.clone(), doorbell.clone());
        let device = loom::thread::spawn(move || {
            g.register_sleeper();
            g.sleep_until(|| d.load(Ordering::Acquire) != 0);
            assert_eq!(d.load(Ordering::Acquire), 1);
        });
        doorbell.fetch_add(1, Ordering::Release);
        gate.notify();
        device.join().unwrap();
    });
}

/// Two doorbells rung back to back (merged or not) both reach a device that sleeps between
/// them.
#[test]
fn park_handshake_two_doorbells() {
    loom::model(|| {
        let gate = Arc::new(IdleGate::new());
        let doorbell = Arc::new(AtomicU32::new(0));
        let (g, d) = (gate.clone(), doorbell.clone());
        let device = loom::thread::spawn(move || {
            g.register_sleeper();
            let mut seen = 0;
            while seen < 2 {
                g.sleep_until(|| d.load(Ordering::Acquire) > seen);
                seen = d.load(Ordering::Acquire);
            }
        });
        for _ in 0..2 {
            doorbell.fetch_add(1, Ordering::Release);
            gate.notify();
        }
        device.join().unwrap();
    });
}

fn rec(i: u32) -> NqRecord {
    NqRecord {
        compute_idx: i,
        ..Default::default()
    }
}

/// The notification plane: records of two rings published in batches arrive once, in order
/// per ring, across a wrap of each ring.
#[test]
fn notification_plane_batches_wrap_and_order() {
    loom::model(|| {
        let (mut p, mut c) = plane(2);
        let t = loom::thread::spawn(move || {
            let mut next = [0u32; 2];
            while next[0] < 3 || next[1] < 3 {
                for (r, n) in next.iter_mut().enumerate() {
                    if *n < 3 && p.push(r * 5, rec(*n)) {
                        *n += 1;
                    }
                }
                p.publish();
                loom::thread::yield_now();
            }
        });
        let mut expect = [0u32; 2];
        while expect[0] < 3 || expect[1] < 3 {
            let n = c.drain_all(|r, x| {
                let k = r / 5;
                assert_eq!(x.compute_idx, expect[k], "ring {r}");
                expect[k] += 1;
            });
            if n == 0 {
                loom::thread::yield_now();
            }
        }
        t.join().unwrap();
    });
}

/// A record is never visible before its batch is published, and a full ring drops and
/// counts instead of overwriting.
#[test]
fn notification_plane_publication_and_overflow() {
    loom::model(|| {
        let (mut p, mut c) = plane(2);
        let t = loom::thread::spawn(move || {
            let mut kept = 0;
            for i in 0..3 {
                kept += p.push(0, rec(i)) as u32;
            }
            p.publish();
            kept
        });
        let mut seen = Vec::new();
        c.drain(0, |_, x| seen.push(x.compute_idx));
        assert!(seen.is_empty() || seen == [0, 1], "{seen:?}");
        let kept = t.join().unwrap();
        c.drain(0, |_, x| seen.push(x.compute_idx));
        assert_eq!(seen, [0, 1]);
        assert_eq!(kept, 2);
        assert_eq!(c.dropped(0), 1);
    });
}

/// The runtime's idle poll: host threads check a `PlaneWatch` and take the consumer (the
/// harvest token, a lock) only when it says records are waiting. Every record is drained
/// exactly once, in order, whichever thread drains it, and a watch that answered "nothing" is
/// never the last word: the main poller, which spins until it has seen both records, would
/// otherwise spin forever (loom reports that as a livelock).
#[test]
fn plane_watch_lets_pollers_skip_the_consumer() {
    type Token = Arc<loom::sync::Mutex<(nrt_hal::PlaneConsumer, u32)>>;
    fn poll_once(watch: &nrt_hal::PlaneWatch, token: &Token) -> u32 {
        // Checked before the token is taken, as the runtime does.
        if watch.has_records() {
            let mut g = token.lock().unwrap();
            let (c, seen) = &mut *g;
            c.drain_all(|r, x| {
                assert_eq!((r, x.compute_idx), (1, *seen));
                *seen += 1;
            });
        }
        token.lock().unwrap().1
    }
    loom::model(|| {
        let (mut p, c) = plane(2);
        let watch = c.watch();
        let token: Token = Arc::new(loom::sync::Mutex::new((c, 0u32)));
        let producer = loom::thread::spawn(move || {
            for i in 0..2 {
                assert!(p.push(1, rec(i)));
                p.publish();
            }
        });
        // A second poller (the XU worker) that looks once.
        let (w2, t2) = (watch.clone(), token.clone());
        let other = loom::thread::spawn(move || {
            poll_once(&w2, &t2);
        });
        while poll_once(&watch, &token) < 2 {
            loom::thread::yield_now();
        }
        other.join().unwrap();
        producer.join().unwrap();
    });
}

/// A handle's value guarded by a [`UseGate`], as the C API's handle shells hold it.
type Guarded = Arc<(UseGate, loom::cell::UnsafeCell<u32>)>;

fn guarded(v: u32) -> Guarded {
    let g = Arc::new((UseGate::new_closed(), loom::cell::UnsafeCell::new(0)));
    // SAFETY: nobody else sees the value before the gate opens.
    g.1.with_mut(|p| unsafe { *p = v });
    g.0.open();
    g
}

/// A user that enters the gate up to `times` times and reads the value each time it is
/// admitted; returns the values it read.
fn gate_user(g: Guarded, times: usize) -> Vec<u32> {
    let mut seen = Vec::new();
    for _ in 0..times {
        match g.0.enter() {
            Ok(()) => {
                // SAFETY: inside the gate nobody writes the value (loom checks it).
                seen.push(g.1.with(|p| unsafe { *p }));
                g.0.leave();
            }
            Err(e) => {
                assert_eq!(e, GateRefused::Closed);
                break;
            }
        }
    }
    seen
}

/// `close` (a free): newcomers are refused, the closer waits only for the users already
/// inside, and then owns the value alone — loom reports a data race if a user could still be
/// reading it when the closer writes, and a deadlock if the closer could wait forever.
#[test]
fn use_gate_close_refuses_newcomers_and_waits_for_those_inside() {
    loom::model(|| {
        let g = guarded(7);
        let users: Vec<_> = (0..2)
            .map(|_| {
                let g = g.clone();
                loom::thread::spawn(move || gate_user(g, 2))
            })
            .collect();
        g.0.close().unwrap();
        // SAFETY: the gate is closed and empty: we are the only accessor (loom checks it).
        g.1.with_mut(|p| unsafe { *p = 0 });
        g.0.finish_close();
        assert_eq!(g.0.enter(), Err(GateRefused::Closed));
        assert_eq!(
            g.0.close(),
            Err(GateRefused::Closed),
            "a second free is refused"
        );
        for u in users {
            assert!(u.join().unwrap().iter().all(|&v| v == 7));
        }
    });
}

/// `lock` (a mutation, e.g. adding a tensor to a set): users wait for it and then enter;
/// they see the value before or after the mutation, never during it.
#[test]
fn use_gate_mutation_excludes_users_and_lets_them_in_after() {
    loom::model(|| {
        let g = guarded(7);
        let u = {
            let g = g.clone();
            loom::thread::spawn(move || gate_user(g, 2))
        };
        g.0.lock().unwrap();
        // SAFETY: exclusive: no user is inside (loom checks it).
        g.1.with_mut(|p| unsafe { *p = 8 });
        g.0.unlock();
        let seen = u.join().unwrap();
        assert_eq!(seen.len(), 2, "a mutation never refuses users");
        assert!(seen.windows(2).all(|w| w[0] <= w[1]) && seen.iter().all(|&v| v == 7 || v == 8));
        assert_eq!(gate_user(g, 1), vec![8]);
    });
}

/// A mutation and a free racing on the same handle: one runs after the other, and after
/// the free every further exclusive operation is refused.
#[test]
fn use_gate_mutation_and_free_serialize() {
    loom::model(|| {
        let g = guarded(1);
        let m = {
            let g = g.clone();
            loom::thread::spawn(move || {
                if g.0.lock().is_ok() {
                    // SAFETY: exclusive (loom checks it).
                    g.1.with_mut(|p| unsafe { *p += 1 });
                    g.0.unlock();
                }
            })
        };
        g.0.close().unwrap();
        // SAFETY: closed and empty.
        let v = g.1.with(|p| unsafe { *p });
        g.0.finish_close();
        assert!(v == 1 || v == 2);
        m.join().unwrap();
        assert_eq!(g.0.lock(), Err(GateRefused::Closed));
    });
}

/// One in-flight slot's record guarded by a [`SlotTicket`], as the runtime keeps it.
type Slot = Arc<(SlotTicket, loom::cell::UnsafeCell<u64>)>;

/// The slot/ticket protocol through one slot's life and its reuse: the stager writes the
/// record and publishes; the harvest reads it while the ticket names its execution and then
/// writes the completion word; the owner reads and clears it after the completion word and
/// frees the ticket; the stager reuses the slot only once it is free. loom reports a data
/// race on the record if any hand-off is missing or too weak (each was checked by making its
/// store Relaxed). The harvest and the owner try a bounded number of times, so the model
/// also covers them running before the step they wait for.
#[test]
fn slot_ticket_hands_the_record_from_stager_to_harvest_to_owner_and_back() {
    loom::model(|| {
        let slot: Slot = Arc::new((SlotTicket::new(), loom::cell::UnsafeCell::new(0)));
        let harvest = {
            let s = slot.clone();
            loom::thread::spawn(move || {
                for _ in 0..2 {
                    if s.0.current() == 1 {
                        // SAFETY: the ticket names execution 1, not yet completed.
                        assert_eq!(s.1.with(|p| unsafe { *p }), 100);
                        s.0.complete(1, 7);
                        return;
                    }
                    loom::thread::yield_now();
                }
            })
        };
        let owner = {
            let s = slot.clone();
            loom::thread::spawn(move || {
                for _ in 0..3 {
                    if let Some(status) = s.0.completed(1) {
                        assert_eq!(status, 7);
                        // SAFETY: completed: the harvest no longer reads the record.
                        let v = s.1.with_mut(|p| unsafe { std::mem::replace(&mut *p, 0) });
                        assert_eq!(v, 100);
                        s.0.release();
                        return;
                    }
                    loom::thread::yield_now();
                }
            })
        };
        // The stager: execution 1 into the free slot.
        assert!(slot.0.is_free());
        // SAFETY: free: nobody else touches the record.
        slot.1.with_mut(|p| unsafe { *p = 100 });
        slot.0.publish(1);
        loom::thread::yield_now();
        // Reuse for execution 2 once the owner freed it (one look).
        if slot.0.is_free() {
            // SAFETY: freed by the owner after its last access.
            slot.1.with_mut(|p| unsafe { *p = 200 });
            slot.0.publish(2);
            assert_eq!(slot.0.completed(2), None, "a fresh completion word");
        }
        harvest.join().unwrap();
        owner.join().unwrap();
    });
}

/// The completion wake composed with the notification plane that signals it: a host thread
/// that found nothing blocks on the wake; the device pushes and publishes a record. The model
/// fails (deadlock: the waiter sleeps forever) if a wake-up can be lost — e.g. if the
/// signaler skips its fence, or the waiter checks before it registers.
#[test]
fn completion_wake_never_loses_a_wakeup() {
    loom::model(|| {
        let wake = Arc::new(CompletionWake::new());
        let (mut p, mut c) = plane(2);
        p.set_wake(Some(wake.clone()));
        let device = loom::thread::spawn(move || {
            assert!(p.push(0, rec(7)));
            p.publish();
        });
        let mut got = Vec::new();
        while got.is_empty() {
            if c.drain_all(|_, r| got.push(r.compute_idx)) == 0 {
                wake.wait(None, || c.has_records());
            }
        }
        assert_eq!(got, [7]);
        device.join().unwrap();
    });
}

/// A waiter for a long execution switches the wake's fences to symmetric while the device
/// publishes (the switch's window: the device may read either mode); a second, ordinary
/// waiter then finds them symmetric. No wake-up is lost on either side of the switch.
/// (Loom models `membarrier` as a `SeqCst` fence; the argument for the real system call is in
/// `wake.rs`.)
#[test]
fn completion_wake_switching_fences_never_loses_a_wakeup() {
    loom::model(|| {
        let wake = Arc::new(CompletionWake::new());
        let (mut p, mut c) = plane(2);
        p.set_wake(Some(wake.clone()));
        let device = loom::thread::spawn(move || {
            assert!(p.push(0, rec(1)));
            p.publish();
            assert!(p.push(0, rec(2)));
            p.publish();
        });
        let mut got = Vec::new();
        let mut long = true;
        while got.len() < 2 {
            if c.drain_all(|_, r| got.push(r.compute_idx)) == 0 {
                if long {
                    wake.wait_long(None, || c.has_records());
                } else {
                    wake.wait(None, || c.has_records());
                }
                long = false;
            }
        }
        assert_eq!(got, [1, 2]);
        device.join().unwrap();
    });
}

/// Two waiters on one wake and two signalers: the device publishes a record, a harvester
/// thread consumes it and writes the owner's completion word, then signals the same wake
/// (the owner never sees the record itself). Both the harvester, waiting for the record, and
/// the owner, waiting for its completion word, must wake.
#[test]
fn completion_wake_harvester_wakes_the_owner() {
    loom::model(|| {
        let wake = Arc::new(CompletionWake::new());
        let done = Arc::new(AtomicU32::new(0));
        let (mut p, mut c) = plane(2);
        p.set_wake(Some(wake.clone()));
        let device = loom::thread::spawn(move || {
            assert!(p.push(1, rec(3)));
            p.publish();
        });
        let (w, d) = (wake.clone(), done.clone());
        let harvester = loom::thread::spawn(move || {
            let mut seen = 0;
            while seen == 0 {
                seen = c.drain_all(|_, _| {});
                if seen == 0 {
                    w.wait(None, || c.has_records());
                }
            }
            d.store(1, Ordering::Release);
            w.signal();
        });
        while done.load(Ordering::Acquire) == 0 {
            wake.wait(None, || done.load(Ordering::Acquire) != 0);
        }
        device.join().unwrap();
        harvester.join().unwrap();
    });
}

/// Per-execution wakes composed with the plane: the device ends execution 1 (pushes its
/// record, publishes, signals the wake of execution `signaled`); the execution's owner sleeps
/// on execution 1's own wake until records wait. With `signaled` = 1 it must wake; with
/// another execution's wake signaled the model must deadlock (the owner sleeps for ever).
fn execution_wake_model(signaled: u32) {
    loom::model(move || {
        let wakes = Arc::new(ExecutionWakes::new(2));
        let (mut p, mut c) = plane(2);
        p.set_execution_wakes(Some(wakes.clone()));
        let device = loom::thread::spawn(move || {
            assert!(p.push(0, rec(1)));
            p.publish_quietly();
            p.signal_execution(signaled);
        });
        let mut got = Vec::new();
        while got.is_empty() {
            if c.drain_all(|_, r| got.push(r.compute_idx)) == 0 {
                wakes.of(1).wait(None, || c.has_records());
            }
        }
        assert_eq!(got, [1]);
        device.join().unwrap();
    });
}

#[test]
fn execution_wake_wakes_the_owner_of_the_execution_that_ended() {
    execution_wake_model(1);
}

#[test]
#[should_panic(expected = "deadlock")]
fn execution_wake_of_another_execution_strands_the_owner() {
    execution_wake_model(0);
}

/// The harvest's side: the device publishes execution 1's record and signals the vcore's
/// wake and execution 1's; a harvester thread, blocked on the vcore's wake, consumes the
/// record, writes execution 1's completion word and signals that execution's wake
/// (`ExecutionWakes::signal_slots`, as `VCore::signal_completions` does). The owner, asleep
/// on its execution's wake until the completion word is written (it never sees the record
/// itself), must wake.
#[test]
fn execution_wake_harvester_wakes_the_owner() {
    loom::model(|| {
        let wake = Arc::new(CompletionWake::new());
        let wakes = Arc::new(ExecutionWakes::new(2));
        let done = Arc::new(AtomicU32::new(0));
        let (mut p, mut c) = plane(2);
        p.set_wake(Some(wake.clone()));
        p.set_execution_wakes(Some(wakes.clone()));
        let device = loom::thread::spawn(move || {
            assert!(p.push(1, rec(1)));
            p.publish();
            p.signal_execution(1);
        });
        let (w, ws, d) = (wake.clone(), wakes.clone(), done.clone());
        let harvester = loom::thread::spawn(move || {
            while c.drain_all(|_, _| {}) == 0 {
                w.wait(None, || c.has_records());
            }
            d.store(1, Ordering::Release);
            ws.signal_slots(1 << 1);
        });
        while done.load(Ordering::Acquire) == 0 {
            wakes.of(1).wait(None, || done.load(Ordering::Acquire) != 0);
        }
        device.join().unwrap();
        harvester.join().unwrap();
    });
}

/// The two cores of a lockstep execution finish their parts together: each publishes its
/// last record quietly and signals the shared wake only if the other part is finished too
/// (`LockstepParts::finish`). The caller, blocked on the wake until it has both records,
/// must wake: at least one core signals, after both records are visible. Fails (the caller
/// blocks forever) without the fence between a core's store and its loads.
#[test]
fn lockstep_last_part_wakes_the_waiter() {
    loom::model(|| {
        let wake = Arc::new(CompletionWake::new());
        let parts = Arc::new(LockstepParts::new(2));
        let mut consumers = Vec::new();
        let mut cores = Vec::new();
        for me in 0..2usize {
            let (mut p, c) = plane(2);
            p.set_wake(Some(wake.clone()));
            consumers.push(c);
            let parts = parts.clone();
            cores.push(loom::thread::spawn(move || {
                assert!(p.push(0, rec(me as u32)));
                p.publish_quietly();
                if parts.finish(me, 0, 2, 5) {
                    p.publish_and_signal();
                }
            }));
        }
        let mut got = [false; 2];
        while !(got[0] && got[1]) {
            let mut new = 0;
            for (i, c) in consumers.iter_mut().enumerate() {
                new += c.drain_all(|_, r| {
                    assert_eq!(r.compute_idx, i as u32);
                    got[i] = true;
                });
            }
            if new == 0 {
                let (a, b) = consumers.split_at(1);
                wake.wait(None, || {
                    (!got[0] && a[0].has_records()) || (!got[1] && b[0].has_records())
                });
            }
        }
        for t in cores {
            t.join().unwrap();
        }
    });
}

/// A caller registers an eventfd for execution 5 while its owner retires it: the eventfd is
/// signalled exactly once, whichever side sees the other. Fails (no signal) if either side
/// loads before its store is ordered — e.g. without the fence in `arm` or in `announce` —
/// and (two signals) if both sides could win.
#[test]
fn seq_event_signals_exactly_once() {
    loom::model(|| {
        let ev = Arc::new(SeqEvent::new());
        let retired = Arc::new(AtomicU32::new(0));
        let signals = Arc::new(AtomicU32::new(0));
        let owner = {
            let (ev, retired, signals) = (ev.clone(), retired.clone(), signals.clone());
            loom::thread::spawn(move || {
                retired.store(1, Ordering::Release);
                if let Some(fd) = ev.announce(5) {
                    assert_eq!(fd, 9);
                    signals.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        if let Some(fd) = ev.arm(5, 9, || retired.load(Ordering::Acquire) == 1) {
            assert_eq!(fd, 9);
            signals.fetch_add(1, Ordering::Relaxed);
        }
        owner.join().unwrap();
        assert_eq!(signals.load(Ordering::Relaxed), 1);
    });
}

/// The software core's poll vs its serving thread's park (`nrt_sim`: `CoreShared::work`,
/// `DeviceShared::hand_back`). A poll stores `doorbell_seen` when it starts and `active` when
/// it ends, under the core's lock; the serving device thread parks when neither says there
/// is work. A host thread that assists (polls the core itself) can hold the lock across the
/// server's check: the server then sees the doorbell consumed and the core not yet active
/// and parks, and no later doorbell wakes it. Hence the hand-back: a poller that does not
/// serve the core notifies the server's gate if it left work. Two requests behind one
/// doorbell; each poll runs at most one. With `hand_back` off the model fails — the host's
/// wait for both requests never ends — which is the lost wake-up
/// CI once showed as a 5 s timeout in `hostile fatal_implicit`.
fn assisted_core_model(hand_back: bool) {
    use loom::sync::Mutex;
    use loom::sync::atomic::AtomicBool;
    struct Core {
        gate: IdleGate,
        doorbell: AtomicU32,
        seen: AtomicU32,
        active: AtomicBool,
        ready: Mutex<u32>,
        done: AtomicU32,
        stop: AtomicBool,
    }
    impl Core {
        fn has_work(&self) -> bool {
            self.active.load(Ordering::Relaxed)
                || self.doorbell.load(Ordering::Acquire) != self.seen.load(Ordering::Relaxed)
        }
        fn work(&self, ready: &mut u32) {
            let bell = self.doorbell.load(Ordering::Acquire);
            let seen = self.seen.load(Ordering::Relaxed);
            if bell != seen {
                self.seen.store(bell, Ordering::Relaxed);
                *ready += bell - seen;
            }
            if *ready > 0 {
                *ready -= 1;
                self.done.fetch_add(1, Ordering::Release);
            }
            self.active.store(*ready > 0, Ordering::Relaxed);
        }
    }
    loom::model(move || {
        let core = Arc::new(Core {
            gate: IdleGate::new(),
            doorbell: AtomicU32::new(0),
            seen: AtomicU32::new(0),
            active: AtomicBool::new(false),
            ready: Mutex::new(0),
            done: AtomicU32::new(0),
            stop: AtomicBool::new(false),
        });
        let c = core.clone();
        let server = loom::thread::spawn(move || {
            c.gate.register_sleeper();
            while !c.stop.load(Ordering::Acquire) {
                match c.ready.try_lock() {
                    Ok(mut ready) => c.work(&mut ready),
                    // The host holds the core: a real thread polls again (the park
                    // below returns at once while a doorbell is pending); let it run.
                    Err(_) => loom::thread::yield_now(),
                }
                c.gate
                    .sleep_until(|| c.stop.load(Ordering::Acquire) || c.has_work());
            }
        });
        core.doorbell.fetch_add(2, Ordering::Release);
        core.gate.notify();
        // The host assists once.
        {
            let mut ready = core.ready.lock().unwrap();
            core.work(&mut ready);
        }
        if hand_back && core.has_work() {
            core.gate.notify();
        }
        // Both requests run (a stranded one spins this wait past loom's branch limit).
        while core.done.load(Ordering::Acquire) < 2 {
            loom::thread::yield_now();
        }
        core.stop.store(true, Ordering::Release);
        core.gate.notify();
        server.join().unwrap();
    });
}

/// A core a host thread serves (`Device::host_serves`: the implicit-async worker on a
/// 2-vCPU host, or a synchronous caller of a short model) vs the doorbell and the device thread's park (`nrt_sim`:
/// `semaphore_increment`, `host_serves`, `device_thread`). While the core is served a
/// doorbell does not wake the device thread, which parks; when the host thread releases the
/// core without having polled it, the request it did not run must reach the device thread.
/// The doorbell stores the bell, fences, and reads the served flag; the release clears the
/// flag, fences, and reads the bell — one of the two sees the other and notifies the gate.
/// Without the release's hand-back the model fails: the device thread sleeps through the
/// request.
fn host_served_core_model(hand_back: bool) {
    use loom::sync::atomic::{AtomicBool, fence};
    struct Core {
        gate: IdleGate,
        doorbell: AtomicU32,
        seen: AtomicU32,
        served: AtomicBool,
        done: AtomicU32,
        stop: AtomicBool,
    }
    impl Core {
        fn has_work(&self) -> bool {
            self.doorbell.load(Ordering::Acquire) != self.seen.load(Ordering::Relaxed)
        }
        fn for_device(&self) -> bool {
            !self.served.load(Ordering::Relaxed) && self.has_work()
        }
    }
    loom::model(move || {
        let core = Arc::new(Core {
            gate: IdleGate::new(),
            doorbell: AtomicU32::new(0),
            seen: AtomicU32::new(0),
            served: AtomicBool::new(true),
            done: AtomicU32::new(0),
            stop: AtomicBool::new(false),
        });
        let c = core.clone();
        let device = loom::thread::spawn(move || {
            c.gate.register_sleeper();
            while !c.stop.load(Ordering::Acquire) {
                if c.for_device() {
                    let bell = c.doorbell.load(Ordering::Acquire);
                    let seen = c.seen.load(Ordering::Relaxed);
                    c.seen.store(bell, Ordering::Relaxed);
                    c.done.fetch_add(bell - seen, Ordering::Release);
                }
                c.gate
                    .sleep_until(|| c.stop.load(Ordering::Acquire) || c.for_device());
            }
        });
        let c = core.clone();
        let client = loom::thread::spawn(move || {
            c.doorbell.fetch_add(1, Ordering::Release);
            fence(Ordering::SeqCst);
            if !c.served.load(Ordering::Relaxed) {
                c.gate.notify_fenced();
            }
        });
        // The serving host thread releases the core without having polled it.
        core.served.store(false, Ordering::Relaxed);
        if hand_back {
            fence(Ordering::SeqCst);
            if core.has_work() {
                core.gate.notify_fenced();
            }
        }
        client.join().unwrap();
        // The request runs (a stranded one spins this wait past loom's branch limit).
        while core.done.load(Ordering::Acquire) < 1 {
            loom::thread::yield_now();
        }
        core.stop.store(true, Ordering::Release);
        core.gate.notify();
        device.join().unwrap();
    });
}

/// A device thread's poll of a core that a host thread starts to serve (`nrt_sim`:
/// `CoreShared::poll_unserved`, `host_serves`; a synchronous caller serves its core, then
/// rings). The device thread decided to poll on a look at the flag taken before the host
/// thread set it; the host thread then sets the flag, fences and rings. Looking at the flag
/// again after the doorbell's acquire load, the device thread never takes that doorbell: the
/// request is the host thread's to run. `second_look: false` (the poll as it was) takes it.
fn served_doorbell_model(second_look: bool) {
    use loom::sync::atomic::{AtomicBool, fence};
    loom::model(move || {
        let served = Arc::new(AtomicBool::new(false));
        let doorbell = Arc::new(AtomicU32::new(0));
        let (s, d) = (served.clone(), doorbell.clone());
        let device = loom::thread::spawn(move || {
            // The look that decided to poll the core.
            if s.load(Ordering::Relaxed) {
                return false;
            }
            if d.load(Ordering::Acquire) == 0 {
                return false;
            }
            // Takes the doorbell unless the second look sees the core served.
            !(second_look && s.load(Ordering::Relaxed))
        });
        served.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        doorbell.fetch_add(1, Ordering::Release);
        assert!(
            !device.join().unwrap(),
            "the device thread took a doorbell rung under the serve flag"
        );
    });
}

#[test]
fn a_doorbell_rung_under_the_serve_flag_stays_with_the_serving_thread() {
    served_doorbell_model(true);
}

/// Without the look after the doorbell the device thread takes it.
#[test]
#[should_panic(expected = "took a doorbell rung under the serve flag")]
fn without_the_second_look_the_device_thread_takes_a_served_doorbell() {
    served_doorbell_model(false);
}

#[test]
fn released_host_served_core_hands_back_its_request() {
    host_served_core_model(true);
}

/// Without the release's hand-back the device thread sleeps through the request.
#[test]
#[should_panic(expected = "maximum number of branches")]
fn released_host_served_core_without_hand_back_strands_work() {
    host_served_core_model(false);
}

#[test]
fn assisted_core_hands_back_what_it_leaves() {
    assisted_core_model(true);
}

/// Without the hand-back the server sleeps through the second request.
#[test]
#[should_panic(expected = "maximum number of branches")]
fn assisted_core_without_hand_back_strands_work() {
    assisted_core_model(false);
}

/// A model's unload against a caller that validated just before it (`pipeline::bind` and
/// `unload_model` in nrt-runtime): the caller takes an I/O set (a bit of `free`), then reads
/// the model's state; the unload marks the state, then waits until every set is free and
/// frees the model's memory — `table` here, which a binder that saw the model loaded writes
/// (its set's descriptors). With the asymmetric fence pair between each side's store and
/// load, the two writes never race: either the binder sees the mark and hands its set back
/// untouched, or the unload sees the set taken and waits for it. `fences: false` drops the
/// pair (the model then finds the race).
fn bind_against_unload_model(fences: bool) {
    use loom::cell::UnsafeCell;
    use loom::sync::atomic::{AtomicU8, AtomicU64};
    const LOADED: u8 = 1;
    const UNLOADING: u8 = 2;
    struct Model {
        free: AtomicU64,
        state: AtomicU8,
        table: UnsafeCell<u32>,
    }
    // SAFETY (test): `table` is written under the protocol being checked; loom reports any
    // unsynchronized pair of accesses.
    unsafe impl Sync for Model {}
    loom::model(move || {
        let m = Arc::new(Model {
            free: AtomicU64::new(1),
            state: AtomicU8::new(LOADED),
            table: UnsafeCell::new(0),
        });
        let binder = {
            let m = m.clone();
            loom::thread::spawn(move || {
                if m.free
                    .compare_exchange(1, 0, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    if fences {
                        nrt_hal::sync::light_fence();
                    }
                    if m.state.load(Ordering::Relaxed) == LOADED {
                        // SAFETY (test): see above.
                        m.table.with_mut(|p| unsafe { *p = 7 }); // patch the set's descriptors
                    }
                    m.free.fetch_or(1, Ordering::Release);
                }
            })
        };
        m.state.store(UNLOADING, Ordering::Release);
        if fences {
            nrt_hal::sync::heavy_fence();
        }
        while m.free.load(Ordering::Acquire) != 1 {
            loom::thread::yield_now();
        }
        // SAFETY (test): see above.
        m.table.with_mut(|p| unsafe { *p = 0 }); // free the model's memory
        binder.join().unwrap();
    });
}

#[test]
fn bind_against_unload_never_writes_freed_memory() {
    bind_against_unload_model(true);
}

/// Without the fence pair the binder can read the state before the unload's mark while the
/// unload reads `free` before the binder's take: both go ahead.
#[test]
#[should_panic(expected = "Causality violation")]
fn bind_against_unload_without_fences_writes_freed_memory() {
    bind_against_unload_model(false);
}

/// A host thread that starts to serve a core (`host_serves(true)` in `nrt_sim`) against the
/// core's device thread parking without a timeout (`device_thread`: it does so only when no
/// core of its is served): the thread stores `parked_untimed`, its gate's fence follows, then
/// its condition reads the served flag; the host thread stores the flag, fences, then reads
/// `parked_untimed` and wakes the gate. One sees the other, so the device thread never sleeps
/// untimed beside a served core (where it would miss the work nobody polls). Without the
/// host thread's fence the model finds the thread asleep for good.
fn serve_start_model(fenced: bool) {
    use loom::sync::atomic::{AtomicBool, fence};
    loom::model(move || {
        let gate = Arc::new(IdleGate::new());
        let served = Arc::new(AtomicBool::new(false));
        let parked_untimed = Arc::new(AtomicBool::new(false));
        let awake = Arc::new(AtomicBool::new(false));
        let device = {
            let (gate, served, parked_untimed, awake) = (
                gate.clone(),
                served.clone(),
                parked_untimed.clone(),
                awake.clone(),
            );
            loom::thread::spawn(move || {
                gate.register_sleeper();
                parked_untimed.store(true, Ordering::Relaxed);
                gate.sleep_until(|| served.load(Ordering::Relaxed));
                parked_untimed.store(false, Ordering::Relaxed);
                awake.store(true, Ordering::Release);
            })
        };
        served.store(true, Ordering::Relaxed);
        if fenced {
            fence(Ordering::SeqCst);
        }
        if parked_untimed.load(Ordering::Relaxed) {
            gate.notify_fenced();
        }
        // Spin, not join: a thread parked for good then shows as a model that never ends
        // (loom's branch limit), not as a deadlock that aborts the test binary.
        while !awake.load(Ordering::Acquire) {
            loom::thread::yield_now();
        }
        device.join().unwrap();
    });
}

#[test]
fn serve_start_never_leaves_the_device_thread_parked_untimed() {
    serve_start_model(true);
}

#[test]
#[should_panic(expected = "maximum number of branches")]
fn serve_start_without_its_fence_leaves_the_device_thread_parked() {
    serve_start_model(false);
}

/// A synchronous caller queued behind the caller that serves its core ([`ServedCore`]): the
/// server runs the queued execution (its harvest writes the completion word, then signals)
/// and leaves — or, with `runs_it` false, leaves without running it. The queued caller,
/// blocked on the served wake (no spin), must come back with `Done` or `Left` — never sleep
/// through both stores. `signals` false: the server clears its claim with a bare store
/// (`claim(0)`), no signal — the model must then deadlock (the waiter sleeps for ever).
fn served_core_model(runs_it: bool, signals: bool) {
    loom::model(move || {
        let core = Arc::new(ServedCore::new());
        let done = Arc::new(AtomicU32::new(0));
        core.claim(1);
        let server = {
            let (core, done) = (core.clone(), done.clone());
            loom::thread::spawn(move || {
                if runs_it {
                    done.store(1, Ordering::Release);
                    core.signal();
                }
                if signals {
                    core.leave(1);
                } else {
                    core.claim(0);
                }
            })
        };
        let s = core.server();
        if s != 0 {
            let got = core.wait(s, std::time::Duration::ZERO, || {
                done.load(Ordering::Acquire) != 0
            });
            match got {
                Served::Done => assert!(runs_it),
                Served::Left => {}
                Served::Stalled => panic!("the served wait stalled without a timeout"),
            }
        }
        server.join().unwrap();
    });
}

#[test]
fn served_core_wakes_the_queued_caller_when_its_execution_is_done() {
    served_core_model(true, true);
}

#[test]
fn served_core_wakes_the_queued_caller_when_the_server_leaves() {
    served_core_model(false, true);
}

#[test]
#[should_panic(expected = "deadlock")]
fn served_core_left_without_a_signal_strands_the_queued_caller() {
    served_core_model(false, false);
}
