//! Tracing: per-stage spans of every execution (validate, bind, stage, doorbell, harvest),
//! and each engine's active interval on the device (its START record to its END record,
//! semaphore waits included), recorded into a ring allocated when tracing is turned on.
//!
//! The engine timeline comes from the device: a request staged while tracing is on carries
//! `exec_flags::TRACE`, and the device stamps its engines' START and END records with its
//! clock ([`nrt_hal::Device::clock_ns`]). The harvest keeps the stamps and, when the
//! execution completes, records one span per engine, placed on the trace's time axis by the
//! device clock reading taken when tracing was turned on.
//!
//! The execution path checks one flag once ([`Trace::enabled`]) and runs either the plain
//! pipeline or the same pipeline instantiated with timestamping ([`Stamps`]); with tracing
//! off, the cost is that one predictable branch and no clock reads. With tracing on, the five
//! spans of an execution are appended under the ring's lock, into memory allocated when
//! tracing was enabled: recording allocates nothing.

use nrt_hal::{NUM_ENGINES, tuning};
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
    /// An engine's active interval on the device, from its START record to its END record
    /// (semaphore waits included), on the device's clock.
    Engine {
        /// Position of the physical core in the model's cores (0 or 1).
        core: u8,
        /// The engine ([`nrt_hal::Engine`] index).
        engine: u8,
    },
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

    /// Lower-case name (an engine span: the engine's name).
    pub const fn name(self) -> &'static str {
        match self {
            Stage::Validate => "validate",
            Stage::Bind => "bind",
            Stage::Stage => "stage",
            Stage::Doorbell => "doorbell",
            Stage::Harvest => "harvest",
            Stage::Engine { engine, .. } => match nrt_hal::Engine::from_index(engine) {
                Some(e) => e.name(),
                None => "engine",
            },
        }
    }

    /// Whether this is one of the five host pipeline stages (not an engine span).
    pub const fn is_pipeline(self) -> bool {
        !matches!(self, Stage::Engine { .. })
    }
}

/// Device timestamps of one execution's engines: `[core][engine] = [start, end]` (ns).
pub(crate) type EngineTimes = [[[u64; 2]; NUM_ENGINES]; crate::MAX_LOCKSTEP_CORES];

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
    /// The device clock when `epoch` was taken.
    device_epoch_ns: u64,
}

impl Ring {
    fn push(&mut self, span: Span) {
        if self.spans.len() < tuning::TRACE_RING_CAPACITY {
            self.spans.push(span); // within the capacity reserved at enable: no allocation
        } else {
            let i = self.next % tuning::TRACE_RING_CAPACITY;
            self.spans[i] = span;
        }
        self.next += 1;
    }
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

    /// Whether requests ask the device for their engines' timeline (while tracing is on).
    #[inline]
    pub(crate) fn engine_timeline(&self) -> bool {
        self.enabled()
    }

    /// Turns tracing on (allocating the ring, cleared) or off. `device_clock` reads the
    /// device clock, which places engine spans on the trace's time axis.
    pub(crate) fn set_enabled(&self, on: bool, device_clock: impl Fn() -> u64) {
        let mut r = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        if on {
            let mut spans = Vec::with_capacity(tuning::TRACE_RING_CAPACITY);
            spans.clear();
            let epoch = Instant::now();
            *r = Some(Ring {
                spans,
                next: 0,
                epoch,
                device_epoch_ns: device_clock(),
            });
        }
        self.enabled.store(on, Ordering::Release);
    }

    /// Records the five spans of an execution from its six stage boundaries.
    #[cold]
    pub(crate) fn record(&self, seq: u64, model: u32, t: &[Instant; 6]) {
        let mut g = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let Some(ring) = g.as_mut() else { return };
        let epoch = ring.epoch;
        let ns = |i: Instant| i.saturating_duration_since(epoch).as_nanos() as u64;
        for (k, stage) in Stage::ALL.iter().enumerate() {
            let span = Span {
                seq,
                model,
                stage: *stage,
                start_ns: ns(t[k]),
                end_ns: ns(t[k + 1]),
            };
            ring.push(span);
        }
    }

    /// Records the engine spans of an execution from its START/END device timestamps
    /// (`times[core][engine] = [start, end]`, 0 where none came).
    #[cold]
    pub(crate) fn record_engines(&self, seq: u64, model: u32, times: &EngineTimes, cores: u8) {
        let mut g = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let Some(ring) = g.as_mut() else { return };
        let zero = ring.device_epoch_ns;
        for (c, engines) in times.iter().enumerate().take(cores as usize) {
            for (e, &[start, end]) in engines.iter().enumerate() {
                if start == 0 || end == 0 {
                    continue; // not traced, or a record was dropped
                }
                ring.push(Span {
                    seq,
                    model,
                    stage: Stage::Engine {
                        core: c as u8,
                        engine: e as u8,
                    },
                    start_ns: start.saturating_sub(zero),
                    end_ns: end.saturating_sub(zero),
                });
            }
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
    // One track per engine that appears: tid 2 + core × 5 + engine.
    let mut named = [false; crate::MAX_LOCKSTEP_CORES * NUM_ENGINES];
    for s in spans {
        if let Stage::Engine { core, engine } = s.stage {
            let k = (core as usize).min(crate::MAX_LOCKSTEP_CORES - 1) * NUM_ENGINES
                + (engine as usize).min(NUM_ENGINES - 1);
            if !core::mem::replace(&mut named[k], true) {
                let _ = write!(
                    json,
                    ",\n{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":{},\"args\":{{\"name\":\"device core {} engine {}\"}}}}",
                    2 + k,
                    core,
                    s.stage.name()
                );
            }
        }
    }
    for s in spans {
        let (cat, tid) = match s.stage {
            Stage::Engine { core, engine } => (
                "engine",
                2 + (core as usize).min(crate::MAX_LOCKSTEP_CORES - 1) * NUM_ENGINES
                    + (engine as usize).min(NUM_ENGINES - 1),
            ),
            _ => ("stage", 1),
        };
        let _ = write!(
            json,
            ",\n{{\"name\":\"{}\",\"cat\":\"{cat}\",\"ph\":\"X\",\"pid\":1,\"tid\":{tid},\"ts\":{:.3},\"dur\":{:.3},\"args\":{{\"seq\":{},\"model\":{}",
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

    #[test]
    fn chrome_json_puts_each_device_engine_on_its_own_named_track() {
        let engine = |core, engine, start_ns| Span {
            seq: 3,
            model: 1,
            stage: Stage::Engine { core, engine },
            start_ns,
            end_ns: start_ns + 100,
        };
        // DVE (3) of core 1 twice, SP (4) of core 0 once.
        let spans = [engine(1, 3, 0), engine(0, 4, 50), engine(1, 3, 200)];
        let json = chrome_json(&spans, &[]);
        // tid 2 + core × 5 + engine, named once per track.
        assert_eq!(
            json.matches("\"tid\":10,\"args\":{\"name\":\"device core 1 engine DVE\"}")
                .count(),
            1
        );
        assert!(json.contains("\"tid\":6,\"args\":{\"name\":\"device core 0 engine SP\"}"));
        assert_eq!(
            json.matches("\"cat\":\"engine\",\"ph\":\"X\",\"pid\":1,\"tid\":10")
                .count(),
            2
        );
        assert!(json.contains("\"name\":\"SP\",\"cat\":\"engine\",\"ph\":\"X\",\"pid\":1,\"tid\":6,\"ts\":0.050,\"dur\":0.100"));
    }
}
