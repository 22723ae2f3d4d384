//! What the device's threads and the host-facing handle share ([`DeviceShared`]): memory,
//! the cores, the fault plan, the gates the threads park on, and the bookkeeping of lockstep
//! groups and of cores a host thread serves.

use crate::memory::Memory;
use crate::neuron_core::{CoreShared, ExecFaults, NOT_JOINT};
use crate::serve_mode::{Sample, ServeMode, ServeModeChooser};
use crate::{FaultKind, FaultSpec, SimConfig, tagged, timing_slot, untag};
use nrt_hal::{HalError, IdleGate};
use nrt_isa::GLOBAL_SEMAPHORES;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// State shared by the device's threads and the host-facing handle.
pub(crate) struct DeviceShared {
    pub(crate) config: SimConfig,
    pub(crate) mem: Memory,
    pub(crate) cores: Box<[CoreShared]>,
    /// Device-wide semaphores, `GLOBAL_SEMAPHORES` per lockstep group (keyed by the group's
    /// first core): `epoch << 32 | count`, where epoch is the execution's compute index.
    pub(crate) global: Box<[AtomicU64]>,
    /// Per lockstep group: `compute_idx + 1` of an execution one core aborted.
    pub(crate) group_abort: Box<[AtomicU64]>,
    /// Per core: `compute_idx + 1` of the last lockstep request it took off its exec rings
    /// (0: none since reset). Until every core of a group took an execution, a core waiting
    /// for a partner waits on the host, not on a hung device (see [`Self::group_taken`]).
    pub(crate) lockstep_taken: Box<[AtomicU64]>,
    /// Per core: `compute_idx + 1` of the lockstep execution it is running right now (its
    /// device thread is inside it and not stalled), 0 otherwise. A partner that computes is
    /// not hung: a core stalled at a barrier starts its watchdog only once no core of the
    /// group is busy (with a thread per core, a partner's long kernel — or its thread being
    /// preempted — is a wait, not a hang).
    pub(crate) lockstep_busy: Box<[AtomicU64]>,
    /// Per core: the lockstep execution whose part it last finished; the core whose part
    /// completes an execution signals the completion wake, the others publish quietly.
    pub(crate) lockstep_parts: nrt_hal::LockstepParts,
    /// Per core: how many polls advanced its lockstep execution (the hang watchdog of a
    /// stalled partner resets when this moves).
    pub(crate) lockstep_progress: Box<[AtomicU64]>,
    /// Per core, [`TIMING_SLOTS`] words by compute index: when it first ran its part of a
    /// lockstep execution, and that part's own running time once finished (`compute_idx <<
    /// 32 | µs`; µs of the device clock, wrapping). The last core to finish an execution
    /// measures it from these — with several executions in flight a core may have started
    /// (and finished) later ones by then.
    pub(crate) lockstep_started: Box<[AtomicU64]>,
    pub(crate) lockstep_part_busy: Box<[AtomicU64]>,
    /// Per lockstep group (by its first core): how its cores are served, chosen by
    /// measurement (`serve_mode`), and whether that is jointly now (read by the
    /// non-leader cores at the end of each part).
    pub(crate) serve_mode: Box<[Mutex<ServeModeChooser>]>,
    pub(crate) group_joint: Box<[AtomicBool]>,
    /// Per lockstep group: changes of its serving mode since its model was loaded (for the
    /// host view, [`Device::lockstep_serving`]).
    pub(crate) serve_changes: Box<[AtomicU64]>,
    /// Per device thread: blocked at a lockstep barrier (its gate's flag is then set, but it
    /// is not idle: [`SoftDevice::is_parked`] must not count it).
    pub(crate) stall_blocked: Box<[AtomicBool]>,
    /// Per device thread: parked without a timeout, so a host thread that starts to serve
    /// one of its cores must wake it ([`Device::host_serves`]; the thread then parks with
    /// one and still takes over work nobody polls).
    pub(crate) parked_untimed: Box<[AtomicBool]>,
    pub(crate) gates: Box<[IdleGate]>,
    /// Per core: a host thread serves it ([`Device::host_serves`]): the device's threads
    /// leave it alone and a doorbell does not wake them.
    pub(crate) host_served: Box<[AtomicBool]>,
    /// Cross-core events of lockstep executions: bumped (then every device thread's gate
    /// notified) on each change a stalled partner may wait for — a global semaphore change, a
    /// core taking a lockstep request, an abort. A device thread stalled at a barrier blocks
    /// until it changes.
    pub(crate) cross_core: AtomicU64,
    pub(crate) stop: AtomicBool,
    /// Device threads past their start-up (the constructor waits for all of them).
    pub(crate) threads_started: AtomicUsize,
    pub(crate) faults: Mutex<Vec<FaultSpec>>,
    pub(crate) has_faults: AtomicBool,
    /// Zero of the device clock.
    pub(crate) epoch: Instant,
}

