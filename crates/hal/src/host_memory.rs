//! How much memory this process can still get from the host: the smaller of the host's
//! `MemAvailable` and the headroom of every memory cgroup it sits in (a container's limit).
//!
//! A large host allocation whose size comes from outside (a caller's tensor, a model's folded
//! constant) is checked against it first: with overcommit, the allocation itself succeeds and
//! the OOM killer ends the process later, when the pages are touched. Inside a container the
//! host's `MemAvailable` is the whole machine's; the container's OOM killer acts at its cgroup
//! limit, which is what Kubernetes, Docker and Ray's containers set.
//!
//! - **cgroup v2**: `memory.max` − `memory.current` of the process's cgroup
//!   (`0::<path>` of `/proc/self/cgroup`) and of each ancestor up to the root, with the
//!   reclaimable page cache (`inactive_file` of `memory.stat`) counted as free, as the
//!   kubelet's working-set figure does.
//! - **cgroup v1**: the same with `memory.limit_in_bytes` and `memory.usage_in_bytes` under the
//!   `memory` controller's hierarchy.
//!
//! - **`NRT_HOST_MEMORY_MAX`** (bytes, or with `K`/`M`/`G`/`T`): a cap the user sets on this
//!   process (beside co-tenants, or to make a fuzzer's large allocations findings): its
//!   headroom is the cap less the process's resident memory. A value that is not a size is an
//!   error where the runtime starts and where the compiler starts ([`memory_cap_from_env`]).
//!
//! The cgroup file system is read where it is usually mounted (`/sys/fs/cgroup`, its
//! `unified` and `memory` directories); a layout that differs is read as "no limit", never as
//! an error: the check is a guard, not a contract.

use std::path::{Path, PathBuf};

/// The environment variable of the user's cap on this process's memory.
pub const MEMORY_CAP_VAR: &str = "NRT_HOST_MEMORY_MAX";

/// The memory this process can still get: [`meminfo_available`], [`cgroup_headroom`] and the
/// headroom under [`MEMORY_CAP_VAR`], whichever is smallest (`None` if none can be read).
pub fn host_memory_available() -> Option<u64> {
    let proc_cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let cgroup = cgroup_headroom(Path::new("/sys/fs/cgroup"), &proc_cgroup);
    let cap = memory_cap_from_env()
        .ok()
        .flatten()
        .map(|cap| cap.saturating_sub(resident_bytes().unwrap_or(0)));
    [meminfo_available(), cgroup, cap]
        .into_iter()
        .flatten()
        .min()
}

/// [`MEMORY_CAP_VAR`]: `None` if unset or empty, else the size, or an error naming the
/// variable and its value.
pub fn memory_cap_from_env() -> Result<Option<u64>, String> {
    match std::env::var(MEMORY_CAP_VAR) {
        Ok(v) if !v.trim().is_empty() => parse_size(&v).map(Some).ok_or_else(|| {
            format!("{MEMORY_CAP_VAR}={v:?} is not a size (bytes, or e.g. 4G, 512MiB)")
        }),
        _ => Ok(None),
    }
}

/// A size: bytes, or a number with `K`, `M`, `G` or `T` (powers of 1024; `KiB`, `GB` and the
/// like accepted); `None` if it is not one or overflows.
pub fn parse_size(v: &str) -> Option<u64> {
    let s = v.trim();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let n: u64 = s[..digits].parse().ok()?;
    let unit = s[digits..].trim().to_ascii_uppercase();
    let shift = match unit.trim_end_matches("IB").trim_end_matches('B') {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return None,
    };
    n.checked_mul(1u64 << shift)
}

/// This process's resident memory (`/proc/self/statm`), in bytes.
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages.checked_mul(u64::try_from(page).ok().filter(|&p| p > 0)?)
}

/// `MemAvailable` of `/proc/meminfo` in bytes: what the host can back without swapping.
pub fn meminfo_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The smallest headroom (limit − usage + reclaimable cache) over the memory cgroups of
/// `proc_cgroup` (the text of `/proc/self/cgroup`) and their ancestors, read under `root`
/// (normally `/sys/fs/cgroup`); `None` if no level has a limit.
pub fn cgroup_headroom(root: &Path, proc_cgroup: &str) -> Option<u64> {
    let mut best: Option<u64> = None;
    for line in proc_cgroup.lines() {
        // `hierarchy-id:controllers:path`; v2's is `0::path`.
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let levels = if id == "0" && controllers.is_empty() {
            // The v2 hierarchy: mounted at the root itself (pure v2) or at `unified` (hybrid).
            [root.to_path_buf(), root.join("unified")]
                .into_iter()
                .filter(|r| r.join("cgroup.controllers").exists())
                .flat_map(|r| ancestors(&r, path))
                .filter_map(|d| headroom(&d, "memory.max", "memory.current"))
                .min()
        } else if controllers.split(',').any(|c| c == "memory") {
            ancestors(&root.join("memory"), path)
                .into_iter()
                .filter_map(|d| headroom(&d, "memory.limit_in_bytes", "memory.usage_in_bytes"))
                .min()
        } else {
            None
        };
        if let Some(h) = levels {
            best = Some(best.map_or(h, |b| b.min(h)));
        }
    }
    best
}

