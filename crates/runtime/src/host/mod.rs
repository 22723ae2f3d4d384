//! The host view: core ownership across processes and the statistics each runtime publishes.
//!
//! # Ownership
//!
//! A runtime whose [`crate::RuntimeConfig::ownership`] names a directory (the *runtime
//! directory*: `NRT_RUNTIME_DIR`, else the per-user default; see [`runtime_dir_from_env`] and,
//! for who may write it and what a reader trusts, [`rundir`]) takes, for every physical core it reserves, an exclusive `flock`
//! on `core-<id>.lock` there. The kernel releases a lock when its process dies, so a crashed
//! or killed process never leaves cores held. A core held by another runtime is refused with
//! `NRT_RESOURCE` and a message naming the core, the owner's PID and its command line:
//! `NeuronCore 0 is in use by pid 4321 (python serve.py)`.
//!
//! Ownership is per runtime: two runtimes of one process that both opt in cannot share a core
//! either (`flock` locks belong to the open file). `RuntimeConfig::from_env` (and so
//! `nrt_init`, the CLI) opts in; a `RuntimeConfig` built in code does not, so the many
//! runtimes of a test process never contend.
//!
//! # The published record
//!
//! Each owning runtime publishes `proc-<pid>-<n>.rec`: a fixed-size file of little-endian
//! 64-bit words ([`Record`]), mapped shared and written with relaxed atomics — who it is (pid,
//! start time, command line, cores) and, per logical core, the statistics ([`CoreStats`]).
//! The record file itself is `flock`ed by its owner: a reader that can lock it has found the
//! record of a dead process and removes it. A runtime without ownership keeps the same
//! statistics in private memory ([`Runtime::stats`](crate::Runtime::stats) reads either).
//!
//! # Statistics on the hot path
//!
//! Counters of completed executions, latency histograms and busy time are written by the
//! harvest-token holder only, with a load and a store ([`bump`]), never a locked
//! read-modify-write, and never allocate. Errors found before staging (bad input, failure to
//! queue) are counted on their (cold) error path with `fetch_add`.

use crate::error::NrtError;
use nrt_hal::NrtStatus;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};

mod ownership;
mod read;
pub mod rundir;

pub(crate) use ownership::{Ownership, acquire};
pub use read::{
    MAX_RECORD_BUSY_NS, MAX_RECORD_COUNT, ModelSnapshot, ProcessRecord, RecordScan, VcoreSnapshot,
    parse_record, read_records, read_records_in, scan_records, snapshot,
};
pub use rundir::{RuntimeDir, runtime_dir_from_env};

/// `NRTHOST1` as a little-endian word.
pub const RECORD_MAGIC: u64 = u64::from_le_bytes(*b"NRTHOST1");
/// The record layout's version (2: the process tag and the table of loaded models; 3: how
/// each lockstep vcore is served, [`CoreStats::lockstep_serving`]).
pub const RECORD_VERSION: u64 = 3;
/// Logical cores one record describes at most.
pub const MAX_RECORD_VCORES: usize = 128;
/// Buckets of a latency histogram ([`latency_bucket`]).
pub const HIST_BUCKETS: usize = 160;
/// Bytes of the command line kept in a record.
pub const CMDLINE_BYTES: usize = 512;
/// Words of the core bitmap (256 cores).
pub const CORE_WORDS: usize = 4;
/// Bytes of the process tag (`NEURON_PROCESS_TAG`) kept in a record.
pub const TAG_BYTES: usize = 64;
/// Loaded models one record lists at most (more are counted in [`CoreStats::models`] but not
/// named).
pub const MAX_RECORD_MODELS: usize = 64;
/// Bytes of a model's name kept in a record.
pub const MODEL_NAME_BYTES: usize = 64;

