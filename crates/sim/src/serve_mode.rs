//! How a lockstep group's cores are served: in **parallel** (each core by its own device
//! thread) or **jointly** (the group leader's thread runs every core's part, in turns),
//! chosen by measuring both.
//!
//! On a quiet 2-vCPU host a two-core `encoder` runs in parallel at 0.54× of one thread's
//! time. Beside one busy co-tenant process the same model ran *slower* in parallel than on
//! one thread (`nrt bench encoder --cores 2` under `cotenant.sh`: 321–335 executions/s
//! with p99 10–12 ms on two threads, 398–433/s with p99 2.7 ms on one): three runnable
//! threads share two vCPUs, and each time the scheduler deschedules one core's thread
//! (for milliseconds), its partner waits at the next barrier — work that one thread would
//! simply have done.
//!
//! So the last core to finish each execution measures it — what it cost (its wall time from
//! the first part's start, or, with several in flight, the interval since the previous one
//! finished if shorter: a thread serving both cores interleaves consecutive executions, so
//! each spans several intervals), and the parts' own running times (stalls at barriers
//! excluded), summed — and the group's [`ServeModeChooser`] keeps the last 16 in the current
//! mode:
//!
//! - **parallel → joint** when parallel serving does not pay: the median execution's wall
//!   time is at least [`tuning::SERVE_MODE_PROBE_RATIO_PERCENT`] of its summed parts (50% is
//!   a perfect split of two; a quiet host runs `encoder` at 53%, `mlp_b64` at 50%; beside a
//!   co-tenant `encoder` read 103%: its parts ran one after the other). It then tries the
//!   joint mode for [`tuning::SERVE_MODE_PROBE_PARTS`] executions and keeps it unless it is
//!   clearly slower — at the same median it still saves the tail of descheduled partners.
//! - **joint → parallel** by probing parallel at intervals that double while joint stays
//!   better ([`tuning::SERVE_MODE_PROBE_MIN`] to [`tuning::SERVE_MODE_PROBE_MAX`]), taken
//!   only when clearly faster ([`tuning::SERVE_MODE_SWITCH_GAIN_PERCENT`]).
//!
//! Measured with `scripts/ab_binaries.sh OLD NEW 8 1 mlp_b64_2c,encoder_2c,cotenant_2c`
//! (paired, 2 vCPUs; two runs, as the host's phases move the unpaired figures): beside one
//! busy co-tenant `encoder --cores 2` ran 1.05× and 1.41× the executions per second with
//! p99 0.28× and 0.32× (10.5 → 3.0 ms; 8 of 8 pairs lower), `mlp_b64 --cores 2` 1.01× and
//! 1.12× with p99 0.39×; on the quiet host `mlp_b64 --cores 2` and `encoder --cores 2` read
//! 0.98× and 1.00× in median latency (within noise: the host's own busy phases send a group
//! joint too, for up to a probe interval). Short parts are served jointly
//! regardless ([`tuning::DEVICE_JOINT_PART_MAX`]); this chooser decides the long ones.
//!
//! Pure bookkeeping: no clock, no atomics (the device calls it under a lock with the
//! device clock's reading), so its decisions are unit-tested on made-up timelines.

use nrt_hal::tuning;

/// A lockstep group's serving mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ServeMode {
    /// Each core's part on its own device thread.
    Parallel,
    /// Every core's part on the group leader's device thread.
    Joint,
}

impl ServeMode {
    fn other(self) -> Self {
        match self {
            Self::Parallel => Self::Joint,
            Self::Joint => Self::Parallel,
        }
    }
}

/// Samples kept of the current mode: the median of their wall times is what a probe must
/// beat, the median of their ratios says whether parallel serving pays. 16 executions: a
/// scheduling hiccup on a quiet host (a kernel thread, a page fault storm) stretches a few
/// consecutive ones, and a probe that costs double is not worth taking for it.
const RECENT: usize = 16;
const PROBE: usize = tuning::SERVE_MODE_PROBE_PARTS;

/// One finished lockstep execution, as the device measured it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sample {
    /// The execution's compute index.
    pub idx: u32,
    /// From the first part's start to the last part's end, in µs (the chooser costs an
    /// execution at the least of this and the interval since the previous one finished).
    pub wall_us: u32,
    /// The parts' own running times (stalls at barriers excluded), summed, in µs.
    pub busy_us: u32,
}