impl DeviceShared {
    /// The device clock ([`Device::clock_ns`]).
    pub(crate) fn clock_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    pub(crate) fn kernel_memory(&self) -> nrt_kernels::DeviceMemory {
        // SAFETY: the mapping lives as long as `self`, which outlives every kernel call.
        unsafe { nrt_kernels::DeviceMemory::new(self.mem.base(), self.mem.len()) }
    }

    /// Announces a cross-core event (see `cross_core`) and wakes the device threads that
    /// sleep on one. A fence and a load per thread when none sleeps.
    #[inline]
    pub(crate) fn cross_core_event(&self) {
        self.cross_core.fetch_add(1, Ordering::Release);
        for g in self.gates.iter() {
            g.notify();
        }
    }

    pub(crate) fn global(&self, group: u32, index: u16) -> &AtomicU64 {
        &self.global[group as usize * GLOBAL_SEMAPHORES as usize + index as usize]
    }

    pub(crate) fn global_reached(&self, group: u32, index: u16, idx: u32, v: u32) -> bool {
        let x = self.global(group, index).load(Ordering::Acquire);
        let (epoch, count) = ((x >> 32) as u32, x as u32);
        (epoch == idx && count >= v) || (epoch.wrapping_sub(idx) as i32) > 0
    }

    pub(crate) fn global_add(&self, group: u32, index: u16, idx: u32, v: u32) {
        let g = self.global(group, index);
        let mut cur = g.load(Ordering::Relaxed);
        loop {
            let (epoch, count) = ((cur >> 32) as u32, cur as u32);
            let next = if epoch == idx {
                count.wrapping_add(v)
            } else {
                v
            };
            match g.compare_exchange_weak(
                cur,
                (idx as u64) << 32 | next as u64,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return self.cross_core_event(),
                Err(x) => cur = x,
            }
        }
    }

    pub(crate) fn global_set(&self, group: u32, index: u16, idx: u32, v: u32) {
        self.global(group, index)
            .store((idx as u64) << 32 | v as u64, Ordering::Release);
        self.cross_core_event();
    }

    pub(crate) fn abort_group(&self, group: u32, idx: u32) {
        self.group_abort[group as usize].store(idx as u64 + 1, Ordering::Release);
        self.cross_core_event();
    }

    pub(crate) fn group_aborted(&self, group: u32, idx: u32) -> bool {
        self.group_abort[group as usize].load(Ordering::Acquire) == idx as u64 + 1
    }

    /// Core `core` took lockstep request `idx` off its exec rings.
    pub(crate) fn lockstep_take(&self, core: u32, idx: u32) {
        self.lockstep_taken[core as usize].store(idx as u64 + 1, Ordering::Release);
        self.cross_core_event();
    }

    /// Core `core` runs lockstep execution `idx` now (`Some`), or left it (`None`).
    pub(crate) fn lockstep_busy(&self, core: u32, idx: Option<u32>) {
        self.lockstep_busy[core as usize].store(idx.map_or(0, |i| i as u64 + 1), Ordering::Release);
    }

    /// Whether a core of the group other than `me` is running execution `idx` right now.
    pub(crate) fn group_busy(&self, group: u32, count: u8, idx: u32, me: u32) -> bool {
        (group..group + count as u32).any(|c| {
            c != me
                && self
                    .lockstep_busy
                    .get(c as usize)
                    .is_some_and(|b| b.load(Ordering::Acquire) == idx as u64 + 1)
        })
    }

