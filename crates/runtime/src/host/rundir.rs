//! The runtime directory: where it is, who may write it, and how files in it are opened.
//!
//! # Threat model
//!
//! The runtime directory holds `core-<c>.lock` (one `flock` per physical core) and one
//! `proc-<pid>-<n>.rec` per runtime (its published statistics, mapped shared). Other local
//! users are the adversary: they may create, rename or remove files in any directory they can
//! write, and they can predict our names (pids are visible, `n` counts from 0).
//!
//! - **Where.** The default is per user: `$XDG_RUNTIME_DIR/nrt-rs` when `XDG_RUNTIME_DIR` is
//!   a directory the user owns (sudo may keep the invoking user's), else `nrt-rs-<uid>` under
//!   `/dev/shm` (or `/tmp` without it), created mode 0700. Sharing NeuronCores between users is
//!   a choice: `NRT_RUNTIME_DIR` naming a directory owned by root, of a group every sharing user
//!   is in, group-writable with the sticky bit (`install -d -o root -g GROUP -m 3770 DIR`).
//! - **Who may write it** ([`check_runtime_dir`], on the open directory, every start): it is
//!   owned by the user or by root; nobody else may write it (no `o+w`); a group may write it
//!   only with the sticky bit (so nobody removes or renames another's files) and only a group
//!   the user is in. Every ancestor is owned by root or the user, and writable by others only
//!   with the sticky bit (OpenSSH's StrictModes). A symbolic link in the path is resolved first;
//!   a link owned by another user is refused. A refusal says what is wrong and how to fix it.
//! - **What a runtime writes.** Only through the directory's descriptor (`openat`,
//!   `renameat2`, `unlinkat`: the path is resolved once): records created `O_CREAT|O_EXCL|
//!   O_NOFOLLOW` under a fresh temporary name (a planted name is skipped, never opened), their
//!   space reserved up front (`posix_fallocate`: a full file system is `NRT_RESOURCE` naming the
//!   directory, never a SIGBUS through the mapping), published by a rename that never replaces;
//!   lock files opened read-only, `O_NOFOLLOW|O_NONBLOCK`, and used only if regular files.
//!   Files are made mode 0644 whatever the umask, so the users of a shared directory can read
//!   each other's records and lock each other's cores.
//! - **What a reader trusts** ([`RuntimeDir::read_record_file`]): nothing it did not check. A
//!   record is opened `O_NOFOLLOW|O_NONBLOCK` (a FIFO or a link to a device is never read),
//!   must be a regular file of exactly a record's size, and is read exactly that; its values
//!   are checked against what a record can hold, and one that does not add up is skipped and
//!   named (`host::read::parse_record`).
//! - **What is left.** A user of a shared directory can hold every core of it (that is what
//!   sharing means) and publish records that misreport its own process; the owner of a lock
//!   file can remove it while another holds it. Share a directory only among users who may
//!   use each other's cores.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The runtime directory: `NRT_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/nrt-rs` when the user
/// owns `XDG_RUNTIME_DIR`, else `/dev/shm/nrt-rs-<uid>` (`/tmp/nrt-rs-<uid>` without
/// `/dev/shm`).
pub fn runtime_dir_from_env() -> PathBuf {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(d) = var("NRT_RUNTIME_DIR") {
        return PathBuf::from(d);
    }
    let uid = euid();
    if let Some(x) = var("XDG_RUNTIME_DIR").map(PathBuf::from)
        && x.is_absolute()
        && std::fs::metadata(&x).is_ok_and(|m| m.is_dir() && m.uid() == uid)
    {
        return x.join("nrt-rs");
    }
    let base = if Path::new("/dev/shm").is_dir() {
        "/dev/shm"
    } else {
        "/tmp"
    };
    PathBuf::from(base).join(format!("nrt-rs-{uid}"))
}