/// `execution_summary` of neuron-monitor, in this order.
pub const STATUS_NAMES: [&str; 6] = [
    "completed",
    "completed_with_err",
    "completed_with_num_err",
    "timed_out",
    "incorrect_input",
    "failed_to_queue",
];
/// Index into [`CoreStats::status`].
pub mod status {
    /// Completed successfully.
    pub const COMPLETED: usize = 0;
    /// Completed with an error (transient, hardware).
    pub const COMPLETED_WITH_ERR: usize = 1;
    /// Completed with a numerical error (NaN).
    pub const COMPLETED_WITH_NUM_ERR: usize = 2;
    /// Timed out (hang, dropped notifications).
    pub const TIMED_OUT: usize = 3;
    /// Refused or failed for its input (validation, invalid instruction).
    pub const INCORRECT_INPUT: usize = 4;
    /// Could not be queued (fatal core, unloading, closed).
    pub const FAILED_TO_QUEUE: usize = 5;
}

/// `error_summary` of neuron-monitor, in this order.
pub const ERROR_CLASS_NAMES: [&str; 6] = [
    "generic",
    "numerical",
    "transient",
    "model",
    "runtime",
    "hardware",
];

/// Memory categories of [`CoreStats::mem`]: device memory by neuron-top's categories, then
/// host memory of tensors.
pub const MEM_NAMES: [&str; 6] = [
    "tensors",
    "constants",
    "model_code",
    "scratchpad",
    "runtime",
    "host_tensors",
];
/// Index into [`CoreStats::mem`].
pub mod mem {
    /// Device tensors allocated by the application.
    pub const TENSORS: usize = 0;
    /// Model constants (weights).
    pub const CONSTANTS: usize = 1;
    /// Instruction blocks.
    pub const MODEL_CODE: usize = 2;
    /// Scratch arenas and state buffers.
    pub const SCRATCHPAD: usize = 3;
    /// Exec rings, request buffers, descriptor sets, the model's I/O buffers.
    pub const RUNTIME: usize = 4;
    /// Host tensors.
    pub const HOST_TENSORS: usize = 5;
}

/// The error class (`error_summary`) of an execution's final status. The mapping, documented
/// in `nrt.h` and the README:
///
/// | status | fault kind (`NRT_SIM_FAULTS`) | class |
/// |---|---|---|
/// | `NRT_EXEC_COMPLETED_WITH_NUM_ERR` | `nan` | numerical |
/// | `NRT_EXEC_COMPLETED_WITH_ERR` | `transient` | transient |
/// | `NRT_EXEC_BAD_INPUT`, `NRT_EXEC_OOB`, `NRT_INVALID` | invalid instruction, out of bounds | model |
/// | `NRT_TIMEOUT`, `NRT_EXEC_SW_NQ_OVERFLOW`, `NRT_QUEUE_FULL` | `hang`, `drop` | runtime |
/// | `NRT_EXEC_HW_ERR_*`, `NRT_EXEC_UNIT_UNRECOVERABLE` | `parity`, `dma_abort`, `hbm_ue`, `fatal` | hardware |
/// | anything else | | generic |
pub fn error_class(s: NrtStatus) -> Option<usize> {
    use NrtStatus as S;
    Some(match s {
        S::Success => return None,
        S::ExecCompletedWithNumErr => 1,
        S::ExecCompletedWithErr => 2,
        S::ExecBadInput | S::ExecOob | S::Invalid => 3,
        S::Timeout | S::ExecSwNqOverflow | S::QueueFull => 4,
        S::ExecHwErrNcUe | S::ExecHwErrDmaAbort | S::ExecHwErrHbmUe | S::ExecUnitUnrecoverable => 5,
        _ => 0,
    })
}

/// The `execution_summary` entry of a finished execution's status.
pub fn status_index(s: NrtStatus) -> usize {
    use NrtStatus as S;
    match s {
        S::Success => status::COMPLETED,
        S::ExecCompletedWithNumErr => status::COMPLETED_WITH_NUM_ERR,
        S::Timeout | S::ExecSwNqOverflow => status::TIMED_OUT,
        S::ExecBadInput | S::Invalid => status::INCORRECT_INPUT,
        _ => status::COMPLETED_WITH_ERR,
    }
}

