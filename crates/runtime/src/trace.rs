//! Tracing: per-stage spans of every execution (validate, bind, stage, doorbell, harvest)
//! recorded into a ring allocated when tracing is turned on.
//!
//! The execution path checks one flag once ([`Trace::enabled`]) and runs either the plain
//! pipeline or the same pipeline instantiated with timestamping ([`Stamps`]); with tracing
//! off, the cost is that one predictable branch and no clock reads. With tracing on, the five
//! spans of an execution are appended under the ring's lock, into memory allocated when
//! tracing was enabled: recording allocates nothing.

use nrt_hal::tuning;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// A stage of the pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    /// State guard, I/O set checks.
    Validate,
    /// I/O set acquisition, host clones, descriptor patches.
    Bind,
    /// Request + trigger pairs under the staging lock.
    Stage,
    /// The semaphore increments.
    Doorbell,
    /// Polling the notification rings until done.
    Harvest,
}

impl Stage {
    /// All stages in pipeline order.
    pub const ALL: [Stage; 5] = [
        Stage::Validate,
        Stage::Bind,
        Stage::Stage,
        Stage::Doorbell,
        Stage::Harvest,
    ];

    /// Lower-case name.
    pub const fn name(self) -> &'static str {
        match self {
            Stage::Validate => "validate",
            Stage::Bind => "bind",
            Stage::Stage => "stage",
            Stage::Doorbell => "doorbell",
            Stage::Harvest => "harvest",
        }
    }
}

/// One recorded span.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// The execution's sequence number on its vcore.
    pub seq: u64,
    /// The model id.
    pub model: u32,
    /// The stage.
    pub stage: Stage,
    /// Start, in ns since tracing was enabled.
    pub start_ns: u64,
    /// End, in ns since tracing was enabled.
    pub end_ns: u64,
}

struct Ring {
    spans: Vec<Span>,
    next: usize,
    epoch: Instant,
}

/// The runtime's trace state.
pub(crate) struct Trace {
    enabled: AtomicBool,
    ring: Mutex<Option<Ring>>,
}

impl Trace {
    pub(crate) fn new() -> Trace {
        Trace {
            enabled: AtomicBool::new(false),
            ring: Mutex::new(None),
        }
    }

    /// The one branch the execution path pays.
    #[inline(always)]
    pub(crate) fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Whether device engine timelines are requested (not recorded by this version).
    pub(crate) fn engine_timeline(&self) -> bool {
        false
    }

    /// Turns tracing on (allocating the ring, cleared) or off.
    pub(crate) fn set_enabled(&self, on: bool) {
        let mut r = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        if on {
            let mut spans = Vec::with_capacity(tuning::TRACE_RING_CAPACITY);
            spans.clear();
            *r = Some(Ring {
                spans,
                next: 0,
                epoch: Instant::now(),
            });
        }
        self.enabled.store(on, Ordering::Release);
    }

    /// Records the five spans of an execution from its six stage boundaries.
    #[cold]
    pub(crate) fn record(&self, seq: u64, model: u32, t: &[Instant; 6]) {
        let mut g = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let Some(ring) = g.as_mut() else { return };
        let ns = |i: Instant| i.saturating_duration_since(ring.epoch).as_nanos() as u64;
        for (k, stage) in Stage::ALL.iter().enumerate() {
            let span = Span {
                seq,
                model,
                stage: *stage,
                start_ns: ns(t[k]),
                end_ns: ns(t[k + 1]),
            };
            if ring.spans.len() < tuning::TRACE_RING_CAPACITY {
                ring.spans.push(span); // within the capacity reserved at enable: no allocation
            } else {
                let i = ring.next % tuning::TRACE_RING_CAPACITY;
                ring.spans[i] = span;
            }
            ring.next += 1;
        }
    }

    /// Copies the recorded spans (oldest first) into `out`.
    pub(crate) fn spans(&self, out: &mut Vec<Span>) {
        let g = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(ring) = g.as_ref() {
            let n = ring.spans.len();
            let start = if ring.next > n { ring.next % n } else { 0 };
            out.extend(
                ring.spans[start..]
                    .iter()
                    .chain(&ring.spans[..start])
                    .copied(),
            );
        }
    }
}

