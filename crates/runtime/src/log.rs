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
        "{} {} {}:{} {}",
        UtcTimestamp(now),
        level.name(),
        module.name(),
        function,
        args
    );
}

/// A time since the Unix epoch as the public runtime's log lines print it, in UTC:
/// `2026-Nov-29 07:30:01.123456` (formatted in place: no allocation).
#[derive(Clone, Copy, Debug)]
pub struct UtcTimestamp(pub std::time::Duration);

impl fmt::Display for UtcTimestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const MONTHS: [&str; 12] = [
            "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
        ];
        let secs = self.0.as_secs();
        let (days, rem) = (secs / 86_400, secs % 86_400);
        let (year, month, day) = civil_from_days(days);
        write!(
            f,
            "{year:04}-{}-{day:02} {:02}:{:02}:{:02}.{:06}",
            MONTHS[(month - 1) as usize],
            rem / 3600,
            rem % 3600 / 60,
            rem % 60,
            self.0.subsec_micros()
        )
    }
}

/// The proleptic Gregorian (year, month 1..=12, day 1..=31) of `days` since 1970-01-01
/// (Howard Hinnant's `civil_from_days`, for non-negative day counts).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
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

#[cfg(test)]
mod tests {
    use super::UtcTimestamp;
    use std::time::Duration;

    #[test]
    fn timestamps_are_utc_calendar_times() {
        let at = |s: u64, us: u32| UtcTimestamp(Duration::new(s, us * 1000)).to_string();
        assert_eq!(at(0, 0), "1970-Jan-01 00:00:00.000000");
        // `date -u -d @1764401401`: Sat Nov 29 07:30:01 UTC 2025.
        assert_eq!(at(1_764_401_401, 123_456), "2025-Nov-29 07:30:01.123456");
        // A leap day, and the last second of a year.
        assert_eq!(at(951_782_400, 0), "2000-Feb-29 00:00:00.000000");
        assert_eq!(at(1_798_761_599, 999_999), "2026-Dec-31 23:59:59.999999");
    }
}
