//! How a thread waits for the device between harvest steps (the wait policy). Every waiting
//! loop of the runtime — a synchronous caller, an explicit `wait`, the XU worker, a drain or
//! unload, a tensor read under implicit async — drives the harvest and calls
//! [`Backoff::snooze`] after a step that found nothing.

use nrt_hal::tuning;
use std::time::Instant;

/// How a thread waits between steps: bounded spin, then yield, then short sleeps — each
/// bound in [`tuning`].
pub(crate) struct Backoff {
    start: Option<Instant>,
    polls: u32,
}

impl Backoff {
    pub(crate) const fn new() -> Backoff {
        Backoff {
            start: None,
            polls: 0,
        }
    }

    /// Called after a step that found nothing: a short pure spin (a near-null execution
    /// completes within it, with no syscall), then spinning with a `sched_yield` every few
    /// polls (if the device thread shares our vCPU it runs at once), then short sleeps.
    #[inline]
    pub(crate) fn snooze(&mut self) {
        self.polls = self.polls.wrapping_add(1);
        if self.polls < tuning::HARVEST_PURE_SPIN_POLLS
            || !self.polls.is_multiple_of(tuning::HARVEST_YIELD_EVERY_POLLS)
        {
            std::hint::spin_loop();
            return;
        }
        let start = *self.start.get_or_insert_with(Instant::now);
        if start.elapsed() < tuning::HARVEST_SPIN + tuning::HARVEST_YIELD {
            std::thread::yield_now();
        } else {
            std::thread::sleep(tuning::HARVEST_SLEEP);
            self.polls = tuning::HARVEST_YIELD_EVERY_POLLS - 1; // look again right after a sleep
        }
    }
}