/// The chooser of one lockstep group (module docs).
#[derive(Debug)]
pub(crate) struct ServeModeChooser {
    /// The mode measurement chose.
    mode: ServeMode,
    /// The mode executions run in now (`mode`, or the other one while probing).
    running: ServeMode,
    /// The last [`RECENT`] samples in `mode`: wall times, and wall × 256 / busy.
    recent_wall: [u32; RECENT],
    recent_ratio: [u32; RECENT],
    recent_len: usize,
    recent_next: usize,
    /// Wall times of the probe in progress.
    probe: [u32; PROBE],
    probe_len: usize,
    /// When the next probe may start, and the wait after it (µs of the device clock).
    next_probe_us: u64,
    interval_us: u64,
    /// Executions up to this compute index were started before the last change of mode
    /// (or were in flight at it): their samples are of neither mode and are dropped.
    settle_idx: Option<u32>,
    /// The last execution sampled, and when it finished (µs of the device clock).
    last_idx: Option<u32>,
    last_finish_us: Option<u64>,
}

impl Default for ServeModeChooser {
    fn default() -> Self {
        Self {
            mode: ServeMode::Parallel,
            running: ServeMode::Parallel,
            recent_wall: [0; RECENT],
            recent_ratio: [0; RECENT],
            recent_len: 0,
            recent_next: 0,
            probe: [0; PROBE],
            probe_len: 0,
            next_probe_us: 0,
            interval_us: tuning::SERVE_MODE_PROBE_MIN.as_micros() as u64,
            settle_idx: None,
            last_idx: None,
            last_finish_us: None,
        }
    }
}

/// The median of a short list (the upper one of an even count).
fn median<const N: usize>(xs: &[u32]) -> u32 {
    let mut v = [0u32; N];
    let v = &mut v[..xs.len()];
    v.copy_from_slice(xs);
    v.sort_unstable();
    v[v.len() / 2]
}

impl ServeModeChooser {
    /// The mode executions should run in now.
    #[cfg(test)]
    pub(crate) fn running(&self) -> ServeMode {
        self.running
    }

    /// Forgets what was measured (a new model on the group): parallel, as at start.
    pub(crate) fn reset(&mut self) {
        *self = Self::default();
    }

    /// Takes one finished execution's sample, at `now_us` on the device clock;
    /// `newest_taken` is the highest compute index any core of the group has taken (what
    /// is in flight at a change of mode). Returns the new running mode when it changes.
    pub(crate) fn observe(
        &mut self,
        s: Sample,
        now_us: u64,
        newest_taken: u32,
    ) -> Option<ServeMode> {
        // Each execution once (two cores finishing it at the same moment may both report).
        if self
            .last_idx
            .is_some_and(|l| (s.idx.wrapping_sub(l) as i32) <= 0)
        {
            return None;
        }
        self.last_idx = Some(s.idx);
        // What an execution costs: its wall time, or — with several in flight, when one
        // finishes every interval while each spans several (a thread serving both cores
        // interleaves two executions) — the interval since the previous one finished.
        let interval = self
            .last_finish_us
            .map_or(u64::MAX, |t| now_us.saturating_sub(t));
        self.last_finish_us = Some(now_us);
        if let Some(settle) = self.settle_idx {
            if (s.idx.wrapping_sub(settle) as i32) <= 0 {
                return None;
            }
            self.settle_idx = None;
        }
        let wall = (u64::from(s.wall_us).min(interval) as u32).max(1);
        if self.running != self.mode {
            // Probing the other mode.
            self.probe[self.probe_len] = wall;
            self.probe_len += 1;
            if self.probe_len < PROBE {
                return None;
            }
            let probed = median::<PROBE>(&self.probe);
            let current = median::<RECENT>(&self.recent_wall[..self.recent_len]);
            self.probe_len = 0;
            let (probed, current) = (u64::from(probed), u64::from(current));
            let gain = tuning::SERVE_MODE_SWITCH_GAIN_PERCENT;
            let take = match self.running {
                // Parallel serving was not paying (the probe's condition): one thread doing
                // the same work is taken unless clearly slower. The median does not show
                // what it saves — the milliseconds of the executions whose partner thread
                // was descheduled, the tail — but they are the reason to switch.
                ServeMode::Joint => probed * 100 <= current * (100 + gain),
                // Back to a thread per core only where that is clearly faster.
                ServeMode::Parallel => probed * 100 < current * (100 - gain),
            };
            if take {
                // It is the mode now, its samples the recent ones.
                self.mode = self.running;
                self.recent_wall[..PROBE].copy_from_slice(&self.probe);
                self.recent_ratio[..PROBE].fill(0);
                self.recent_len = PROBE;
                self.recent_next = PROBE % RECENT;
                self.interval_us = tuning::SERVE_MODE_PROBE_MIN.as_micros() as u64;
                self.next_probe_us = now_us.saturating_add(self.interval_us);
                return None;
            }
            // Back to the chosen mode; try again after twice as long.
            self.interval_us =
                (self.interval_us * 2).min(tuning::SERVE_MODE_PROBE_MAX.as_micros() as u64);
            self.next_probe_us = now_us.saturating_add(self.interval_us);
            return Some(self.switch_to(self.mode, newest_taken));
        }
        self.recent_wall[self.recent_next] = wall;
        self.recent_ratio[self.recent_next] =
            ((u64::from(wall) << 8) / u64::from(s.busy_us.max(1))).min(u32::MAX as u64) as u32;
        self.recent_next = (self.recent_next + 1) % RECENT;
        self.recent_len = (self.recent_len + 1).min(RECENT);
        if self.recent_len < RECENT || now_us < self.next_probe_us {
            return None;
        }
        if self.mode == ServeMode::Parallel {
            // Parallel serving that pays (wall well under the parts' summed work) is not
            // worth a probe of the joint mode.
            let ratio = median::<RECENT>(&self.recent_ratio[..self.recent_len]);
            if ratio < (tuning::SERVE_MODE_PROBE_RATIO_PERCENT << 8) / 100 {
                return None;
            }
        }
        Some(self.switch_to(self.mode.other(), newest_taken))
    }

