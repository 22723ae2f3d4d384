//! The names of the real Neuron tools: invoked as `neuron-ls`, `neuron-monitor` or
//! `neuron-top` (argv[0], e.g. through a symbolic link), `nrt` answers as that tool does —
//! `nrt ls`, `nrt monitor`, `nrt top` — so programs written for them (Ray's Neuron
//! detector, `neuron-monitor | neuron-monitor-prometheus.py`) find them by name.
//! `nrt install-tools DIR` makes the links.

use crate::args::InstallToolsArgs;
use crate::session::Res;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The tool names and the subcommand each stands for.
pub const TOOLS: [(&str, &str); 3] = [
    ("neuron-ls", "ls"),
    ("neuron-monitor", "monitor"),
    ("neuron-top", "top"),
];

/// The command line as `nrt` reads it: `args` itself, or, when argv[0]'s file name is one
/// of [`TOOLS`], `nrt <subcommand>` followed by the tool's arguments.
pub fn as_nrt_command_line(args: Vec<OsString>) -> Vec<OsString> {
    let invoked = args
        .first()
        .and_then(|a| Path::new(a).file_name())
        .and_then(|n| n.to_str())
        .unwrap_or("");
    match TOOLS.iter().find(|(tool, _)| *tool == invoked) {
        Some((_, sub)) => [OsString::from("nrt"), OsString::from(sub)]
            .into_iter()
            .chain(args.into_iter().skip(1))
            .collect(),
        None => args,
    }
}

/// What to do with one tool's path in DIR.
enum Plan {
    Make,
    Keep,
}

/// `nrt install-tools DIR`: a symbolic link to this binary under each tool's name in DIR
/// (created if missing). A file already there that is not that link is refused, before any
/// link is made.
pub fn install(a: &InstallToolsArgs) -> Res<()> {
    let exe = std::env::current_exe()
        .and_then(std::fs::canonicalize)
        .map_err(|e| format!("cannot find the nrt binary's own path: {e}"))?;
    let dir = &a.dir;
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut plans: Vec<(PathBuf, Plan)> = Vec::new();
    for (tool, _) in TOOLS {
        let link = dir.join(tool);
        let plan = match std::fs::symlink_metadata(&link) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Plan::Make,
            Err(e) => return Err(format!("{}: {e}", link.display())),
            Ok(m) if m.file_type().is_symlink() => {
                let target =
                    std::fs::read_link(&link).map_err(|e| format!("{}: {e}", link.display()))?;
                let resolved = std::fs::canonicalize(dir.join(&target)).ok();
                if resolved.as_deref() == Some(exe.as_path()) {
                    Plan::Keep
                } else {
                    return Err(format!(
                        "{} is already a link to {}, not to {}: remove it first (or pick another DIR)",
                        link.display(),
                        target.display(),
                        exe.display()
                    ));
                }
            }
            Ok(_) => {
                return Err(format!(
                    "{} already exists and is not a link to {}: it is left alone (remove it first, or pick another DIR)",
                    link.display(),
                    exe.display()
                ));
            }
        };
        plans.push((link, plan));
    }
    for (link, plan) in plans {
        match plan {
            Plan::Keep => println!(
                "kept {} (already a link to {})",
                link.display(),
                exe.display()
            ),
            Plan::Make => {
                std::os::unix::fs::symlink(&exe, &link)
                    .map_err(|e| format!("linking {}: {e}", link.display()))?;
                println!("made {} -> {}", link.display(), exe.display());
            }
        }
    }
    println!(
        "each answers as its nrt command (neuron-ls = nrt ls, neuron-monitor = nrt monitor, neuron-top = nrt top); put {} on PATH to use them",
        dir.display()
    );
    Ok(())
}
