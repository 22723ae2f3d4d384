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
//!
//! # Profiling a whole process: `NEURON_RT_INSPECT_*`
//!
//! With `NEURON_RT_INSPECT_ENABLE=1` ([`InspectConfig::from_env`], read by
//! [`crate::RuntimeConfig::from_env`]: the C API, the CLI, Python) the runtime traces from
//! `nrt_init` on, without a code change, and writes the same Chrome trace-event JSON as
//! `nrt_profile_stop` under `NEURON_RT_INSPECT_OUTPUT_DIR` (default `./output`), in
//! `nrt_pid_<pid>/`:
//!
//! | `NEURON_RT_INSPECT_DEVICE_PROFILE` | captures | file |
//! |---|---|---|
//! | unset, `1`, `model` | per model, its execution number `NUM_WARMUP + 1` | `model_<id>_<name>_vnc_<v>_exec_<n>.json`, written when that execution returns (synchronous surface) or at unload/close |
//! | `session`, `0` | every execution after each model's first `NUM_WARMUP` (the latest [`tuning::TRACE_RING_CAPACITY`] spans) | `session.json`, written at close |
//!
//! `NEURON_RT_INSPECT_DEVICE_PROFILE_NUM_WARMUP=N` (default 0) skips each model's first N
//! executions (the warm-up). While it profiles the process, `nrt_profile_start` and
//! `nrt_trace_start` are refused (one recorder at a time).

use crate::error::{NrtError, Result};
use nrt_hal::{NUM_ENGINES, tuning};
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// Which executions `NEURON_RT_INSPECT_ENABLE` captures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InspectMode {
    /// Per model, its execution number `warmup + 1`, one file each.
    Model,
    /// Every execution after each model's warm-up, one file at close.
    Session,
}

/// Profiling of a whole process from the environment (`NEURON_RT_INSPECT_*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InspectConfig {
    /// `NEURON_RT_INSPECT_OUTPUT_DIR` (default `./output`); files go to its
    /// `nrt_pid_<pid>/`.
    pub output_dir: PathBuf,
    /// `NEURON_RT_INSPECT_DEVICE_PROFILE`.
    pub mode: InspectMode,
    /// `NEURON_RT_INSPECT_DEVICE_PROFILE_NUM_WARMUP`: executions of each model to skip.
    pub warmup: u64,
}

impl InspectConfig {
    /// The profiling the environment asks for (`None` unless `NEURON_RT_INSPECT_ENABLE` is
    /// `1`/`true`); a malformed value is an error naming the variable.
    pub fn from_env() -> Result<Option<InspectConfig>> {
        let var = |k: &str| std::env::var(k).ok().map(|v| v.trim().to_owned());
        let bad = |k: &str, v: &str, want: &str| {
            NrtError::invalid(format!("{k}={v:?} is not one of {want}"))
        };
        match var("NEURON_RT_INSPECT_ENABLE").as_deref() {
            None | Some("" | "0" | "false") => return Ok(None),
            Some("1" | "true") => {}
            Some(v) => return Err(bad("NEURON_RT_INSPECT_ENABLE", v, "0, 1")),
        }
        let output_dir = var("NEURON_RT_INSPECT_OUTPUT_DIR")
            .filter(|v| !v.is_empty())
            .map_or_else(|| PathBuf::from("output"), PathBuf::from);
        let mode = match var("NEURON_RT_INSPECT_DEVICE_PROFILE").as_deref() {
            None | Some("" | "1" | "model") => InspectMode::Model,
            Some("0" | "session") => InspectMode::Session,
            Some(v) => {
                return Err(bad(
                    "NEURON_RT_INSPECT_DEVICE_PROFILE",
                    v,
                    "1 or model (one execution per model), session or 0 (every execution)",
                ));
            }
        };
        let warmup = match var("NEURON_RT_INSPECT_DEVICE_PROFILE_NUM_WARMUP").as_deref() {
            None | Some("") => 0,
            Some(v) => v.parse::<u64>().map_err(|_| {
                NrtError::invalid(format!(
                    "NEURON_RT_INSPECT_DEVICE_PROFILE_NUM_WARMUP={v:?} is not a non-negative integer"
                ))
            })?,
        };
        Ok(Some(InspectConfig {
            output_dir,
            mode,
            warmup,
        }))
    }
}

/// One model as the process-wide profile follows it.
struct InspectModel {
    id: u32,
    name: String,
    vnc: u32,
    /// Executions finished so far.
    executions: u64,
    /// Seq of the captured execution (model mode) or of the first captured (session).
    captured: Option<u64>,
    /// Its file was written (model mode).
    written: bool,
}

