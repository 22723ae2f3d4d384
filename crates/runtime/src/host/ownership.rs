//! Core ownership: the cores' locks and the published record of one runtime, made safely
//! in the runtime directory ([`super::rundir`]'s threat model).

use super::read::{ProcessRecord, read_records_in};
use super::rundir::{self, RuntimeDir};
use super::{
    CMDLINE_BYTES, CORE_WORDS, MAX_RECORD_VCORES, Mapping, RECORD_MAGIC, RECORD_VERSION, Record,
    STATE_ACQUIRING, STATE_HOLDING, StatsArea, store_text,
};
use crate::error::{NrtError, Result};
use nrt_hal::NrtStatus;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Held cores and the published record of one runtime.
#[derive(Debug)]
pub(crate) struct Ownership {
    locks: Vec<File>,
    dir: RuntimeDir,
    record_name: String,
    _record: File,
}

impl Drop for Ownership {
    fn drop(&mut self) {
        // Unlink first: a reader must never find the record unlocked while this process
        // lives. Then unlock explicitly: a lock belongs to the open file description, which
        // a forked child that never closes its inherited descriptors would keep locked.
        let _ = self.dir.remove(&self.record_name);
        for f in &self.locks {
            // SAFETY: flock on a descriptor we own.
            unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_UN) };
        }
        // SAFETY: as above.
        unsafe { libc::flock(self._record.as_raw_fd(), libc::LOCK_UN) };
    }
}

pub(super) fn flock(f: &File, op: i32) -> bool {
    // SAFETY: flock on a descriptor we own.
    unsafe { libc::flock(f.as_raw_fd(), op | libc::LOCK_NB) == 0 }
}

fn own_cmdline() -> String {
    let raw = std::fs::read("/proc/self/cmdline").unwrap_or_default();
    cmdline_text(&raw)
}

