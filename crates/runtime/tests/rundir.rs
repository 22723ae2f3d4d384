//! The runtime directory against a local attacker (issue 54, S1–S3, S6): planted links and
//! FIFOs, directories others can write, records that do not add up, a full file system. Each
//! test fails without its fix: the victim file is changed, the reader hangs or allocates
//! without bound, or the runtime dies of SIGBUS.

mod common;

use common::*;
use nrt_runtime::host::{self, RuntimeDir};
use nrt_runtime::{NrtStatus, Runtime, RuntimeConfig};
use nrt_sim::SoftDevice;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A fresh directory of this test (mode 0700).
fn fresh(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("rundir-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
    d
}

/// `path`, made mode 0700 (a runtime directory a runtime accepts).
fn private_dir(path: &Path) -> PathBuf {
    std::fs::create_dir(path).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700)).unwrap();
    path.to_path_buf()
}

fn owning(dev: &Arc<SoftDevice>, dir: &Path) -> nrt_runtime::Result<Runtime> {
    Runtime::init(
        dev.clone(),
        RuntimeConfig {
            ownership: Some(dir.to_owned()),
            visible_cores: Some(vec![0]),
            ..Default::default()
        },
    )
}

/// A file the attacker wants destroyed, outside the runtime directory.
fn victim(base: &Path) -> PathBuf {
    let v = base.join("victim.txt");
    std::fs::write(&v, b"precious").unwrap();
    v
}