/// The statistics of one logical core.
#[repr(C)]
#[derive(Debug)]
pub struct CoreStats {
    /// The vcore's first global core id.
    pub first_core: AtomicU64,
    /// Physical cores of the vcore.
    pub cores: AtomicU64,
    /// Executions by [`STATUS_NAMES`].
    pub status: [AtomicU64; 6],
    /// Failed executions by [`ERROR_CLASS_NAMES`].
    pub errors: [AtomicU64; 6],
    /// Nanoseconds the core spent executing, estimated from the sampled total latency
    /// (each sample counts [`TOTAL_LATENCY_SAMPLE`] times).
    pub busy_ns: AtomicU64,
    /// Models loaded.
    pub models: AtomicU64,
    /// Bytes by [`MEM_NAMES`].
    pub mem: [AtomicU64; 6],
    /// Host-measured latency from submission to completion, ns ([`latency_bucket`]); one
    /// execution in [`TOTAL_LATENCY_SAMPLE`] is measured.
    pub lat_total: [AtomicU64; HIST_BUCKETS],
    /// Device latency from the engines' own START/END timestamps, ns: the device stamps
    /// them in trace mode only (`nrt trace`, `NEURON_RT_INSPECT_ENABLE`), so only traced
    /// executions are counted here (the decision: no clock reads added to the device).
    pub lat_device: [AtomicU64; HIST_BUCKETS],
    /// A vcore of several cores: how the device serves them ([`nrt_hal::Device::
    /// lockstep_serving`]) — bit 0 set while one thread runs every part in turn (joint),
    /// the changes between joint and parallel above it; 0 for one core. Refreshed by the
    /// harvest's deadline sweep (about once a millisecond while the vcore is in use).
    pub lockstep_serving: AtomicU64,
}

/// One execution in this many has its total latency measured (two clock reads).
pub const TOTAL_LATENCY_SAMPLE: u64 = 16;

/// The header of a record.
#[repr(C)]
#[derive(Debug)]
pub struct Header {
    /// [`RECORD_MAGIC`].
    pub magic: AtomicU64,
    /// [`RECORD_VERSION`].
    pub version: AtomicU64,
    /// 0 = acquiring its cores, 1 = holding them, 2 = closed.
    pub state: AtomicU64,
    /// Process id.
    pub pid: AtomicU64,
    /// Start time, ns since the Unix epoch.
    pub start_unix_ns: AtomicU64,
    /// Physical cores per logical core.
    pub lnc: AtomicU64,
    /// Logical cores described.
    pub vcores: AtomicU64,
    /// Bitmap of the physical cores held.
    pub cores: [AtomicU64; CORE_WORDS],
    /// Length of the command line.
    pub cmdline_len: AtomicU64,
    /// The command line, NUL separators as spaces.
    pub cmdline: [AtomicU64; CMDLINE_BYTES / 8],
    /// Length of the tag.
    pub tag_len: AtomicU64,
    /// The process tag: `NEURON_PROCESS_TAG` (neuron-monitor's `neuron_runtime_tag` and
    /// `tag_filter`), empty when unset.
    pub tag: [AtomicU64; TAG_BYTES / 8],
    /// Reserved (zero).
    pub reserved: [AtomicU64; 8],
}

/// One loaded model, as listed in a record.
#[repr(C)]
#[derive(Debug)]
pub struct ModelEntry {
    /// The model's id; 0 = a free entry, [`u64::MAX`] = being written.
    pub id: AtomicU64,
    /// Its logical core.
    pub vnc: AtomicU64,
    /// Its device bytes by the first five [`MEM_NAMES`].
    pub mem: [AtomicU64; 5],
    /// Length of the name.
    pub name_len: AtomicU64,
    /// The name (truncated to [`MODEL_NAME_BYTES`]).
    pub name: [AtomicU64; MODEL_NAME_BYTES / 8],
}

/// The published record.
#[repr(C)]
#[derive(Debug)]
pub struct Record {
    /// Who.
    pub header: Header,
    /// Per logical core.
    pub vcores: [CoreStats; MAX_RECORD_VCORES],
    /// The loaded models (written at load and unload only).
    pub models: [ModelEntry; MAX_RECORD_MODELS],
}

pub(super) const STATE_ACQUIRING: u64 = 0;
pub(super) const STATE_HOLDING: u64 = 1;