/// How to fix a refused directory, appended to every refusal.
const HOW_TO_SHARE: &str = "use the per-user default (unset NRT_RUNTIME_DIR) or a directory of your own (mkdir -m 700 DIR); to share NeuronCores between users deliberately, point NRT_RUNTIME_DIR at a directory owned by root, of a group every sharing user is in, group-writable with the sticky bit (install -d -o root -g GROUP -m 3770 DIR)";

/// The file-status facts the directory checks look at.
#[derive(Clone, Copy, Debug)]
pub struct DirFacts {
    /// Whether it is a directory.
    pub is_dir: bool,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Permission bits, sticky included (`st_mode & 0o7777`).
    pub mode: u32,
}

impl DirFacts {
    fn of(m: &std::fs::Metadata) -> DirFacts {
        DirFacts {
            is_dir: m.is_dir(),
            uid: m.uid(),
            gid: m.gid(),
            mode: m.mode() & 0o7777,
        }
    }
}

/// Who is asking: the effective user and whether it is in a group.
#[derive(Clone, Debug)]
pub struct Caller {
    /// Effective uid.
    pub uid: u32,
    /// Effective gid and supplementary groups.
    pub groups: Vec<u32>,
}

impl Caller {
    /// The calling process.
    pub fn current() -> Caller {
        // SAFETY: getegid takes no arguments and cannot fail.
        let mut groups = vec![unsafe { libc::getegid() }];
        // SAFETY: with a size of 0 getgroups only returns the count.
        let n = unsafe { libc::getgroups(0, core::ptr::null_mut()) };
        if n > 0 {
            let mut g = vec![0 as libc::gid_t; n as usize];
            // SAFETY: `g` has room for `n` entries, the size passed.
            let got = unsafe { libc::getgroups(n, g.as_mut_ptr()) };
            if got > 0 {
                g.truncate(got as usize);
                groups.extend(g);
            }
        }
        Caller {
            uid: euid(),
            groups,
        }
    }

    fn in_group(&self, gid: u32) -> bool {
        self.groups.contains(&gid)
    }
}

fn euid() -> u32 {
    // SAFETY: geteuid takes no arguments and cannot fail.
    unsafe { libc::geteuid() }
}

/// Whether `caller` may use `facts` as its runtime directory; `Err` says why not (without
/// the path and the advice, which the caller adds).
pub fn check_runtime_dir(facts: &DirFacts, caller: &Caller) -> Result<(), String> {
    let m = facts.mode;
    let sticky = m & 0o1000 != 0;
    if !facts.is_dir {
        return Err("it is not a directory".into());
    }
    if facts.uid != caller.uid && facts.uid != 0 {
        return Err(format!(
            "it is owned by uid {}, not by you (uid {}) or root: its owner can replace every file in it",
            facts.uid, caller.uid
        ));
    }
    if m & 0o002 != 0 {
        return Err(format!(
            "every user can write it (mode {m:04o}): anyone could plant files in it"
        ));
    }
    if m & 0o020 != 0 {
        if !sticky {
            return Err(format!(
                "its group (gid {}) can write it without the sticky bit (mode {m:04o}): a member could remove or replace your files (chmod +t fixes that)",
                facts.gid
            ));
        }
        if !caller.in_group(facts.gid) {
            return Err(format!(
                "its group (gid {}) can write it and you are not in that group (mode {m:04o})",
                facts.gid
            ));
        }
    }
    if facts.uid != caller.uid && m & 0o020 == 0 {
        return Err(format!(
            "it is owned by root and not writable by a group of yours (mode {m:04o}): you cannot create files in it"
        ));
    }
    Ok(())
}

/// Whether `facts`, an ancestor of the runtime directory, is safe: owned by root or the
/// caller, writable by others only with the sticky bit.
pub fn check_ancestor(facts: &DirFacts, caller: &Caller) -> Result<(), String> {
    if facts.uid != caller.uid && facts.uid != 0 {
        return Err(format!(
            "it is owned by uid {}, not by you (uid {}) or root: its owner could replace the runtime directory",
            facts.uid, caller.uid
        ));
    }
    if facts.mode & 0o022 != 0 && facts.mode & 0o1000 == 0 {
        return Err(format!(
            "others can write it without the sticky bit (mode {:04o}): they could replace the runtime directory",
            facts.mode
        ));
    }
    Ok(())
}

