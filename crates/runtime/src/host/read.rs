//! Reading the records of a runtime directory: nothing in them is trusted before it is
//! checked ([`super::rundir`]'s threat model).

use super::ownership::flock;
use super::rundir::RuntimeDir;
use super::{
    CORE_WORDS, CoreStats, MAX_RECORD_VCORES, RECORD_MAGIC, RECORD_VERSION, Record, STATE_HOLDING,
    load_text,
};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// A record as a reader sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessRecord {
    /// Process id.
    pub pid: u32,
    /// Start time, ns since the Unix epoch.
    pub start_unix_ns: u64,
    /// Command line.
    pub cmdline: String,
    /// The process tag (`NEURON_PROCESS_TAG`; empty when unset).
    pub tag: String,
    /// The models it has loaded (at most [`MAX_RECORD_MODELS`] are listed).
    pub models: Vec<ModelSnapshot>,
    /// Physical cores held (global ids).
    pub cores: Vec<u32>,
    /// Whether it holds them (else it is still acquiring).
    pub holding: bool,
    /// Physical cores per logical core.
    pub lnc: u32,
    /// Per logical core.
    pub vcores: Vec<VcoreSnapshot>,
}

/// A loaded model, read from a record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelSnapshot {
    /// Its id in its runtime.
    pub id: u32,
    /// Its logical core.
    pub vnc: u32,
    /// Its name.
    pub name: String,
    /// Its device bytes by the first five [`MEM_NAMES`].
    pub mem: [u64; 5],
}

/// One logical core's statistics, read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VcoreSnapshot {
    /// Its first global core id.
    pub first_core: u32,
    /// Physical cores it spans.
    pub cores: u32,
    /// By [`STATUS_NAMES`].
    pub status: [u64; 6],
    /// By [`ERROR_CLASS_NAMES`].
    pub errors: [u64; 6],
    /// Device busy time, ns.
    pub busy_ns: u64,
    /// Models loaded.
    pub models: u64,
    /// Bytes by [`MEM_NAMES`].
    pub mem: [u64; 6],
    /// Total-latency histogram.
    pub lat_total: Vec<u64>,
    /// Device-latency histogram.
    pub lat_device: Vec<u64>,
    /// [`CoreStats::lockstep_serving`].
    pub lockstep_serving: u64,
}

/// Reads a statistics block.
pub fn snapshot(s: &CoreStats) -> VcoreSnapshot {
    let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
    VcoreSnapshot {
        first_core: l(&s.first_core) as u32,
        cores: l(&s.cores) as u32,
        status: s.status.each_ref().map(l),
        errors: s.errors.each_ref().map(l),
        busy_ns: l(&s.busy_ns),
        models: l(&s.models),
        mem: s.mem.each_ref().map(l),
        lat_total: s.lat_total.iter().map(l).collect(),
        lat_device: s.lat_device.iter().map(l).collect(),
        lockstep_serving: l(&s.lockstep_serving),
    }
}

/// Parses a record file's bytes; `Err` says why it is not a record this reader can use: not
/// of this version, truncated, or values that do not add up (more logical cores than a
/// record holds, cores past the bitmap, a process id or core size out of range). Lengths of
/// texts are clamped to what a record holds.
pub fn parse_record(bytes: &[u8]) -> Result<ProcessRecord, String> {
    let size = std::mem::size_of::<Record>();
    if bytes.len() != size {
        return Err(format!("{} bytes, a record has {size}", bytes.len()));
    }
    let layout = std::alloc::Layout::new::<Record>();
    // SAFETY: the layout has a non-zero size; the pointer is checked for null; Record is
    // atomics only, so all-zero bytes are a valid Record, and the Box frees it with the same
    // layout. (On the heap: it is ~350 KB.)
    let mut rec: Box<Record> = unsafe {
        let p = std::alloc::alloc_zeroed(layout).cast::<Record>();
        if p.is_null() {
            return Err("out of memory".into());
        }
        Box::from_raw(p)
    };
    // SAFETY: `rec` is a Record-sized allocation we own exclusively; `bytes` holds exactly
    // that many bytes (checked above); the two cannot overlap.
    unsafe {
        core::ptr::copy_nonoverlapping(
            bytes.as_ptr(),
            (&mut *rec as *mut Record).cast::<u8>(),
            size,
        )
    };
    let h = &rec.header;
    let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
    if l(&h.magic) != RECORD_MAGIC {
        return Err("not a record (bad magic)".into());
    }
    if l(&h.version) != RECORD_VERSION {
        return Err(format!(
            "a record of version {}, this reader reads {RECORD_VERSION}",
            l(&h.version)
        ));
    }
    let pid = l(&h.pid);
    if !(1..=i32::MAX as u64).contains(&pid) {
        return Err(format!("process id {pid} is out of range"));
    }
    let max_core = (CORE_WORDS * 64) as u64;
    let lnc = l(&h.lnc);
    if !(1..=max_core).contains(&lnc) {
        return Err(format!("{lnc} cores per logical core (1 to {max_core})"));
    }
    let nv = l(&h.vcores);
    if nv > MAX_RECORD_VCORES as u64 {
        return Err(format!(
            "{nv} logical cores, a record holds at most {MAX_RECORD_VCORES}"
        ));
    }
    let nv = nv as usize;
    for (i, v) in rec.vcores[..nv].iter().enumerate() {
        let (first, n) = (l(&v.first_core), l(&v.cores));
        if n > max_core || first.checked_add(n).is_none_or(|end| end > max_core) {
            return Err(format!(
                "logical core {i} spans {n} cores from core {first}, past core {}",
                max_core - 1
            ));
        }
    }
    let models = rec
        .models
        .iter()
        .filter_map(|e| {
            let id = l(&e.id);
            (id != 0 && id != u64::MAX).then(|| ModelSnapshot {
                id: id as u32,
                vnc: l(&e.vnc) as u32,
                name: load_text(&e.name, l(&e.name_len)),
                mem: e.mem.each_ref().map(|a| l(a).min(MAX_RECORD_COUNT)),
            })
        })
        .collect();
    let cores = (0..(CORE_WORDS * 64) as u32)
        .filter(|&c| l(&h.cores[c as usize / 64]) & (1 << (c % 64)) != 0)
        .collect();
    Ok(ProcessRecord {
        pid: pid as u32,
        start_unix_ns: l(&h.start_unix_ns),
        cmdline: load_text(&h.cmdline, l(&h.cmdline_len)),
        tag: load_text(&h.tag, l(&h.tag_len)),
        models,
        cores,
        holding: l(&h.state) == STATE_HOLDING,
        lnc: lnc as u32,
        vcores: rec.vcores[..nv]
            .iter()
            .map(|v| clamp_counters(snapshot(v)))
            .collect(),
    })
}