/// The spans as Chrome trace-event JSON (opens in <https://ui.perfetto.dev> and
/// `chrome://tracing`): one complete event per span on the caller-thread track, named after
/// its stage, with the execution's seq and model id as arguments. `names` gives a display
/// name per model id (spans of models it does not name show the id).
pub fn chrome_json(spans: &[Span], names: &[(u32, &str)]) -> String {
    use std::fmt::Write;
    let mut json = String::from("{\"traceEvents\":[\n");
    json.push_str(
        "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"nrt-rs runtime\"}},\n",
    );
    json.push_str("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":1,\"args\":{\"name\":\"execute (caller thread)\"}}");
    for s in spans {
        let _ = write!(
            json,
            ",\n{{\"name\":\"{}\",\"cat\":\"stage\",\"ph\":\"X\",\"pid\":1,\"tid\":1,\"ts\":{:.3},\"dur\":{:.3},\"args\":{{\"seq\":{},\"model\":{}",
            s.stage.name(),
            s.start_ns as f64 / 1e3,
            s.end_ns.saturating_sub(s.start_ns) as f64 / 1e3,
            s.seq,
            s.model
        );
        if let Some((_, name)) = names.iter().find(|(id, _)| *id == s.model) {
            json.push_str(",\"model_name\":\"");
            for c in name.chars() {
                match c {
                    '"' => json.push_str("\\\""),
                    '\\' => json.push_str("\\\\"),
                    c if (c as u32) < 0x20 => {
                        let _ = write!(json, "\\u{:04x}", c as u32);
                    }
                    c => json.push(c),
                }
            }
            json.push('"');
        }
        json.push_str("}}");
    }
    json.push_str("\n]}\n");
    json
}

/// Stage timestamps of one execution: [`NoStamps`] compiles to nothing.
pub(crate) trait Stamps {
    /// Marks the start of the next stage (or the end of the last).
    fn mark(&mut self);
    /// The six boundaries, if recorded.
    fn boundaries(&self) -> Option<&[Instant; 6]>;
}

/// Untraced executions.
pub(crate) struct NoStamps;

impl Stamps for NoStamps {
    #[inline(always)]
    fn mark(&mut self) {}
    #[inline(always)]
    fn boundaries(&self) -> Option<&[Instant; 6]> {
        None
    }
}

/// Traced executions.
pub(crate) struct ClockStamps {
    t: [Instant; 6],
    n: usize,
}

impl ClockStamps {
    pub(crate) fn new() -> Self {
        let now = Instant::now();
        ClockStamps { t: [now; 6], n: 0 }
    }
}

impl Stamps for ClockStamps {
    fn mark(&mut self) {
        if self.n < 6 {
            self.t[self.n] = Instant::now();
            self.n += 1;
        }
    }
    fn boundaries(&self) -> Option<&[Instant; 6]> {
        Some(&self.t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chrome_json_names_models_and_escapes_them() {
        let span = |model, stage, start_ns, end_ns| Span {
            seq: 7,
            model,
            stage,
            start_ns,
            end_ns,
        };
        let spans = [
            span(1, Stage::Validate, 1_000, 1_500),
            span(2, Stage::Harvest, 2_000, 4_250),
        ];
        let json = chrome_json(&spans, &[(1, "a\"b\\c\nd")]);
        assert!(json.starts_with("{\"traceEvents\":["));
        assert!(json.trim_end().ends_with("]}"));
        assert!(json.contains(
            "\"name\":\"validate\",\"cat\":\"stage\",\"ph\":\"X\",\"pid\":1,\"tid\":1,\"ts\":1.000,\"dur\":0.500,\"args\":{\"seq\":7,\"model\":1,\"model_name\":\"a\\\"b\\\\c\\u000ad\"}}"
        ));
        // A model without a name shows only its id.
        assert!(json.contains("\"ts\":2.000,\"dur\":2.250,\"args\":{\"seq\":7,\"model\":2}}"));
        assert_eq!(json.matches("\"ph\":\"X\"").count(), 2);
    }
}