/// The process-wide profile in progress.
struct Inspect {
    cfg: InspectConfig,
    models: Vec<InspectModel>,
}

impl Inspect {
    fn model(&mut self, id: u32) -> &mut InspectModel {
        let i = match self.models.iter().position(|m| m.id == id) {
            Some(i) => i,
            None => {
                // A model loaded before the profile learnt its name (not expected: names
                // are noted at load).
                self.models.push(InspectModel {
                    id,
                    name: String::new(),
                    vnc: 0,
                    executions: 0,
                    captured: None,
                    written: false,
                });
                self.models.len() - 1
            }
        };
        &mut self.models[i]
    }

    fn dir(&self) -> PathBuf {
        self.cfg
            .output_dir
            .join(format!("nrt_pid_{}", std::process::id()))
    }
}

/// A file name made of a model's name: letters, digits, `-`, `_`, `.` kept.
fn file_safe(name: &str) -> String {
    let s: String = name
        .chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() { "model".into() } else { s }
}

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
    /// Set once at init when `NEURON_RT_INSPECT_ENABLE` profiles the process.
    inspecting: AtomicBool,
    /// Locked before `ring` where both are.
    inspect: Mutex<Option<Inspect>>,
}

impl Trace {
    pub(crate) fn new() -> Trace {
        Trace {
            enabled: AtomicBool::new(false),
            ring: Mutex::new(None),
            inspecting: AtomicBool::new(false),
            inspect: Mutex::new(None),
        }
    }

    pub(crate) fn inspecting(&self) -> bool {
        self.inspecting.load(Ordering::Relaxed)
    }

    /// Starts the process-wide profile of `config.inspect` (at init; nothing without it).
    pub(crate) fn start_inspect(
        &self,
        config: &crate::RuntimeConfig,
        device_clock: impl Fn() -> u64,
    ) {
        let Some(cfg) = config.inspect.clone() else {
            return;
        };
        self.set_enabled(true, device_clock);
        *self.inspect.lock().unwrap_or_else(|e| e.into_inner()) = Some(Inspect {
            cfg,
            models: Vec::new(),
        });
        self.inspecting.store(true, Ordering::Release);
    }

    /// Notes a loaded model's name and logical core for the profile's file names (at load).
    pub(crate) fn note_model(&self, id: u32, name: &str, vnc: u32) {
        if !self.inspecting() {
            return;
        }
        let mut g = self.inspect.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(ins) = g.as_mut() {
            let m = ins.model(id);
            m.name = name.to_owned();
            m.vnc = vnc;
        }
    }

    /// Counts a finished execution for the profile; whether its spans are captured.
    fn inspect_count(&self, seq: u64, model: u32) -> bool {
        let mut g = self.inspect.lock().unwrap_or_else(|e| e.into_inner());
        let Some(ins) = g.as_mut() else { return true };
        let (mode, warmup) = (ins.cfg.mode, ins.cfg.warmup);
        let m = ins.model(model);
        m.executions += 1;
        let take = match mode {
            InspectMode::Model => m.executions == warmup + 1,
            InspectMode::Session => m.executions > warmup,
        };
        if take && m.captured.is_none() {
            m.captured = Some(seq);
        }
        take
    }

    /// Whether the host stages of execution `seq` of `model` are captured, and (model mode)
    /// whether that completes the model's profile.
    fn inspect_stages(&self, seq: u64, model: u32) -> (bool, bool) {
        let mut g = self.inspect.lock().unwrap_or_else(|e| e.into_inner());
        let Some(ins) = g.as_mut() else {
            return (true, false);
        };
        let mode = ins.cfg.mode;
        let m = ins.model(model);
        match (mode, m.captured) {
            (InspectMode::Model, Some(c)) => (c == seq, c == seq && !m.written),
            (InspectMode::Session, Some(c)) => (seq >= c, false),
            (_, None) => (false, false),
        }
    }