/// An open runtime directory: every file in it is opened, created, renamed and removed
/// relative to this descriptor, so its path is resolved once.
#[derive(Debug)]
pub struct RuntimeDir {
    fd: OwnedFd,
    path: PathBuf,
}

fn cstr(name: &str) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

impl RuntimeDir {
    /// Opens the directory a runtime publishes in, creating it (mode 0700) when missing, and
    /// checks it and its ancestors ([`check_runtime_dir`], [`check_ancestor`]). `Err` is a
    /// message for people, naming the directory and what to do.
    pub fn open_for_runtime(path: &Path) -> Result<RuntimeDir, String> {
        let refuse = |why: String| {
            format!(
                "refusing the runtime directory {}: {why}; {HOW_TO_SHARE}",
                path.display()
            )
        };
        let caller = Caller::current();
        if std::fs::symlink_metadata(path).is_err() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(path)
                .map_err(|e| {
                    format!(
                        "cannot create the runtime directory {}: {e}",
                        path.display()
                    )
                })?;
        }
        let link = std::fs::symlink_metadata(path)
            .map_err(|e| format!("cannot use the runtime directory {}: {e}", path.display()))?;
        if link.file_type().is_symlink() && link.uid() != caller.uid && link.uid() != 0 {
            return Err(refuse(format!(
                "it is a symbolic link owned by uid {}, not by you (uid {}) or root",
                link.uid(),
                caller.uid
            )));
        }
        let real = std::fs::canonicalize(path)
            .map_err(|e| format!("cannot use the runtime directory {}: {e}", path.display()))?;
        let dir = RuntimeDir::open_dir(&real, libc::O_NOFOLLOW)
            .map_err(|e| format!("cannot open the runtime directory {}: {e}", path.display()))?;
        let facts = DirFacts::of(&dir.metadata().map_err(|e| refuse(e.to_string()))?);
        check_runtime_dir(&facts, &caller).map_err(refuse)?;
        for a in real.ancestors().skip(1) {
            let m = std::fs::metadata(a).map_err(|e| refuse(format!("{}: {e}", a.display())))?;
            check_ancestor(&DirFacts::of(&m), &caller)
                .map_err(|why| refuse(format!("its ancestor {}: {why}", a.display())))?;
        }
        Ok(RuntimeDir {
            fd: dir.fd,
            path: path.to_path_buf(),
        })
    }

    /// Opens a directory to read records from. Readers trust nothing in it (every file is
    /// checked), so its owner is not checked here: [`RuntimeDir::check`] says whether a runtime
    /// would accept it.
    pub fn open_for_reading(path: &Path) -> io::Result<RuntimeDir> {
        RuntimeDir::open_dir(path, 0)
    }

    fn open_dir(path: &Path, extra: libc::c_int) -> io::Result<RuntimeDir> {
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: a NUL-terminated path; the result is checked and owned below.
        let fd = cvt(unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC | extra,
            )
        })?;
        Ok(RuntimeDir {
            // SAFETY: `fd` was just opened and is owned by nobody else.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            path: path.to_path_buf(),
        })
    }

    /// The path it was opened by.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn metadata(&self) -> io::Result<std::fs::Metadata> {
        // The descriptor's own status (fstat), through a borrowed File.
        let f = std::mem::ManuallyDrop::new(
            // SAFETY: the File never closes the descriptor (ManuallyDrop) and lives shorter
            // than `self`.
            unsafe { File::from_raw_fd(self.fd.as_raw_fd()) },
        );
        f.metadata()
    }

    /// Whether a runtime would accept this directory (`Err`: why not).
    pub fn check(&self) -> Result<(), String> {
        let facts = DirFacts::of(&self.metadata().map_err(|e| e.to_string())?);
        check_runtime_dir(&facts, &Caller::current())
    }

    fn openat(&self, name: &str, flags: libc::c_int, mode: u32) -> io::Result<File> {
        let c = cstr(name)?;
        // SAFETY: a NUL-terminated name relative to our directory descriptor; the result is
        // checked and owned below.
        let fd = cvt(unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                mode as libc::c_uint,
            )
        })?;
        // SAFETY: `fd` was just opened and is owned by nobody else.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// Creates `name`, which must not exist (a planted file or link is `AlreadyExists`, never
    /// opened), read-write, mode `mode` whatever the umask.
    pub fn create_new(&self, name: &str, mode: u32) -> io::Result<File> {
        let f = self.openat(name, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, mode)?;
        set_mode(&f, mode)?;
        Ok(f)
    }

    /// Opens (creating it, mode 0644) the lock file `name`, read-only (`flock` needs no
    /// more); refuses anything but a regular file.
    pub fn open_lock(&self, name: &str) -> io::Result<File> {
        match self.openat(name, libc::O_RDONLY | libc::O_CREAT | libc::O_EXCL, 0o644) {
            Ok(f) => {
                set_mode(&f, 0o644)?;
                Ok(f)
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                let f = self
                    .openat(name, libc::O_RDONLY | libc::O_NONBLOCK, 0)
                    .map_err(|e| match e.raw_os_error() {
                        Some(libc::ELOOP) => io::Error::new(
                            io::ErrorKind::InvalidData,
                            "a symbolic link (planted by someone else?), never followed",
                        ),
                        _ => e,
                    })?;
                if !f.metadata()?.file_type().is_file() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "not a regular file",
                    ));
                }
                Ok(f)
            }
            Err(e) => Err(e),
        }
    }

    /// Reads the record file `name`: opened `O_NOFOLLOW|O_NONBLOCK`, a regular file of
    /// exactly `len` bytes, read exactly that. Returns the open file too (its lock says
    /// whether its writer lives). `Err` names what is wrong.
    pub fn read_record_file(&self, name: &str, len: usize) -> Result<(File, Vec<u8>), String> {
        use std::io::Read;
        let mut f = self
            .openat(name, libc::O_RDONLY | libc::O_NONBLOCK, 0)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP) => "a symbolic link".to_owned(),
                _ => e.to_string(),
            })?;
        let m = f.metadata().map_err(|e| e.to_string())?;
        if !m.file_type().is_file() {
            return Err("not a regular file".into());
        }
        if m.len() != len as u64 {
            return Err(format!("{} bytes, a record has {len}", m.len()));
        }
        let mut bytes = Vec::new();
        bytes
            .try_reserve_exact(len)
            .map_err(|_| "out of memory".to_owned())?;
        (&mut f)
            .take(len as u64)
            .read_to_end(&mut bytes)
            .map_err(|e| e.to_string())?;
        if bytes.len() != len {
            return Err(format!("truncated to {} bytes while read", bytes.len()));
        }
        Ok((f, bytes))
    }

    /// Renames `from` to `to` unless `to` exists (`AlreadyExists`).
    pub fn rename_noreplace(&self, from: &str, to: &str) -> io::Result<()> {
        let (a, b) = (cstr(from)?, cstr(to)?);
        let fd = self.fd.as_raw_fd();
        // SAFETY: NUL-terminated names relative to our directory descriptor.
        let r = unsafe { libc::renameat2(fd, a.as_ptr(), fd, b.as_ptr(), libc::RENAME_NOREPLACE) };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if !matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) {
            return Err(e);
        }
        // A file system without RENAME_NOREPLACE: a hard link never replaces either.
        // SAFETY: as above.
        cvt(unsafe { libc::linkat(fd, a.as_ptr(), fd, b.as_ptr(), 0) })?;
        self.remove(from)
    }

    /// Removes `name` (not following links).
    pub fn remove(&self, name: &str) -> io::Result<()> {
        let c = cstr(name)?;
        // SAFETY: a NUL-terminated name relative to our directory descriptor.
        cvt(unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) }).map(drop)
    }

    /// The names in the directory.
    pub fn names(&self) -> Vec<String> {
        // Listed by the descriptor's own path in /proc, else by the path it was opened by
        // (names only: every file is then opened relative to the descriptor).
        let by_fd = PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()));
        let entries = std::fs::read_dir(&by_fd).or_else(|_| std::fs::read_dir(&self.path));
        let Ok(entries) = entries else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| {
                let n = e.file_name();
                n.to_str().map(str::to_owned)
            })
            .collect()
    }
}