    fn switch_to(&mut self, mode: ServeMode, newest_taken: u32) -> ServeMode {
        self.running = mode;
        self.probe_len = 0;
        self.settle_idx = Some(newest_taken);
        mode
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `n` executions of `wall` µs (parts' summed work `busy`), one per `wall`, from
    /// `*idx` and `*now`; returns every change of mode.
    fn run(
        c: &mut ServeModeChooser,
        idx: &mut u32,
        now: &mut u64,
        n: usize,
        wall: impl Fn(ServeMode) -> (u32, u32),
    ) -> Vec<ServeMode> {
        let mut changes = Vec::new();
        for _ in 0..n {
            let (w, b) = wall(c.running());
            *now += u64::from(w);
            *idx += 1;
            if let Some(m) = c.observe(
                Sample {
                    idx: *idx,
                    wall_us: w,
                    busy_us: b,
                },
                *now,
                *idx,
            ) {
                changes.push(m);
            }
        }
        changes
    }

    #[test]
    fn a_split_that_pays_stays_parallel_and_never_probes() {
        let mut c = ServeModeChooser::default();
        let (mut idx, mut now) = (0, 0);
        // Quiet host: 1,100 µs in parallel for 2,000 µs of work (ratio 0.55).
        let changes = run(&mut c, &mut idx, &mut now, 10_000, |_| (1_100, 2_000));
        assert!(changes.is_empty(), "{changes:?}");
        assert_eq!(c.running(), ServeMode::Parallel);
    }

    #[test]
    fn a_contended_split_goes_joint_and_comes_back_when_the_host_is_quiet() {
        let mut c = ServeModeChooser::default();
        let (mut idx, mut now) = (0, 0);
        // A co-tenant: parallel executions wait on descheduled partners (3,000 µs for
        // 2,200 of work), one thread does them in 2,300.
        let contended = |m: ServeMode| match m {
            ServeMode::Parallel => (3_000, 2_200),
            ServeMode::Joint => (2_300, 2_300),
        };
        let changes = run(&mut c, &mut idx, &mut now, 200, contended);
        assert_eq!(changes.first(), Some(&ServeMode::Joint), "{changes:?}");
        assert_eq!(c.mode, ServeMode::Joint);
        // While it lasts, parallel is probed at intervals that double up to the cap: a few
        // probes over 20 s, each back to joint.
        let before = now;
        let changes = run(&mut c, &mut idx, &mut now, 10_000, contended);
        let probes = changes
            .iter()
            .filter(|&&m| m == ServeMode::Parallel)
            .count();
        let max_probes = (now - before) / tuning::SERVE_MODE_PROBE_MAX.as_micros() as u64 + 6;
        assert!(
            probes >= 3 && probes as u64 <= max_probes,
            "{probes} probes in {} µs",
            now - before
        );
        assert_eq!(c.mode, ServeMode::Joint);
        assert_eq!(c.running(), ServeMode::Joint);
        // The co-tenant leaves: the next probe finds parallel faster and keeps it.
        let quiet = |m: ServeMode| match m {
            ServeMode::Parallel => (1_200, 2_200),
            ServeMode::Joint => (2_200, 2_200),
        };
        run(&mut c, &mut idx, &mut now, 3_000, quiet);
        assert_eq!(c.mode, ServeMode::Parallel);
        assert_eq!(c.running(), ServeMode::Parallel);
    }

    #[test]
    fn a_split_that_does_not_pay_goes_joint_even_at_the_same_median() {
        // Beside a co-tenant the two parts of a parallel execution ran one after the other
        // (wall = their summed work, `nrt bench encoder --cores 2`), at the joint mode's
        // median, with a tail of descheduled partners that the median does not show.
        let mut c = ServeModeChooser::default();
        let (mut idx, mut now) = (0, 0);
        run(&mut c, &mut idx, &mut now, 200, |_| (2_600, 2_550));
        assert_eq!(c.mode, ServeMode::Joint);
        // And a parallel probe only 5% faster does not bring it back.
        run(&mut c, &mut idx, &mut now, 5_000, |m| match m {
            ServeMode::Parallel => (2_470, 2_550),
            ServeMode::Joint => (2_600, 2_600),
        });
        assert_eq!(c.mode, ServeMode::Joint);
    }

    #[test]
    fn a_joint_probe_clearly_slower_than_a_weak_split_changes_nothing() {
        let mut c = ServeModeChooser::default();
        let (mut idx, mut now) = (0, 0);
        // Parallel does not pay by the ratio (0.85) but one thread is 30% slower: probes,
        // no switch.
        let changes = run(&mut c, &mut idx, &mut now, 5_000, |m| match m {
            ServeMode::Parallel => (1_700, 2_000),
            ServeMode::Joint => (2_210, 2_210),
        });
        assert!(
            changes.contains(&ServeMode::Joint),
            "it probed: {changes:?}"
        );
        assert_eq!(c.mode, ServeMode::Parallel);
        assert_eq!(c.running(), ServeMode::Parallel);
    }

    #[test]
    fn executions_in_flight_at_a_change_are_not_counted_for_the_new_mode() {
        let mut c = ServeModeChooser::default();
        let (mut idx, mut now) = (0, 0);
        assert!(run(&mut c, &mut idx, &mut now, RECENT - 1, |_| (3_000, 2_000)).is_empty());
        idx += 1;
        // Eight executions were already taken when the probe starts.
        let m = c.observe(
            Sample {
                idx,
                wall_us: 3_000,
                busy_us: 2_000,
            },
            now,
            idx + 8,
        );
        assert_eq!(m, Some(ServeMode::Joint));
        // Their samples (slow, still parallel) are dropped: the probe sees only its own.
        for _ in 0..8 {
            idx += 1;
            let s = Sample {
                idx,
                wall_us: 3_000,
                busy_us: 2_000,
            };
            assert_eq!(c.observe(s, now, idx), None);
        }
        assert_eq!(c.probe_len, 0);
        run(&mut c, &mut idx, &mut now, PROBE, |_| (2_000, 2_000));
        assert_eq!(c.mode, ServeMode::Joint);
    }

    #[test]
    fn executions_in_flight_are_costed_by_the_interval_between_finishes() {
        // Four in flight: one execution finishes every `step` µs. Parallel beside a
        // co-tenant: one per 3,000 µs, each spanning one step; joint: one per 2,500, each
        // spanning three (one thread serving both cores interleaves consecutive
        // executions), as `encoder --cores 2` at implicit depth 4 measured.
        let mut c = ServeModeChooser::default();
        let (mut idx, mut now) = (0u32, 0u64);
        let mut changes = Vec::new();
        for _ in 0..3_000 {
            let (step, busy, spans): (u32, u32, u32) = match c.running() {
                ServeMode::Parallel => (3_000, 2_900, 1),
                ServeMode::Joint => (2_500, 2_500, 3),
            };
            now += u64::from(step);
            idx += 1;
            let s = Sample {
                idx,
                wall_us: spans * step,
                busy_us: busy,
            };
            changes.extend(c.observe(s, now, idx + 3));
            // The same execution reported twice (both cores saw it finished) counts once.
            assert_eq!(c.observe(s, now, idx + 3), None);
        }
        // By wall time joint (7,500) would lose to parallel (3,000); by what an execution
        // costs it wins, and the parallel probes do not bring parallel back.
        assert_eq!(changes.first(), Some(&ServeMode::Joint), "{changes:?}");
        assert_eq!(c.mode, ServeMode::Joint);
    }

    #[test]
    fn reset_forgets_the_choice() {
        let mut c = ServeModeChooser::default();
        let (mut idx, mut now) = (0, 0);
        run(&mut c, &mut idx, &mut now, 200, |m| match m {
            ServeMode::Parallel => (3_000, 2_000),
            ServeMode::Joint => (2_000, 2_000),
        });
        assert_eq!(c.running(), ServeMode::Joint);
        c.reset();
        assert_eq!(c.running(), ServeMode::Parallel);
    }
}