#[test]
fn planted_links_at_the_records_temporary_names_are_never_followed() {
    let base = fresh("tmp-links");
    let dir = private_dir(&base.join("run"));
    let v = victim(&base);
    // Every temporary name this process could use next (n counts from 0 per process).
    let pid = std::process::id();
    for n in 0..2000 {
        symlink(&v, dir.join(format!(".proc-{pid}-{n}.tmp"))).unwrap();
    }
    let e = owning(&device(), &dir).unwrap_err();
    assert_eq!(e.status, NrtStatus::Resource, "{e}");
    assert!(e.message.contains("fresh names were all taken"), "{e}");
    assert_eq!(std::fs::read(&v).unwrap(), b"precious");
    // With fresh names free again it starts, and publishes under a name nobody planted.
    for n in 0..2000 {
        let _ = std::fs::remove_file(dir.join(format!(".proc-{pid}-{n}.tmp")));
    }
    let rt = owning(&device(), &dir).unwrap();
    assert_eq!(host::read_records(&dir).len(), 1);
    drop(rt);
    assert_eq!(std::fs::read(&v).unwrap(), b"precious");
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn a_planted_lock_or_record_link_is_refused_and_the_target_untouched() {
    let base = fresh("lock-link");
    let dir = private_dir(&base.join("run"));
    let v = victim(&base);
    symlink(&v, dir.join("core-0.lock")).unwrap();
    let e = owning(&device(), &dir).unwrap_err();
    assert_eq!(e.status, NrtStatus::Resource, "{e}");
    assert!(e.message.contains("core-0.lock"), "{e}");
    assert_eq!(std::fs::read(&v).unwrap(), b"precious");
    // The refused runtime left no record or temporary file behind.
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left, vec!["core-0.lock".to_owned()], "{left:?}");
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn directories_others_can_write_are_refused_saying_how_to_share() {
    let base = fresh("modes");
    let dir = base.join("run");
    std::fs::create_dir(&dir).unwrap();
    for (mode, why) in [
        (0o777, "every user can write it"),
        (0o1777, "every user can write it"),
        (0o770, "without the sticky bit"),
    ] {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
        let e = owning(&device(), &dir).unwrap_err();
        assert_eq!(e.status, NrtStatus::Resource, "{mode:o}: {e}");
        assert!(e.message.contains(why), "{mode:o}: {e}");
        assert!(
            e.message.contains("install -d -o root -g GROUP -m 3770"),
            "{e}"
        );
        assert!(
            std::fs::read_dir(&dir).unwrap().next().is_none(),
            "{mode:o}"
        );
    }
    // A group directory with the sticky bit, of our own group, is a deliberate share.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1770)).unwrap();
    let rt = owning(&device(), &dir).unwrap();
    // Its files are readable by the group whatever the umask: others can lock the cores.
    for e in std::fs::read_dir(&dir).unwrap() {
        let e = e.unwrap();
        let mode = e.metadata().unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644, "{:?}", e.file_name());
    }
    drop(rt);
    // A missing directory is made 0700.
    let made = base.join("made/run");
    drop(owning(&device(), &made).unwrap());
    let mode = std::fs::metadata(&made).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o700);
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn readers_never_follow_or_wait_on_what_is_planted() {
    let dir = fresh("readers");
    // A FIFO (opened blocking it would hang the reader), a link to an endless device (read
    // to its end it never ends), a directory and a short file, all named like records.
    let fifo = std::ffi::CString::new(dir.join("proc-1-0.rec").to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    symlink("/dev/zero", dir.join("proc-2-0.rec")).unwrap();
    std::fs::create_dir(dir.join("proc-3-0.rec")).unwrap();
    std::fs::write(dir.join("proc-4-0.rec"), b"short").unwrap();
    let t = Instant::now();
    let scan = host::scan_records(&dir);
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert!(scan.records.is_empty());
    let mut why: Vec<_> = scan
        .skipped
        .iter()
        .map(|(n, w)| format!("{n}: {w}"))
        .collect();
    why.sort();
    assert_eq!(why.len(), 4, "{why:?}");
    assert!(
        why[0].starts_with("proc-1-0.rec: not a regular file"),
        "{why:?}"
    );
    assert!(
        why[1].starts_with("proc-2-0.rec: a symbolic link"),
        "{why:?}"
    );
    assert!(
        why[2].starts_with("proc-3-0.rec: not a regular file"),
        "{why:?}"
    );
    assert!(
        why[3].starts_with("proc-4-0.rec: 5 bytes, a record has"),
        "{why:?}"
    );
    // A runtime finding its core busy reads the records too: with the planted files there
    // it still starts (and, refused, would name the owner without hanging).
    let rt = owning(&device(), &dir).unwrap();
    let e = owning(&device(), &dir).unwrap_err();
    assert!(e.message.contains("NeuronCore 0 is in use by pid"), "{e}");
    drop(rt);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_record_that_does_not_add_up_is_skipped_and_named() {
    let dir = fresh("bad-record");
    let rt = owning(&device(), &dir).unwrap();
    let scan = host::scan_records(&dir);
    let (name, rec) = &scan.records[0];
    let good = std::fs::read(dir.join(name)).unwrap();
    assert_eq!(host::parse_record(&good).unwrap(), *rec);
    // The offsets of the words a hostile record changes: the header's `vcores`, the first
    // logical core's `cores`, its first status counter, and the header's `pid`.
    let word = |bytes: &mut Vec<u8>, i: usize, v: u64| {
        bytes[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
    };
    let header_words = std::mem::size_of::<host::Header>() / 8;
    let (pid_w, vcores_w) = (3, 6);
    let cores_w = header_words + 1;
    let status_w = header_words + 2;
    for (w, v, why) in [
        (cores_w, 0xffff_ffff, "spans 4294967295 cores"),
        (vcores_w, 1 << 40, "logical cores, a record holds at most"),
        (pid_w, 0, "process id 0"),
        (0, 7, "bad magic"),
    ] {
        let mut b = good.clone();
        word(&mut b, w, v);
        let e = host::parse_record(&b).unwrap_err();
        assert!(e.contains(why), "{e}");
    }
    // Counters past what a record can hold are clamped, so sums over a record never overflow.
    let mut b = good.clone();
    word(&mut b, status_w, u64::MAX);
    let r = host::parse_record(&b).unwrap();
    assert_eq!(r.vcores[0].status[0], host::MAX_RECORD_COUNT);
    // A live record file with a hostile core count: skipped and named, not looped over.
    let mut b = good.clone();
    word(&mut b, cores_w, 0xffff_ffff);
    let planted = dir.join("proc-99-0.rec");
    std::fs::write(&planted, &b).unwrap();
    let held = std::fs::File::open(&planted).unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&held);
    // SAFETY: flock on a descriptor we own.
    let locked = unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(locked, 0);
    let scan = host::scan_records(&dir);
    assert_eq!(scan.records.len(), 1);
    assert_eq!(scan.skipped.len(), 1, "{:?}", scan.skipped);
    assert_eq!(scan.skipped[0].0, "proc-99-0.rec");
    assert!(scan.skipped[0].1.contains("spans"), "{:?}", scan.skipped);
    drop((held, rt));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_full_file_system_is_a_resource_error_not_a_sigbus() {
    // A 64 KiB tmpfs cannot hold a record (~360 KB): written through a sparse mapping, the
    // first store past the space would kill the process with SIGBUS.
    let base = fresh("full");
    let mnt = base.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs"])
        .arg(&mnt)
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("skipped: cannot mount a small tmpfs here (needs root and mount rights)");
        let _ = std::fs::remove_dir_all(&base);
        return;
    }
    let e = owning(&device(), &mnt).unwrap_err();
    let listing: Vec<_> = std::fs::read_dir(&mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let _ = std::process::Command::new("umount").arg(&mnt).status();
    assert_eq!(e.status, NrtStatus::Resource, "{e}");
    assert!(e.message.contains("cannot reserve"), "{e}");
    assert!(e.message.contains(mnt.to_str().unwrap()), "{e}");
    assert!(listing.is_empty(), "left behind: {listing:?}");
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn the_default_directory_is_per_user() {
    let d = host::runtime_dir_from_env();
    if std::env::var_os("NRT_RUNTIME_DIR").is_none()
        && std::env::var_os("XDG_RUNTIME_DIR").is_none()
    {
        // SAFETY: geteuid cannot fail.
        let uid = unsafe { libc::geteuid() };
        assert!(d.ends_with(format!("nrt-rs-{uid}")), "{}", d.display());
    }
    // Opening a directory for reading takes any directory; a runtime would check it.
    let r = RuntimeDir::open_for_reading(Path::new("/tmp")).unwrap();
    assert!(r.check().unwrap_err().contains("every user can write it"));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]
    /// The fuzz target `record_parse` as a property (every CI run): a valid record with any
    /// words overwritten parses to a record every consumer can sum without overflow, or to a
    /// reason; never a panic.
    #[test]
    fn any_patched_record_parses_to_summable_values_or_a_reason(
        patches in proptest::collection::vec(
            (0usize..4096, proptest::prelude::prop_oneof![
                proptest::prelude::Just(u64::MAX),
                proptest::prelude::Just(0xffff_ffffu64),
                proptest::prelude::Just(0u64),
                proptest::prelude::any::<u64>(),
            ]),
            0..24,
        )
    ) {
        let words = std::mem::size_of::<host::Record>() / 8;
        let header_words = std::mem::size_of::<host::Header>() / 8;
        let mut rec = vec![0u64; words];
        rec[0] = host::RECORD_MAGIC;
        rec[1] = host::RECORD_VERSION;
        rec[3] = 4242;
        rec[5] = 1;
        rec[6] = 2;
        rec[header_words + 1] = 1;
        // Most patches land in the header and the first logical cores, where the checks are.
        for (i, v) in patches {
            rec[i % words] = v;
        }
        let bytes: Vec<u8> = rec.iter().flat_map(|w| w.to_le_bytes()).collect();
        if let Ok(r) = host::parse_record(&bytes) {
            let mut hist = vec![0u64; host::HIST_BUCKETS];
            let (mut done, mut used, mut busy) = (0u64, 0u64, 0u64);
            for v in &r.vcores {
                proptest::prop_assert!(v.first_core as u64 + v.cores as u64 <= 256);
                done += v.status.iter().sum::<u64>() + v.errors.iter().sum::<u64>();
                used += v.mem.iter().sum::<u64>();
                busy += v.busy_ns;
                for (h, x) in hist.iter_mut().zip(&v.lat_total) {
                    *h += x;
                }
            }
            for m in &r.models {
                used += m.mem.iter().sum::<u64>();
            }
            let _ = (done, used, busy, host::percentile(&hist, 99.0));
        }
    }
}