fn set_mode(f: &File, mode: u32) -> io::Result<()> {
    // SAFETY: fchmod on a descriptor we own.
    cvt(unsafe { libc::fchmod(f.as_raw_fd(), mode as libc::mode_t) }).map(drop)
}

/// Reserves `len` bytes of `f` (and sizes it): a full file system is an error here, not a
/// SIGBUS when the mapping is written.
pub fn reserve(f: &File, len: u64) -> io::Result<()> {
    let len =
        libc::off_t::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: posix_fallocate on a descriptor we own; it returns an errno, not -1.
    let r = unsafe { libc::posix_fallocate(f.as_raw_fd(), 0, len) };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me(uid: u32, groups: &[u32]) -> Caller {
        Caller {
            uid,
            groups: groups.to_vec(),
        }
    }

    fn dir(uid: u32, gid: u32, mode: u32) -> DirFacts {
        DirFacts {
            is_dir: true,
            uid,
            gid,
            mode,
        }
    }

    #[test]
    fn a_runtime_directory_is_the_users_or_a_sticky_group_directory_of_root() {
        let alice = me(1000, &[1000, 50]);
        assert!(check_runtime_dir(&dir(1000, 1000, 0o700), &alice).is_ok());
        assert!(check_runtime_dir(&dir(1000, 1000, 0o755), &alice).is_ok());
        assert!(check_runtime_dir(&dir(0, 50, 0o3770), &alice).is_ok());
        assert!(check_runtime_dir(&dir(1000, 50, 0o1770), &alice).is_ok());
        let why = |f: DirFacts| check_runtime_dir(&f, &alice).unwrap_err();
        assert!(why(dir(1001, 1001, 0o700)).contains("owned by uid 1001"));
        assert!(why(dir(1000, 1000, 0o777)).contains("every user can write it"));
        assert!(why(dir(1000, 1000, 0o1777)).contains("every user can write it"));
        assert!(why(dir(1000, 50, 0o770)).contains("without the sticky bit"));
        assert!(why(dir(0, 60, 0o1770)).contains("not in that group"));
        assert!(why(dir(0, 0, 0o755)).contains("cannot create files"));
        let mut file = dir(1000, 1000, 0o600);
        file.is_dir = false;
        assert!(why(file).contains("not a directory"));
        // Root's own directories are root's.
        assert!(check_runtime_dir(&dir(0, 0, 0o700), &me(0, &[0])).is_ok());
    }

    #[test]
    fn ancestors_are_roots_or_the_users_and_sticky_where_others_write() {
        let alice = me(1000, &[1000]);
        assert!(check_ancestor(&dir(0, 0, 0o755), &alice).is_ok());
        assert!(check_ancestor(&dir(0, 0, 0o1777), &alice).is_ok());
        assert!(check_ancestor(&dir(1000, 1000, 0o700), &alice).is_ok());
        assert!(check_ancestor(&dir(0, 0, 0o777), &alice).is_err());
        assert!(check_ancestor(&dir(0, 50, 0o775), &alice).is_err());
        assert!(check_ancestor(&dir(1001, 1001, 0o755), &alice).is_err());
    }
}
