//! Logging in the public runtime's style: `NEURON_RT_LOG_LEVEL` (ERROR by default; WARN,
//! WARNING, INFO, DEBUG, TRACE, QUIET/OFF) with per-module overrides
//! `NEURON_RT_LOG_LEVEL_<NRT|NMGR|TDRV>`, lines like `2026-Nov-29 07:30:01.123456 NRT:nrt_load
//! <message>` on stderr.
//!
//! Logging is never on the execution fast path except for errors; the level check is one
//! relaxed load.

use std::fmt;
use std::io::Write;
use std::sync::atomic::{AtomicU8, Ordering};

/// Log levels, in increasing verbosity.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Nothing.
    Off = 0,
    /// Errors (the default).
    Error = 1,
    /// Warnings.
    Warn = 2,
    /// Informational messages.
    Info = 3,
    /// Debug messages, including API entry tracing.
    Debug = 4,
    /// Everything.
    Trace = 5,
}

impl Level {
    /// Parses a level name as the public docs spell them (case-insensitive).
    pub fn parse(s: &str) -> Option<Level> {
        Some(match s.trim().to_ascii_uppercase().as_str() {
            "QUIET" | "OFF" | "NONE" => Level::Off,
            "ERROR" => Level::Error,
            "WARN" | "WARNING" => Level::Warn,
            "INFO" => Level::Info,
            "DEBUG" => Level::Debug,
            "TRACE" => Level::Trace,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Level::Off => "OFF",
            Level::Error => "ERROR",
            Level::Warn => "WARN",
            Level::Info => "INFO",
            Level::Debug => "DEBUG",
            Level::Trace => "TRACE",
        }
    }
}

/// Modules with their own level override.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Module {
    /// The public API layer.
    Nrt = 0,
    /// Model and execution management.
    Nmgr = 1,
    /// The device driver layer.
    Tdrv = 2,
}

impl Module {
    fn name(self) -> &'static str {
        match self {
            Module::Nrt => "NRT",
            Module::Nmgr => "NMGR",
            Module::Tdrv => "TDRV",
        }
    }
}

static LEVELS: [AtomicU8; 3] = [
    AtomicU8::new(Level::Error as u8),
    AtomicU8::new(Level::Error as u8),
    AtomicU8::new(Level::Error as u8),
];

/// Reads `NEURON_RT_LOG_LEVEL` and the per-module variants. Unknown values are reported once
/// and ignored.
pub fn configure_from_env() {
    let base = std::env::var("NEURON_RT_LOG_LEVEL").ok();
    let base_level = match base.as_deref().map(|s| (s, Level::parse(s))) {
        Some((_, Some(l))) => l,
        Some((s, None)) => {
            eprintln!("NRT:log_init WARN unknown NEURON_RT_LOG_LEVEL {s:?}, using ERROR");
            Level::Error
        }
        None => Level::Error,
    };
    for m in [Module::Nrt, Module::Nmgr, Module::Tdrv] {
        let var = format!("NEURON_RT_LOG_LEVEL_{}", m.name());
        let l = std::env::var(&var)
            .ok()
            .and_then(|s| Level::parse(&s))
            .unwrap_or(base_level);
        LEVELS[m as usize].store(l as u8, Ordering::Relaxed);
    }
}

/// Sets a module's level.
pub fn set_level(module: Module, level: Level) {
    LEVELS[module as usize].store(level as u8, Ordering::Relaxed);
}

/// Whether a message at `level` from `module` is printed.
#[inline]
pub fn enabled(module: Module, level: Level) -> bool {
    level as u8 <= LEVELS[module as usize].load(Ordering::Relaxed) && level != Level::Off
}

/// Prints one log line (use the [`crate::nrt_log!`] macro).
#[cold]
pub fn write(module: Module, level: Level, function: &str, args: fmt::Arguments<'_>) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let mut err = std::io::stderr().lock();
    let _ = writeln!(
        err,
        "{}.{:06} {} {}:{} {}",
        now.as_secs(),
        now.subsec_micros(),
        level.name(),
        module.name(),
        function,
        args
    );
}

/// `nrt_log!(Module, Level, "function", "format", args…)`.
#[macro_export]
macro_rules! nrt_log {
    ($module:expr, $level:expr, $func:expr, $($arg:tt)*) => {
        if $crate::log::enabled($module, $level) {
            $crate::log::write($module, $level, $func, format_args!($($arg)*));
        }
    };
}