    /// A poll of `core`'s lockstep execution moved it (counted per core; the poller holds
    /// the core's lock, so a load and a store suffice).
    pub(crate) fn lockstep_progressed(&self, core: u32) {
        let p = &self.lockstep_progress[core as usize];
        p.store(p.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
    }

    /// Core `core` began its part of lockstep execution `idx` at `at` (device clock).
    pub(crate) fn lockstep_started(&self, core: u32, idx: u32, at: Duration) {
        self.lockstep_started[timing_slot(core, idx)].store(tagged(idx, at), Ordering::Relaxed);
    }

    /// Core `core` finished its part of lockstep execution `idx` after running `busy`.
    pub(crate) fn lockstep_part_busy(&self, core: u32, idx: u32, busy: Duration) {
        self.lockstep_part_busy[timing_slot(core, idx)].store(tagged(idx, busy), Ordering::Relaxed);
    }

    /// Whether lockstep group `group`'s cores are served jointly now (`serve_mode`).
    pub(crate) fn group_joint(&self, group: u32) -> bool {
        self.group_joint
            .get(group as usize)
            .is_some_and(|j| j.load(Ordering::Relaxed))
    }

    /// Sets which thread serves core `core` ([`NOT_JOINT`]: its own) and, on a change,
    /// wakes the threads to re-read who serves what (a sleeping one may now own work).
    pub(crate) fn set_joint_thread(&self, core: &CoreShared, thread: u32) {
        if core.set_joint_thread(thread) {
            for g in self.gates.iter() {
                g.notify();
            }
        }
    }

    /// A new model on lockstep group `group`: its serving mode is measured afresh.
    pub(crate) fn serve_mode_reset(&self, group: u32) {
        if let Some(m) = self.serve_mode.get(group as usize) {
            m.lock().unwrap_or_else(|e| e.into_inner()).reset();
            self.group_joint[group as usize].store(false, Ordering::Relaxed);
            self.serve_changes[group as usize].store(0, Ordering::Relaxed);
        }
    }

    /// The last core to finish lockstep execution `idx` of the group at `group` (`count`
    /// cores) measures it — wall time from the first part's start, the parts' summed own
    /// running time — for the group's serving mode (`serve_mode`), and applies a change.
    /// Only where the group's cores have threads of their own and a part is long enough
    /// for the choice to matter (short ones are joint anyway).
    #[cold]
    pub(crate) fn lockstep_finished(&self, group: u32, count: u8, idx: u32) {
        let threads = self.config.threads;
        let cores = group..group.saturating_add(count as u32);
        let Some(members) = self.cores.get(cores.start as usize..cores.end as usize) else {
            return;
        };
        let leader = group % threads;
        if members
            .iter()
            .all(|c| c.index % threads == leader || c.short_parts())
        {
            return;
        }
        let now = self.epoch.elapsed();
        let (mut wall, mut busy) = (0u32, 0u32);
        for c in cores.clone() {
            let slot = timing_slot(c, idx);
            let (si, start) = untag(self.lockstep_started[slot].load(Ordering::Relaxed));
            let (bi, b) = untag(self.lockstep_part_busy[slot].load(Ordering::Relaxed));
            if si != idx || bi != idx {
                // A core's record is of another execution (a reset; a core that ran
                // `TIMING_SLOTS` executions ahead): no sample.
                return;
            }
            wall = wall.max((now.as_micros() as u32).wrapping_sub(start));
            busy = busy.saturating_add(b);
        }
        let newest = cores
            .clone()
            .map(|c| self.lockstep_taken[c as usize].load(Ordering::Relaxed))
            .max()
            .unwrap_or(0)
            .saturating_sub(1) as u32;
        let Ok(mut chooser) = self.serve_mode[group as usize].try_lock() else {
            return; // another core finishing the same execution is at it
        };
        let sample = Sample {
            idx,
            wall_us: wall,
            busy_us: busy,
        };
        let Some(mode) = chooser.observe(sample, now.as_micros() as u64, newest) else {
            return;
        };
        let joint = mode == ServeMode::Joint;
        self.group_joint[group as usize].store(joint, Ordering::Relaxed);
        self.serve_changes[group as usize].fetch_add(1, Ordering::Relaxed);
        for c in members.iter().filter(|c| c.index % threads != leader) {
            let thread = if joint || c.short_parts() {
                leader
            } else {
                NOT_JOINT
            };
            self.set_joint_thread(c, thread);
        }
    }

    /// Whether a core of the group other than `me` advanced its lockstep part since `seen`
    /// (which it updates): a stalled core's watchdog must not count time in which its
    /// partner was making progress, even when no one was running the partner at the moment
    /// of the look (one thread serving both cores runs them in turns).
    pub(crate) fn group_progressed(&self, group: u32, count: u8, me: u32, seen: &mut u64) -> bool {
        let now = (group..group + count as u32)
            .filter(|&c| c != me)
            .filter_map(|c| self.lockstep_progress.get(c as usize))
            .fold(0u64, |a, p| a.wrapping_add(p.load(Ordering::Relaxed)));
        core::mem::replace(seen, now) != now
    }

    /// Whether every core of the lockstep group starting at `group` took execution `idx` (or
    /// a later one) off its exec rings. The host rings the cores one after the other, so a
    /// host thread preempted between two doorbells leaves the first core waiting at a
    /// barrier for as long as the preemption lasts; so does a partner still busy with earlier
    /// work. Neither is a hang: the watchdog only runs once this holds.
    pub(crate) fn group_taken(&self, group: u32, count: u8, idx: u32) -> bool {
        (group..group + count as u32).all(|c| {
            self.lockstep_taken.get(c as usize).is_none_or(|t| {
                let t = t.load(Ordering::Acquire);
                t != 0 && ((t - 1) as u32).wrapping_sub(idx) as i32 >= 0
            })
        })
    }

    /// The faults that fire on execution `n` of core `core`.
    pub(crate) fn faults_for(&self, core: u32, n: u64) -> ExecFaults {
        let mut f = ExecFaults::default();
        if !self.has_faults.load(Ordering::Relaxed) {
            return f;
        }
        let plan = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        for s in plan.iter().filter(|s| s.fires_on(core, n)) {
            let e = s.target_engine();
            match s.kind {
                FaultKind::Hang => f.hang = e,
                FaultKind::DropNotifications => {
                    f.drop_mask |= e.map_or(0x1F, |e| 1 << e.index());
                }
                FaultKind::Nan => f.nan = e,
                k => f.error = Some((k, e.unwrap_or(k.default_engine()))),
            }
        }
        f
    }

    pub(crate) fn core(&self, nc: u32) -> Result<&CoreShared, HalError> {
        self.cores.get(nc as usize).ok_or(HalError::BadCore(nc))
    }

    /// The device thread that serves core `c`: its own (`c % threads`), or its group
    /// leader's when the core is served jointly.
    #[inline]
    pub(crate) fn server_thread(&self, c: usize) -> usize {
        self.cores[c].joint_thread().unwrap_or(c % self.gates.len())
    }

    /// After a thread that does not serve core `c` polled it and changed its state (a host
    /// thread's assist, or a device thread covering for a sleeping one; a poll that only
    /// found the core still stalled changed nothing and hands nothing back, or a stalled
    /// core's two pollers would wake each other in turn): hands what the poll left — requests it
    /// moved to the ready queue, an execution stalled at a barrier — back to the core's own
    /// thread. That thread may have parked while the poll held the core: it saw the
    /// doorbell already consumed (`doorbell_seen` is stored first) and the core not yet
    /// marked active (stored last), and no doorbell follows to wake it. The store of
    /// `active` and [`IdleGate::notify`]'s fence pair with the sleeper's flag store and
    /// fence (the gate's Dekker handshake), so one of the two sees the other.
    #[inline]
    pub(crate) fn hand_back(&self, c: usize) {
        if self.cores[c].has_work() {
            self.gates[self.server_thread(c)].notify();
        }
    }
}