/// Adds `v` to a counter that only one thread writes at a time (the harvest token holder):
/// a load and a store, not a locked read-modify-write.
#[inline(always)]
pub(crate) fn bump(c: &AtomicU64, v: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(v), Ordering::Relaxed);
}

/// The histogram bucket of `ns`: exact below 4, then four buckets per power of two, capped
/// at 2^40 ns (18 minutes).
#[inline(always)]
pub fn latency_bucket(ns: u64) -> usize {
    let v = ns.min((1 << 40) - 1);
    if v < 4 {
        return v as usize;
    }
    let o = 63 - v.leading_zeros() as usize;
    (o - 1) * 4 + ((v >> (o - 2)) & 3) as usize
}

/// The smallest value of bucket `b`.
pub fn bucket_low(b: usize) -> u64 {
    if b < 4 {
        return b as u64;
    }
    let (o, sub) = (b / 4 + 1, (b % 4) as u64);
    (4 + sub) << (o - 2)
}

/// The `p`-th percentile (0–100) of a histogram, in ns (the bucket's midpoint); `None` when
/// empty.
pub fn percentile(hist: &[u64], p: f64) -> Option<f64> {
    let n: u64 = hist.iter().sum();
    if n == 0 {
        return None;
    }
    let rank = ((p / 100.0) * (n - 1) as f64).round() as u64;
    let mut seen = 0u64;
    for (b, &c) in hist.iter().enumerate() {
        seen += c;
        if seen > rank {
            let lo = bucket_low(b) as f64;
            let hi = bucket_low(b + 1) as f64;
            return Some((lo + hi) / 2.0);
        }
    }
    None
}

/// Monotonic nanoseconds (`CLOCK_MONOTONIC`, the vDSO; no allocation).
#[inline]
pub(crate) fn now_ns() -> u64 {
    nrt_hal::monotonic_ns()
}

/// A shared, writable mapping of a record file.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: *mut Record,
}

// SAFETY: the mapping is only accessed through atomics.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    pub(super) fn new(f: &File) -> std::io::Result<Mapping> {
        let len = std::mem::size_of::<Record>();
        // SAFETY: a shared mapping of `len` bytes of a file whose `len` bytes were reserved
        // (allocated, not sparse: `rundir::reserve`) before; the result is checked against
        // MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping { ptr: p.cast() })
    }

    pub(super) fn record(&self) -> &Record {
        // SAFETY: the mapping is page-aligned, as long as a Record, zero-filled by
        // posix_fallocate (all-zero is a valid Record of atomics), and lives as long as `self`.
        unsafe { &*self.ptr }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped; no reference outlives `self` (the
        // statistics area that hands them out owns the mapping).
        unsafe { libc::munmap(self.ptr.cast(), std::mem::size_of::<Record>()) };
    }
}

/// Where a runtime's statistics live: the published record, or private memory.
#[derive(Debug)]
pub(crate) enum StatsArea {
    Shared(Mapping),
    Private(Box<[CoreStats]>),
}

impl StatsArea {
    pub(crate) fn private(n: usize) -> StatsArea {
        StatsArea::Private((0..n).map(|_| zeroed_stats()).collect())
    }

    /// The statistics of vcore `i` (a dummy past the record's capacity is never handed out:
    /// `acquire` refuses more vcores than a record holds).
    pub(crate) fn core(&self, i: usize) -> &CoreStats {
        match self {
            StatsArea::Shared(m) => &m.record().vcores[i],
            StatsArea::Private(b) => &b[i],
        }
    }
}