    /// Writes the profile of `model` if it captured an execution not yet written (model
    /// mode): at the captured execution's return, at unload and at close.
    pub(crate) fn flush_model(&self, model: u32) {
        if !self.inspecting() {
            return;
        }
        let mut g = self.inspect.lock().unwrap_or_else(|e| e.into_inner());
        let Some(ins) = g.as_mut() else { return };
        if ins.cfg.mode != InspectMode::Model {
            return;
        }
        let dir = ins.dir();
        let warmup = ins.cfg.warmup;
        let m = ins.model(model);
        if m.written || m.captured.is_none() {
            return;
        }
        m.written = true;
        let file = dir.join(format!(
            "model_{}_{}_vnc_{}_exec_{}.json",
            m.id,
            file_safe(&m.name),
            m.vnc,
            warmup + 1
        ));
        let names = [(m.id, m.name.clone())];
        drop(g);
        let mut spans = Vec::new();
        self.spans(&mut spans);
        spans.retain(|s| s.model == model);
        let names: Vec<(u32, &str)> = names.iter().map(|(i, n)| (*i, n.as_str())).collect();
        write_profile(&file, &chrome_json(&spans, &names), spans.len());
    }

    /// Ends the profile (at close): writes what model mode has not written yet, or the
    /// session file.
    pub(crate) fn finish_inspect(&self) {
        if !self.inspecting() {
            return;
        }
        let ids: Vec<u32> = {
            let g = self.inspect.lock().unwrap_or_else(|e| e.into_inner());
            let Some(ins) = g.as_ref() else { return };
            if ins.cfg.mode == InspectMode::Session {
                let file = ins.dir().join("session.json");
                let names: Vec<(u32, String)> =
                    ins.models.iter().map(|m| (m.id, m.name.clone())).collect();
                drop(g);
                let mut spans = Vec::new();
                self.spans(&mut spans);
                let names: Vec<(u32, &str)> = names.iter().map(|(i, n)| (*i, n.as_str())).collect();
                write_profile(&file, &chrome_json(&spans, &names), spans.len());
                Vec::new()
            } else {
                ins.models.iter().map(|m| m.id).collect()
            }
        };
        for id in ids {
            self.flush_model(id);
        }
        self.inspect
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        self.inspecting.store(false, Ordering::Release);
        self.enabled.store(false, Ordering::Release);
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
        if self.inspecting() {
            return; // the process-wide profile owns the ring until close
        }
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
        let mut complete = false;
        if self.inspecting() {
            let (take, done) = self.inspect_stages(seq, model);
            if !take {
                return;
            }
            complete = done;
        }
        self.record_stages(seq, model, t);
        if complete {
            // Model mode: the captured execution has returned; its file is written now,
            // on the caller's thread, as the real runtime's model-mode capture does.
            self.flush_model(model);
        }
    }