pub(super) fn cmdline_text(raw: &[u8]) -> String {
    let s: String = String::from_utf8_lossy(raw)
        .split('\0')
        .filter(|a| !a.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    let mut end = s.len().min(CMDLINE_BYTES);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> NrtError {
    NrtError::new(
        NrtStatus::Resource,
        format!(
            "cannot use the runtime directory (NRT_RUNTIME_DIR): {what} {}: {e}",
            path.display()
        ),
    )
}

static RECORD_SEQ: AtomicU64 = AtomicU64::new(0);

/// Tries of fresh names for the record (a planted name is skipped, never opened).
const NAME_TRIES: u32 = 64;

/// Takes the cores' locks in `dir` and publishes the record; returns the ownership and the
/// statistics area (the record's mapping). `host_cores`: how many cores the host has (a
/// refusal names those free).
pub(crate) fn acquire(
    dir: &Path,
    cores: &[u32],
    lnc: u32,
    vcores: usize,
    host_cores: u32,
) -> Result<(Ownership, StatsArea)> {
    if vcores > MAX_RECORD_VCORES || cores.iter().any(|&c| c as usize >= CORE_WORDS * 64) {
        return Err(NrtError::invalid(format!(
            "a runtime directory record describes at most {MAX_RECORD_VCORES} logical cores of ids below {}",
            CORE_WORDS * 64
        )));
    }
    let rdir =
        RuntimeDir::open_for_runtime(dir).map_err(|m| NrtError::new(NrtStatus::Resource, m))?;
    let pid = std::process::id();
    let len = std::mem::size_of::<Record>();
    // Created under a fresh temporary name (O_EXCL|O_NOFOLLOW) and locked before the rename,
    // so a reader never finds an unlocked live record.
    let mut made = None;
    for _ in 0..NAME_TRIES {
        let n = RECORD_SEQ.fetch_add(1, Ordering::Relaxed);
        let tmp = format!(".proc-{pid}-{n}.tmp");
        match rdir.create_new(&tmp, 0o644) {
            Ok(f) => {
                made = Some((tmp, f));
                break;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io_err("creating", &dir.join(&tmp), e)),
        }
    }
    let Some((tmp, f)) = made else {
        return Err(NrtError::new(
            NrtStatus::Resource,
            format!(
                "cannot create a record in the runtime directory {}: {NAME_TRIES} fresh names were all taken (files planted by another process?)",
                dir.display()
            ),
        ));
    };
    let fail = |what: &str, e: std::io::Error| {
        let _ = rdir.remove(&tmp);
        io_err(what, &dir.join(&tmp), e)
    };
    if let Err(e) = rundir::reserve(&f, len as u64) {
        let _ = rdir.remove(&tmp);
        return Err(NrtError::new(
            NrtStatus::Resource,
            format!(
                "cannot reserve the {len}-byte record in the runtime directory {}: {e} (free space there, or point NRT_RUNTIME_DIR elsewhere)",
                dir.display()
            ),
        ));
    }
    if !flock(&f, libc::LOCK_EX) {
        return Err(fail("locking", std::io::Error::last_os_error()));
    }
    let map = Mapping::new(&f).map_err(|e| fail("mapping", e))?;
    let h = &map.record().header;
    h.pid.store(pid as u64, Ordering::Relaxed);
    let start = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    h.start_unix_ns.store(start, Ordering::Relaxed);
    h.lnc.store(lnc as u64, Ordering::Relaxed);
    h.vcores.store(vcores as u64, Ordering::Relaxed);
    for &c in cores {
        let w = &h.cores[c as usize / 64];
        w.store(w.load(Ordering::Relaxed) | 1 << (c % 64), Ordering::Relaxed);
    }
    let cmd = own_cmdline();
    let n = store_text(&h.cmdline, &cmd);
    h.cmdline_len.store(n as u64, Ordering::Relaxed);
    let tag = std::env::var("NEURON_PROCESS_TAG").unwrap_or_default();
    let n = store_text(&h.tag, &tag);
    h.tag_len.store(n as u64, Ordering::Relaxed);
    h.version.store(RECORD_VERSION, Ordering::Relaxed);
    h.state.store(STATE_ACQUIRING, Ordering::Relaxed);
    h.magic.store(RECORD_MAGIC, Ordering::Release);
    // Published under a name nobody holds: the rename never replaces a file.
    let mut record_name = None;
    for _ in 0..NAME_TRIES {
        let n = RECORD_SEQ.fetch_add(1, Ordering::Relaxed);
        let name = format!("proc-{pid}-{n}.rec");
        match rdir.rename_noreplace(&tmp, &name) {
            Ok(()) => {
                record_name = Some(name);
                break;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(fail("publishing", e)),
        }
    }
    let Some(record_name) = record_name else {
        return Err(fail(
            "publishing",
            std::io::Error::other(format!("{NAME_TRIES} record names were all taken")),
        ));
    };
    let mut own = Ownership {
        locks: Vec::with_capacity(cores.len()),
        dir: rdir,
        record_name,
        _record: f,
    };
    for &c in cores {
        let name = format!("core-{c}.lock");
        let lf = own
            .dir
            .open_lock(&name)
            .map_err(|e| io_err("opening the lock", &dir.join(&name), e))?;
        if !flock(&lf, libc::LOCK_EX) {
            let e = in_use_error(&own.dir, c, &own.record_name, host_cores);
            drop(own); // unlinks our record, releases the cores taken so far
            return Err(e);
        }
        own.locks.push(lf);
    }
    h.state.store(STATE_HOLDING, Ordering::Release);
    Ok((own, StatsArea::Shared(map)))
}

#[cold]
fn in_use_error(dir: &RuntimeDir, core: u32, ours: &str, host_cores: u32) -> NrtError {
    // The holder published its record before it took the lock; a record still acquiring
    // (a process that is about to be refused as well) is the fallback.
    let records: Vec<ProcessRecord> = read_records_in(dir)
        .records
        .into_iter()
        .filter(|(name, _)| name != ours)
        .map(|(_, r)| r)
        .collect();
    let mut best: Option<&ProcessRecord> = None;
    for r in &records {
        if r.cores.contains(&core) && best.is_none_or(|b| !b.holding && r.holding) {
            best = Some(r);
        }
    }
    let who = match best {
        Some(r) => format!("pid {} ({})", r.pid, r.cmdline),
        None => "another process".to_owned(),
    };
    NrtError::new(
        NrtStatus::Resource,
        format!(
            "NeuronCore {core} is in use by {who} (runtime directory {}); {}",
            dir.path().display(),
            free_cores_hint(&records, host_cores)
        ),
    )
}

/// What a refused runtime can take instead: the cores no other runtime holds (the longest
/// contiguous run, as `NEURON_RT_VISIBLE_CORES` wants it), or, when none is free, who holds
/// them.
fn free_cores_hint(records: &[ProcessRecord], host_cores: u32) -> String {
    let held = |c: u32| records.iter().any(|r| r.cores.contains(&c));
    let free: Vec<u32> = (0..host_cores).filter(|&c| !held(c)).collect();
    if free.is_empty() {
        let holders: Vec<String> = records
            .iter()
            .filter(|r| !r.cores.is_empty())
            .map(|r| {
                format!(
                    "pid {} ({}) holds {}",
                    r.pid,
                    r.cmdline,
                    core_list(&r.cores)
                )
            })
            .collect();
        return format!(
            "no NeuronCore of the {host_cores} is free: {}",
            if holders.is_empty() {
                "their holders published no record".to_owned()
            } else {
                holders.join(", ")
            }
        );
    }
    // The longest run of consecutive free cores.
    let (mut best, mut start) = ((free[0], free[0]), free[0]);
    for w in free.windows(2) {
        if w[1] != w[0] + 1 {
            start = w[1];
        }
        if w[1] - start > best.1 - best.0 {
            best = (start, w[1]);
        }
    }
    let run = if best.0 == best.1 {
        best.0.to_string()
    } else {
        format!("{}-{}", best.0, best.1)
    };
    format!(
        "free NeuronCores: {}; NEURON_RT_VISIBLE_CORES={run} selects {}",
        core_list(&free),
        if best.0 == best.1 { "it" } else { "them" }
    )
}

/// Core ids as ranges: `0-3,6`.
fn core_list(cores: &[u32]) -> String {
    let mut v = cores.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            v[i].to_string()
        } else {
            format!("{}-{}", v[i], v[j])
        });
        i = j + 1;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(pid: u32, cores: &[u32]) -> ProcessRecord {
        ProcessRecord {
            pid,
            start_unix_ns: 0,
            cmdline: format!("serve {pid}"),
            tag: String::new(),
            models: Vec::new(),
            cores: cores.to_vec(),
            holding: true,
            lnc: 1,
            vcores: Vec::new(),
        }
    }

    #[test]
    fn a_refusal_names_the_free_cores() {
        let h = free_cores_hint(&[holder(7, &[0, 1]), holder(8, &[4])], 8);
        assert_eq!(
            h,
            "free NeuronCores: 2-3,5-7; NEURON_RT_VISIBLE_CORES=5-7 selects them"
        );
        let h = free_cores_hint(&[holder(7, &[0])], 2);
        assert_eq!(
            h,
            "free NeuronCores: 1; NEURON_RT_VISIBLE_CORES=1 selects it"
        );
    }

    #[test]
    fn a_refusal_with_no_free_core_names_the_holders() {
        let h = free_cores_hint(&[holder(7, &[0, 1]), holder(8, &[2, 3])], 4);
        assert_eq!(
            h,
            "no NeuronCore of the 4 is free: pid 7 (serve 7) holds 0-1, pid 8 (serve 8) holds 2-3"
        );
    }
}