impl StatsArea {
    /// Lists a loaded model in the published record; returns its entry (`None` without a
    /// record, or when the table is full: the model is still counted, not named). Cold: at
    /// load only.
    pub(crate) fn publish_model(
        &self,
        id: u32,
        vnc: u32,
        name: &str,
        mem_bytes: &[u64; 6],
    ) -> Option<usize> {
        let StatsArea::Shared(m) = self else {
            return None;
        };
        for (i, e) in m.record().models.iter().enumerate() {
            if e.id
                .compare_exchange(0, u64::MAX, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            e.vnc.store(vnc as u64, Ordering::Relaxed);
            for (k, w) in e.mem.iter().enumerate() {
                w.store(mem_bytes[k], Ordering::Relaxed);
            }
            let n = store_text(&e.name, name);
            e.name_len.store(n as u64, Ordering::Relaxed);
            e.id.store(id as u64, Ordering::Release);
            return Some(i);
        }
        None
    }

    /// Removes the entry [`StatsArea::publish_model`] returned.
    pub(crate) fn unpublish_model(&self, entry: Option<usize>) {
        if let (StatsArea::Shared(m), Some(i)) = (self, entry)
            && let Some(e) = m.record().models.get(i)
        {
            e.id.store(0, Ordering::Release);
        }
    }
}

/// Bytes of host tensors the runtime allocated: counted once per runtime, on logical core
/// 0's block (host memory belongs to no core). At allocation and free only, never per
/// execution.
pub(crate) fn count_host_tensor(rt: &crate::RuntimeInner, bytes: u64, allocated: bool) {
    if let Some(vc) = rt.vcores.first() {
        let c = &vc.stats().mem[mem::HOST_TENSORS];
        if allocated {
            c.fetch_add(bytes, Ordering::Relaxed);
        } else {
            c.fetch_sub(bytes, Ordering::Relaxed);
        }
    }
}

/// Writes `text` (truncated at a character boundary to fit) into `words`, NUL-padded;
/// returns the bytes written.
pub(super) fn store_text(words: &[AtomicU64], text: &str) -> usize {
    let mut end = text.len().min(words.len() * 8);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let bytes = &text.as_bytes()[..end];
    for (i, w) in words.iter().enumerate() {
        let mut b = [0u8; 8];
        let lo = (i * 8).min(end);
        let hi = (lo + 8).min(end);
        b[..hi - lo].copy_from_slice(&bytes[lo..hi]);
        w.store(u64::from_le_bytes(b), Ordering::Relaxed);
    }
    end
}

pub(super) fn load_text(words: &[AtomicU64], len: u64) -> String {
    let len = (len as usize).min(words.len() * 8);
    let raw: Vec<u8> = words
        .iter()
        .flat_map(|w| w.load(Ordering::Relaxed).to_le_bytes())
        .collect();
    String::from_utf8_lossy(&raw[..len]).into_owned()
}

fn zeroed_stats() -> CoreStats {
    // SAFETY: CoreStats is atomics only; all-zero bytes are a valid value of each.
    unsafe { std::mem::zeroed() }
}

/// Bytes for people: `512 B`, `1.50 KiB`, `4.00 GiB`.
pub fn fmt_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut v = b as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.2} {}", UNITS[u])
}

fn breakdown(mem: &[u64]) -> String {
    let parts: Vec<String> = MEM_NAMES
        .iter()
        .zip(mem)
        .filter(|(_, b)| **b != 0)
        .map(|(n, b)| format!("{} {}", n.replace('_', " "), fmt_bytes(*b)))
        .collect();
    if parts.is_empty() {
        "nothing".to_owned()
    } else {
        parts.join(", ")
    }
}