/// `base/path` and each of its ancestors down to `base` (a `path` that climbs out with `..`
/// yields nothing).
fn ancestors(base: &Path, path: &str) -> Vec<PathBuf> {
    let rel = path.trim_start_matches('/');
    if rel.split('/').any(|c| c == "..") {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut at = base.join(rel);
    loop {
        out.push(at.clone());
        if at == base || !at.pop() || !at.starts_with(base) {
            break;
        }
    }
    out
}

/// One cgroup's headroom: `limit − usage + inactive_file`, or `None` where it has no limit
/// (`max`, or v1's "unlimited" near `i64::MAX`) or the files are not there.
fn headroom(dir: &Path, limit_file: &str, usage_file: &str) -> Option<u64> {
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
    let limit: u64 = read(limit_file)?.trim().parse().ok()?;
    // v1 writes "no limit" as the largest page-aligned i64.
    if limit >= 1 << 62 {
        return None;
    }
    let usage: u64 = read(usage_file)?.trim().parse().ok()?;
    let reclaimable = read("memory.stat")
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("inactive_file "))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .unwrap_or(0);
    Some(limit.saturating_sub(usage.saturating_sub(reclaimable)))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Dir(PathBuf);

    impl Dir {
        fn new(tag: &str) -> Dir {
            let d = std::env::temp_dir().join(format!(
                "nrt-hal-cgroup-{tag}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).expect("temp dir");
            Dir(d)
        }

        fn write(&self, rel: &str, text: &str) {
            let p = self.0.join(rel);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(p, text).expect("write");
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    const GIB: u64 = 1 << 30;

    #[test]
    fn v2_takes_the_tightest_ancestor_and_counts_inactive_file_as_free() {
        let d = Dir::new("v2");
        d.write("cgroup.controllers", "cpu memory\n");
        // The pod: 4 GiB, 3 GiB used of which 1 GiB is inactive page cache.
        d.write("kubepods/pod1/memory.max", &format!("{}\n", 4 * GIB));
        d.write("kubepods/pod1/memory.current", &format!("{}\n", 3 * GIB));
        d.write(
            "kubepods/pod1/memory.stat",
            &format!("anon 1\ninactive_file {GIB}\n"),
        );
        // The container inside it: no limit of its own.
        d.write("kubepods/pod1/ctr/memory.max", "max\n");
        d.write("kubepods/pod1/ctr/memory.current", "100\n");
        // The slice above: 16 GiB, nearly empty.
        d.write("kubepods/memory.max", &format!("{}\n", 16 * GIB));
        d.write("kubepods/memory.current", "0\n");
        let h = cgroup_headroom(&d.0, "0::/kubepods/pod1/ctr\n");
        assert_eq!(h, Some(2 * GIB));
    }

    #[test]
    fn v2_in_a_cgroup_namespace_reads_the_root() {
        let d = Dir::new("v2ns");
        d.write("cgroup.controllers", "memory\n");
        d.write("memory.max", &format!("{}\n", 2 * GIB));
        d.write("memory.current", &format!("{}\n", GIB / 2));
        assert_eq!(cgroup_headroom(&d.0, "0::/\n"), Some(GIB + GIB / 2));
    }

    #[test]
    fn v1_memory_controller_and_its_unlimited_marker() {
        let d = Dir::new("v1");
        d.write(
            "memory/job/memory.limit_in_bytes",
            &format!("{}\n", 8 * GIB),
        );
        d.write(
            "memory/job/memory.usage_in_bytes",
            &format!("{}\n", 7 * GIB),
        );
        d.write("memory/memory.limit_in_bytes", "9223372036854771712\n");
        d.write("memory/memory.usage_in_bytes", &format!("{}\n", 20 * GIB));
        let proc = "12:pids:/job\n4:memory:/job\n0::/\n";
        assert_eq!(cgroup_headroom(&d.0, proc), Some(GIB));
        // Only the unlimited root: no limit.
        assert_eq!(cgroup_headroom(&d.0, "4:memory:/\n"), None);
    }

    #[test]
    fn usage_over_the_limit_is_zero_headroom_and_odd_files_are_no_limit() {
        let d = Dir::new("odd");
        d.write("memory/a/memory.limit_in_bytes", "1000\n");
        d.write("memory/a/memory.usage_in_bytes", "5000\n");
        assert_eq!(cgroup_headroom(&d.0, "4:memory:/a\n"), Some(0));
        d.write("memory/b/memory.limit_in_bytes", "lots\n");
        d.write("memory/b/memory.usage_in_bytes", "1\n");
        assert_eq!(cgroup_headroom(&d.0, "4:memory:/b\n"), None);
        // A path that climbs out of the hierarchy, a v2 line without a v2 mount, garbage.
        assert_eq!(cgroup_headroom(&d.0, "4:memory:/../../etc\n"), None);
        assert_eq!(cgroup_headroom(&d.0, "0::/a\n"), None);
        assert_eq!(cgroup_headroom(&d.0, "garbage\n\n::\n"), None);
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("32G"), Some(32 * GIB));
        assert_eq!(parse_size(" 512MiB "), Some(512 << 20));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("1 kb"), Some(1024));
        assert_eq!(parse_size("99999999999T"), None);
        assert_eq!(parse_size("-1"), None);
        assert_eq!(parse_size("4Q"), None);
        assert_eq!(parse_size(""), None);
    }

    #[test]
    fn this_host_reads_something_and_never_more_than_meminfo() {
        if let (Some(all), Some(m)) = (host_memory_available(), meminfo_available()) {
            assert!(all <= m);
        }
    }
}
