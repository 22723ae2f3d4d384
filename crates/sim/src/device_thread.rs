//! The device threads: each polls the cores it serves while they have work, spins a bounded
//! time after the last of it, then parks until a doorbell; a core a host thread serves but
//! leaves is taken over ([`take_over_stale`]). Started by [`crate::SoftDevice::new`], one per
//! [`crate::SimConfig::threads`].

use crate::DeviceShared;
use crate::neuron_core::Poll;
use nrt_hal::tuning;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Runs a device thread: polls its cores while they have work, spins a bounded time after
/// the last of it, then parks until a doorbell. An execution stalled at a lockstep barrier
/// (its partner core runs on another thread, or has not been rung yet) is polled for
/// [`tuning::DEVICE_STALL_SPIN`], then the thread blocks until a cross-core event or a
/// doorbell — never spinning for long on a vCPU the partner may need.
pub(crate) fn device_thread(dev: Arc<DeviceShared>, worker: usize) {
    let gate = &dev.gates[worker];
    gate.register_sleeper();
    let all: Vec<usize> = (0..dev.cores.len()).collect();
    // Whether this thread polls core `c` now: it serves it (its own core, unless the core is
    // served jointly by its group leader's thread; or a core it serves jointly), or the core
    // has work and the thread that serves it sleeps. Any thread may poll any core — the
    // core's lock makes one at a time — so a stale view costs a wasted poll, never lost work.
    let serves = |c: usize| -> bool {
        if dev.host_served[c].load(Ordering::Relaxed) {
            return false;
        }
        let server = dev.server_thread(c);
        server == worker || (dev.cores[c].has_work() && dev.gates[server].is_sleeping())
    };
    // The cores this thread serves by default, and their work-poll counts when it last
    // looked while a host thread served them ([`take_over_stale`]).
    let mine: Vec<usize> = all
        .iter()
        .copied()
        .filter(|&c| c % dev.gates.len() == worker)
        .collect();
    let mut served_polls: Vec<u64> = vec![u64::MAX; mine.len()];
    // Their work-poll counts when this thread last parked with a timeout, and whether a host
    // thread served one of them over that park (flag seen set, or a count moved while this
    // thread slept: nobody else polls them then but a host thread): the thread then keeps
    // parking with a timeout.
    let mut parked_polls: Vec<u64> = vec![0; mine.len()];
    let mut serving_seen = false;
    // Any thread may run any core's instructions (above): its kernels' per-thread state is
    // set up now, not on the first product it happens to run.
    nrt_kernels::matmul::prepare_thread();
    dev.threads_started.fetch_add(1, Ordering::Release);
    let stall_block = tuning::DEVICE_STALL_BLOCK_MAX
        .min(dev.config.hang_watchdog / 4)
        .max(Duration::from_micros(100));
    // When work was last seen. Reading the clock costs ~30 ns here, as much as a poll, so it
    // is read only every 64 idle polls: `worked` says whether work came since that reading.
    let mut last_work = Instant::now();
    // When the idle or stalled polls last yielded the vCPU (checked with the clock above).
    let mut last_yield = last_work;
    let mut worked = false;
    let mut idle_polls = 0u32;
    // Polls that found only stalled executions, and when the stall began (read every 64).
    let mut stalled_polls = 0u32;
    let mut stalled_since: Option<Instant> = None;
    while !dev.stop.load(Ordering::Acquire) {
        // Read before polling: an event after this wakes a block below.
        let events = dev.cross_core.load(Ordering::Acquire);
        let mut progressed = false;
        let mut stalled = false;
        for &c in &all {
            if !serves(c) {
                continue;
            }
            let poll = dev.cores[c].poll_unserved(&dev);
            match poll {
                Poll::Progressed => progressed = true,
                Poll::Stalled => stalled = true,
                Poll::Idle => {}
            }
            if poll == Poll::Progressed && dev.server_thread(c) != worker {
                dev.hand_back(c);
            }
        }
        if progressed {
            idle_polls = 0;
            stalled_polls = 0;
            stalled_since = None;
            worked = true;
            continue;
        }
        std::hint::spin_loop();
        if stalled {
            // An execution is in flight but waits for its partner core (the watchdog bounds
            // the wait once the partner took it). Spin a little, yielding now and then, then
            // block until the partner does something.
            worked = true;
            stalled_polls = stalled_polls.wrapping_add(1);
            if stalled_polls.is_multiple_of(tuning::CLOCK_READ_EVERY_POLLS) {
                let now = Instant::now();
                if now.duration_since(last_yield) >= tuning::DEVICE_IDLE_YIELD_PERIOD {
                    std::thread::yield_now();
                    last_yield = now;
                }
                let since = *stalled_since.get_or_insert(now);
                if now.duration_since(since) >= tuning::DEVICE_STALL_SPIN {
                    dev.stall_blocked[worker].store(true, Ordering::Relaxed);
                    gate.sleep_until_timeout(stall_block, || {
                        dev.stop.load(Ordering::Acquire)
                            || dev.cross_core.load(Ordering::Acquire) != events
                            || all
                                .iter()
                                .any(|&c| dev.cores[c].doorbell_pending() && serves(c))
                    });
                    dev.stall_blocked[worker].store(false, Ordering::Relaxed);
                }
            }
            continue;
        }
        stalled_polls = 0;
        stalled_since = None;
        idle_polls += 1;
        if idle_polls.is_multiple_of(tuning::CLOCK_READ_EVERY_POLLS) {
            let now = Instant::now();
            if now.duration_since(last_yield) >= tuning::DEVICE_IDLE_YIELD_PERIOD {
                std::thread::yield_now();
                last_yield = now;
            }
            if core::mem::take(&mut worked) {
                last_work = now;
            } else if now.duration_since(last_work) >= dev.config.spin_after_work {
                let asleep = || {
                    dev.stop.load(Ordering::Acquire)
                        || all.iter().any(|&c| dev.cores[c].has_work() && serves(c))
                };
                let served_now = || {
                    mine.iter()
                        .any(|&c| dev.host_served[c].load(Ordering::Relaxed))
                };
                if served_now() || serving_seen {
                    // A host thread serves one of this thread's cores, or did over the last
                    // look's period (a synchronous caller serves a core only during each of
                    // its calls): wake now and then to see that it still does
                    // ([`take_over_stale`]).
                    for (p, &c) in parked_polls.iter_mut().zip(&mine) {
                        *p = dev.cores[c].work_polls();
                    }
                    gate.sleep_until_timeout(
                        dev.config.host_served_check.max(Duration::from_micros(100)),
                        asleep,
                    );
                    let now = Instant::now();
                    let look = take_over_stale(&dev, &mine, &mut served_polls, &parked_polls);
                    serving_seen = look.moved || served_now();
                    last_work = if look.took {
                        now
                    } else {
                        // Nothing to take over: back to sleep at the next look (64 idle
                        // polls), not after another `spin_after_work` of spinning beside the
                        // host thread that serves the core.
                        now.checked_sub(dev.config.spin_after_work).unwrap_or(now)
                    };
                } else {
                    // Parked without a timeout: a host thread that starts to serve one of
                    // these cores wakes it (`host_serves` reads this flag after its own
                    // store and a fence; `sleep_until`'s fence orders this store before the
                    // condition's loads), and it then parks with one, above.
                    dev.parked_untimed[worker].store(true, Ordering::Relaxed);
                    gate.sleep_until(|| asleep() || served_now());
                    dev.parked_untimed[worker].store(false, Ordering::Relaxed);
                    serving_seen = served_now();
                    let now = Instant::now();
                    last_work = if serving_seen && !asleep() {
                        // Woken only to park again with a timeout (a host thread serves one
                        // of these cores now, `host_serves`): at the next look, not after a
                        // `spin_after_work` of spinning — beside a busy co-tenant that spin
                        // (yielding every `DEVICE_IDLE_YIELD_PERIOD`) kept the thread off its
                        // park for milliseconds, competing for the vCPUs of the host thread
                        // that does the work.
                        now.checked_sub(dev.config.spin_after_work).unwrap_or(now)
                    } else {
                        now
                    };
                }
            }
        }
    }
}