/// The error of a device allocation that ran out of memory, with the memory-usage dump the
/// real runtime logs: what was asked (and, during a load, what the load had allocated so
/// far), what is free on the core's device, what is in use by category, and the biggest
/// users — the loaded models (by category) and the device tensors of each logical core —
/// then what to do. Cold: on the failing allocation only.
#[cold]
#[inline(never)]
pub(crate) fn out_of_device_memory(
    rt: &crate::RuntimeInner,
    vnc: u32,
    asked: u64,
    what: &str,
    category: usize,
    load: Option<(&str, &[u64; 6])>,
    free: u64,
) -> NrtError {
    use std::fmt::Write;
    let usage = rt.device.mem_usage();
    let cores = rt
        .vcores
        .get(vnc as usize)
        .map(|v| {
            v.cores
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join("+")
        })
        .unwrap_or_default();
    let mut m = format!(
        "out of device memory: {what} asked for {} ({asked} bytes, {}) on logical NeuronCore {vnc} (NeuronCore {cores}); {} free of {} on its device",
        fmt_bytes(asked),
        MEM_NAMES[category.min(MEM_NAMES.len() - 1)].replace('_', " "),
        fmt_bytes(free),
        fmt_bytes(usage.bytes_limit),
    );
    if let Some((model, so_far)) = load {
        let _ = write!(
            m,
            "\n  loading model '{model}', which had allocated {} before this ({})",
            fmt_bytes(so_far.iter().sum()),
            breakdown(&so_far[..5])
        );
    }
    let mut total = [0u64; 6];
    for vc in rt.vcores.iter() {
        for (t, c) in total.iter_mut().zip(&vc.stats().mem) {
            *t = t.saturating_add(c.load(Ordering::Relaxed));
        }
    }
    let counted: u64 = total[..5].iter().sum();
    let _ = write!(
        m,
        "\n  in use: {} ({}{})",
        fmt_bytes(usage.bytes_used),
        breakdown(&total[..5]),
        if usage.bytes_used > counted {
            format!(", other {}", fmt_bytes(usage.bytes_used - counted))
        } else {
            String::new()
        }
    );
    // The biggest users: every loaded model, and each logical core's device tensors.
    let mut users: Vec<(u64, String)> = Vec::new();
    for mdl in rt.models.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        let b: u64 = mdl.mem[..5].iter().sum();
        users.push((
            b,
            format!(
                "model '{}' (id {}) on logical NeuronCore {}: {} ({})",
                mdl.name,
                mdl.id,
                mdl.vnc,
                fmt_bytes(b),
                breakdown(&mdl.mem[..5])
            ),
        ));
    }
    for (i, vc) in rt.vcores.iter().enumerate() {
        let b = vc.stats().mem[mem::TENSORS].load(Ordering::Relaxed);
        if b != 0 {
            users.push((
                b,
                format!("device tensors on logical NeuronCore {i}: {}", fmt_bytes(b)),
            ));
        }
    }
    users.sort_by_key(|u| std::cmp::Reverse(u.0));
    if users.is_empty() {
        m.push_str("\n  biggest users: none (nothing else is loaded or allocated)");
    } else {
        m.push_str("\n  biggest users:");
        for (_, u) in users.iter().take(8) {
            let _ = write!(m, "\n    {u}");
        }
        if users.len() > 8 {
            let _ = write!(m, "\n    ... and {} more", users.len() - 8);
        }
    }
    m.push_str(
        "\n  to fix: free tensors and unload models no longer needed, load onto another core (NEURON_RT_VISIBLE_CORES), or give the device more memory (NRT_SIM_INSTANCE, NRT_SIM_DEVICE_MEMORY)",
    );
    NrtError::new(NrtStatus::Resource, m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_invert() {
        let mut last = 0;
        for v in [
            0u64,
            1,
            3,
            4,
            5,
            7,
            8,
            100,
            1000,
            123_456,
            1 << 39,
            u64::MAX,
        ] {
            let b = latency_bucket(v);
            assert!(b >= last && b < HIST_BUCKETS, "{v} -> {b}");
            assert!(bucket_low(b) <= v.min((1 << 40) - 1), "{v}");
            assert!(bucket_low(b + 1) > v.min((1 << 40) - 1), "{v}");
            last = b;
        }
        let mut h = vec![0u64; HIST_BUCKETS];
        h[latency_bucket(1000)] = 99;
        h[latency_bucket(1_000_000)] = 1;
        let p50 = percentile(&h, 50.0).unwrap();
        assert!((800.0..1300.0).contains(&p50), "{p50}");
        assert!(percentile(&h, 100.0).unwrap() > 800_000.0);
        assert_eq!(
            ownership::cmdline_text(b"python\0serve.py\0"),
            "python serve.py"
        );
    }

    #[test]
    fn classes() {
        assert_eq!(error_class(NrtStatus::Success), None);
        assert_eq!(error_class(NrtStatus::ExecCompletedWithNumErr), Some(1));
        assert_eq!(error_class(NrtStatus::Timeout), Some(4));
        assert_eq!(error_class(NrtStatus::ExecHwErrHbmUe), Some(5));
        assert_eq!(status_index(NrtStatus::ExecSwNqOverflow), status::TIMED_OUT);
    }
}