/// The largest counter, byte count or histogram entry a reader takes from a record (2^48:
/// 2.8e14 executions, 256 TiB): sums over every bucket of every logical core of a record
/// then fit a `u64`.
pub const MAX_RECORD_COUNT: u64 = 1 << 48;
/// The largest busy time a reader takes from a record, ns (2^56: 2.3 years; summed over a
/// record's logical cores it fits a `u64`).
pub const MAX_RECORD_BUSY_NS: u64 = 1 << 56;

fn clamp_counters(mut v: VcoreSnapshot) -> VcoreSnapshot {
    let c = |x: &mut u64| *x = (*x).min(MAX_RECORD_COUNT);
    v.status.iter_mut().for_each(c);
    v.errors.iter_mut().for_each(c);
    v.mem.iter_mut().for_each(c);
    v.lat_total.iter_mut().for_each(c);
    v.lat_device.iter_mut().for_each(c);
    c(&mut v.models);
    v.busy_ns = v.busy_ns.min(MAX_RECORD_BUSY_NS);
    v
}

/// What a scan of a runtime directory found.
#[derive(Debug, Default)]
pub struct RecordScan {
    /// The live runtimes' records with their file names, by pid.
    pub records: Vec<(String, ProcessRecord)>,
    /// Files named like records that were not used: (name, why).
    pub skipped: Vec<(String, String)>,
}

/// Scans an open runtime directory: the records of live runtimes; removes those of dead
/// processes; every file named like a record that is not one (a link, a FIFO, the wrong
/// size, values that do not add up) is skipped, never followed or waited on, and named.
pub fn read_records_in(dir: &RuntimeDir) -> RecordScan {
    let mut scan = RecordScan::default();
    let size = std::mem::size_of::<Record>();
    for name in dir.names() {
        if !(name.starts_with("proc-") && name.ends_with(".rec")) {
            continue;
        }
        let (f, bytes) = match dir.read_record_file(&name, size) {
            Ok(x) => x,
            Err(why) => {
                scan.skipped.push((name, why));
                continue;
            }
        };
        if flock(&f, libc::LOCK_SH) {
            // Nobody holds it: its process is gone (or closed its runtime).
            let _ = dir.remove(&name);
            continue;
        }
        match parse_record(&bytes) {
            Ok(r) => scan.records.push((name, r)),
            Err(why) => scan.skipped.push((name, why)),
        }
    }
    scan.records.sort_by_key(|(_, r)| (r.pid, r.start_unix_ns));
    scan
}

/// [`read_records_in`] of the directory at `dir` (nothing when it cannot be opened).
pub fn scan_records(dir: &Path) -> RecordScan {
    match RuntimeDir::open_for_reading(dir) {
        Ok(d) => read_records_in(&d),
        Err(_) => RecordScan::default(),
    }
}

/// The records of the live runtimes in `dir`, by pid; removes those of dead processes and
/// leaves out files that are not usable records ([`scan_records`] names them).
pub fn read_records(dir: &Path) -> Vec<ProcessRecord> {
    scan_records(dir)
        .records
        .into_iter()
        .map(|(_, r)| r)
        .collect()
}