/// The device thread's side of [`Device::host_serves`]: a core a host thread serves but
/// whose work nobody took since the last look ([`SimConfig::host_served_check`] ago) —
/// the host thread is inside a long callback, preempted, or gone — is polled here until it
/// has nothing left. `seen[i]` is core `mine[i]`'s work-poll count at the last look while
/// it was served; `parked[i]` its count when this thread parked.
#[cold]
fn take_over_stale(
    dev: &DeviceShared,
    mine: &[usize],
    seen: &mut [u64],
    parked: &[u64],
) -> StaleLook {
    let mut look = StaleLook {
        took: false,
        moved: false,
    };
    for (i, &c) in mine.iter().enumerate() {
        let core = &dev.cores[c];
        let polls = core.work_polls();
        look.moved |= polls != parked[i];
        if !dev.host_served[c].load(Ordering::Relaxed) {
            seen[i] = u64::MAX;
            continue;
        }
        if core.has_work() && polls == seen[i] {
            look.took = true;
            while core.poll(dev) == Poll::Progressed {}
        }
        seen[i] = core.work_polls();
    }
    look
}

/// What [`take_over_stale`] found.
struct StaleLook {
    /// It ran work nobody took.
    took: bool,
    /// A core's work-poll count moved while the thread slept (a host thread polled it).
    moved: bool,
}