    fn record_stages(&self, seq: u64, model: u32, t: &[Instant; 6]) {
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
        if self.inspecting() && !self.inspect_count(seq, model) {
            return;
        }
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

    /// The device clock at the ring's time zero, if a ring exists.
    pub(crate) fn device_epoch_ns(&self) -> Option<u64> {
        let g = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        g.as_ref().map(|r| r.device_epoch_ns)
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

/// Writes `bytes` to `file` without following a link planted there: into a fresh file
/// beside it (`O_CREAT|O_EXCL|O_NOFOLLOW`), then renamed over `file` (a rename replaces a link
/// at the target; it never writes through it). `NEURON_RT_INSPECT_OUTPUT_DIR` may be a
/// directory others can write.
fn write_replacing(file: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let name = file
        .file_name()
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let tmp = file.with_file_name(format!(
        ".{}.{}-{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(0o644)
        .open(&tmp)?;
    let res = f.write_all(bytes).and_then(|_| std::fs::rename(&tmp, file));
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

/// Writes a profile file (creating its directory); a failure is logged, never an
/// execution's error.
#[cold]
fn write_profile(file: &std::path::Path, json: &str, spans: usize) {
    use crate::log::{Level, Module};
    let res = file
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|_| write_replacing(file, json.as_bytes()));
    match res {
        Ok(()) => crate::nrt_log!(
            Module::Nrt,
            Level::Info,
            "nrt_inspect",
            "{spans} spans written to '{}' (Chrome trace-event JSON; NEURON_RT_INSPECT_ENABLE)",
            file.display()
        ),
        Err(e) => crate::nrt_log!(
            Module::Nrt,
            Level::Error,
            "nrt_inspect",
            "cannot write the profile '{}' (NEURON_RT_INSPECT_OUTPUT_DIR): {e}",
            file.display()
        ),
    }
}

/// One instruction on a device engine, for [`chrome_json_with_instructions`]: times in ns
/// since the trace's time zero (a software device's event minus
/// [`crate::Runtime::trace_device_epoch_ns`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InstructionSpan {
    /// The core, as in [`Stage::Engine`] (`nrt trace` loads its model on the device's
    /// first cores, where the physical index and the index within the group agree).
    pub core: u8,
    /// The engine (0..5: PE, ACT, POOL, DVE, SP).
    pub engine: u8,
    /// The execution's compute index on the core.
    pub exec_idx: u32,
    /// The instruction's index in its engine's block.
    pub pc: u32,
    /// The opcode's mnemonic.
    pub op: &'static str,
    /// Start, in ns since tracing was enabled.
    pub start_ns: u64,
    /// End, in ns since tracing was enabled.
    pub end_ns: u64,
}

/// The spans as Chrome trace-event JSON (opens in <https://ui.perfetto.dev> and
/// `chrome://tracing`): one complete event per span on the caller-thread track, named after
/// its stage, with the execution's seq and model id as arguments. `names` gives a display
/// name per model id (spans of models it does not name show the id).
pub fn chrome_json(spans: &[Span], names: &[(u32, &str)]) -> String {
    chrome_json_with_instructions(spans, names, &[])
}

/// [`chrome_json`], plus one complete event per instruction on its engine's track (nested
/// inside that engine's span of the execution), named after its opcode, with the execution's
/// compute index and the instruction's pc as arguments.
pub fn chrome_json_with_instructions(
    spans: &[Span],
    names: &[(u32, &str)],
    instructions: &[InstructionSpan],
) -> String {
    use std::fmt::Write;
    let mut json = String::from("{\"traceEvents\":[\n");
    json.push_str(
        "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"nrt-rs runtime\"}},\n",
    );
    json.push_str("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":1,\"args\":{\"name\":\"execute (caller thread)\"}}");
    // One track per engine that appears: tid 2 + core × 5 + engine.
    let mut named = [false; crate::MAX_LOCKSTEP_CORES * NUM_ENGINES];
    let track = |core: u8, engine: u8| {
        (core as usize).min(crate::MAX_LOCKSTEP_CORES - 1) * NUM_ENGINES
            + (engine as usize).min(NUM_ENGINES - 1)
    };
    let engines = spans
        .iter()
        .filter_map(|s| match s.stage {
            Stage::Engine { core, engine } => Some((core, engine)),
            _ => None,
        })
        .chain(instructions.iter().map(|i| (i.core, i.engine)));
    for (core, engine) in engines {
        let k = track(core, engine);
        if !core::mem::replace(&mut named[k], true) {
            let _ = write!(
                json,
                ",\n{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":{},\"args\":{{\"name\":\"device core {} engine {}\"}}}}",
                2 + k,
                core,
                Stage::Engine { core, engine }.name()
            );
        }
    }
    for i in instructions {
        let _ = write!(
            json,
            ",\n{{\"name\":\"{}\",\"cat\":\"instruction\",\"ph\":\"X\",\"pid\":1,\"tid\":{},\"ts\":{:.3},\"dur\":{:.3},\"args\":{{\"exec_idx\":{},\"pc\":{}}}}}",
            i.op,
            2 + track(i.core, i.engine),
            i.start_ns as f64 / 1e3,
            i.end_ns.saturating_sub(i.start_ns) as f64 / 1e3,
            i.exec_idx,
            i.pc
        );
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

    #[test]
    fn chrome_json_nests_instructions_on_their_engine_track() {
        let span = Span {
            seq: 3,
            model: 1,
            stage: Stage::Engine { core: 0, engine: 0 },
            start_ns: 1_000,
            end_ns: 9_000,
        };
        let ins = |engine, pc, start_ns| InstructionSpan {
            core: 1,
            engine,
            exec_idx: 7,
            pc,
            op: "MatMul",
            start_ns,
            end_ns: start_ns + 2_500,
        };
        // PE of core 0 has a span; ACT (1) of core 1 only instructions: its track is named.
        let json =
            chrome_json_with_instructions(&[span], &[], &[ins(1, 4, 2_000), ins(1, 5, 4_500)]);
        assert!(json.contains("\"tid\":8,\"args\":{\"name\":\"device core 1 engine ACT\"}"));
        assert_eq!(json.matches("device core 1 engine ACT").count(), 1);
        assert!(json.contains(
            "{\"name\":\"MatMul\",\"cat\":\"instruction\",\"ph\":\"X\",\"pid\":1,\"tid\":8,\"ts\":4.500,\"dur\":2.500,\"args\":{\"exec_idx\":7,\"pc\":5}}"
        ));
        assert_eq!(json.matches("\"cat\":\"instruction\"").count(), 2);
        assert_eq!(
            chrome_json(&[span], &[]),
            chrome_json_with_instructions(&[span], &[], &[])
        );
    }
}
