//! Fault injection: a deterministic plan of device faults, given to the device by a Rust
//! builder ([`FaultSpec`]) or, for tools and C programs, by the `NRT_SIM_FAULTS` environment
//! variable ([`parse_faults`]).
//!
//! Each fault fires on chosen executions of one core — counted from 1 since the device
//! started — on one engine, and makes the device write exactly what hardware would: an
//! ERROR-ring record with the right subtype, cause-word bits, dropped records and an
//! overflow count, or nothing at all (a hang, which the core's watchdog turns into cause
//! bit 29). Faults are one-shot by default, so the next execution on the core succeeds.

use nrt_hal::{Engine, ErrorSubtype};
use std::fmt;

/// What goes wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// The engine starts and never finishes: no END record; the core's watchdog fires
    /// (cause bit 29) and abandons the execution. The runtime reports `NRT_TIMEOUT`.
    Hang,
    /// The engine's notification records for the execution are dropped as if its ring had
    /// overflowed: the ring's overflow counter rises and the NQ-overflow cause bit is set;
    /// the engine itself finishes. The runtime's sweep times out and reports
    /// `NRT_EXEC_SW_NQ_OVERFLOW`.
    DropNotifications,
    /// The engine produces a NaN (written into the output of its last compute instruction)
    /// and posts a NUMERICAL error; the execution completes (`NRT_EXEC_COMPLETED_WITH_NUM_ERR`).
    Nan,
    /// Uncorrectable on-chip memory (parity) error: the core aborts the execution
    /// (`NRT_EXEC_HW_ERR_NC_UE`).
    Parity,
    /// A transient error: posted, and the execution completes (`NRT_EXEC_COMPLETED_WITH_ERR`).
    Transient,
    /// The DMA engine aborts: the core aborts the execution (`NRT_EXEC_HW_ERR_DMA_ABORT`).
    DmaAbort,
    /// Uncorrectable HBM error: the core aborts the execution (`NRT_EXEC_HW_ERR_HBM_UE`).
    HbmUncorrectable,
    /// The core wedges: it posts a FATAL error, sets the fatal cause bit and takes no more
    /// requests until `nc_reset` (`NRT_EXEC_UNIT_UNRECOVERABLE` for later requests).
    Fatal,
}

impl FaultKind {
    /// Every kind.
    pub const ALL: [FaultKind; 8] = [
        Self::Hang,
        Self::DropNotifications,
        Self::Nan,
        Self::Parity,
        Self::Transient,
        Self::DmaAbort,
        Self::HbmUncorrectable,
        Self::Fatal,
    ];

    /// The name used by `NRT_SIM_FAULTS`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Hang => "hang",
            Self::DropNotifications => "drop",
            Self::Nan => "nan",
            Self::Parity => "parity",
            Self::Transient => "transient",
            Self::DmaAbort => "dma-abort",
            Self::HbmUncorrectable => "hbm-ue",
            Self::Fatal => "fatal",
        }
    }

    /// The ERROR-ring subtype the fault posts, if any.
    pub const fn error_subtype(self) -> Option<ErrorSubtype> {
        match self {
            Self::Hang | Self::DropNotifications => None,
            Self::Nan => Some(ErrorSubtype::Numerical),
            Self::Parity => Some(ErrorSubtype::Uncorrectable),
            Self::Transient => Some(ErrorSubtype::Transient),
            Self::DmaAbort => Some(ErrorSubtype::DmaAbort),
            Self::HbmUncorrectable => Some(ErrorSubtype::HbmUncorrectable),
            Self::Fatal => Some(ErrorSubtype::Fatal),
        }
    }

    /// The engine the fault hits when the spec names none: the DMA abort hits SP (where
    /// DMA runs), everything else PE.
    pub const fn default_engine(self) -> Engine {
        match self {
            Self::DmaAbort => Engine::Sp,
            _ => Engine::Pe,
        }
    }

    fn from_name(s: &str) -> Option<FaultKind> {
        Self::ALL.iter().copied().find(|k| k.name() == s)
    }
}

/// One planned fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultSpec {
    /// What goes wrong.
    pub kind: FaultKind,
    /// Physical core.
    pub core: u32,
    /// Engine (`None`: the kind's default engine; for `DropNotifications`, every engine).
    pub engine: Option<Engine>,
    /// First affected execution on the core, counted from 1 since the device started
    /// (`0`: the next execution after the fault is installed).
    pub execution: u64,
    /// Number of consecutive executions affected (`0`: every one from `execution` on).
    pub count: u64,
}

impl FaultSpec {
    /// A one-shot fault on the next execution of core 0.
    pub const fn new(kind: FaultKind) -> Self {
        FaultSpec {
            kind,
            core: 0,
            engine: None,
            execution: 0,
            count: 1,
        }
    }

    /// On core `core`.
    pub const fn on_core(mut self, core: u32) -> Self {
        self.core = core;
        self
    }

    /// On engine `engine`.
    pub const fn on_engine(mut self, engine: Engine) -> Self {
        self.engine = Some(engine);
        self
    }

    /// First on the `n`-th execution of the core (counted from 1 since the device started).
    pub const fn at_execution(mut self, n: u64) -> Self {
        self.execution = n;
        self
    }

    /// On `n` consecutive executions (`0` = forever).
    pub const fn times(mut self, n: u64) -> Self {
        self.count = n;
        self
    }

    /// The engine the fault hits.
    pub fn target_engine(&self) -> Option<Engine> {
        match (self.kind, self.engine) {
            (_, Some(e)) => Some(e),
            (FaultKind::DropNotifications, None) => None,
            (k, None) => Some(k.default_engine()),
        }
    }

    /// Whether it fires on execution `n` (absolute, 1-based) of `core`.
    pub(crate) fn fires_on(&self, core: u32, n: u64) -> bool {
        core == self.core
            && n >= self.execution
            // `n - execution < count`, not `n < execution + count`: the sum wraps for a
            // count near u64::MAX and the fault would never fire.
            && (self.count == 0 || n - self.execution < self.count)
    }
}

impl fmt::Display for FaultSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@core={}", self.kind.name(), self.core)?;
        if let Some(e) = self.engine {
            write!(f, ",engine={}", e.name().to_ascii_lowercase())?;
        }
        write!(f, ",exec={},count={}", self.execution, self.count)
    }
}

/// A malformed `NRT_SIM_FAULTS` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultParseError {
    /// The offending entry.
    pub entry: String,
    /// What was wrong.
    pub reason: String,
}

impl fmt::Display for FaultParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.entry.is_empty() {
            // Not a fault entry: a setting of the virtual host, named in the reason.
            return f.write_str(&self.reason);
        }
        write!(f, "NRT_SIM_FAULTS entry {:?}: {}", self.entry, self.reason)
    }
}

impl std::error::Error for FaultParseError {}

/// Parses a fault plan: entries separated by `;`, each `KIND[@KEY=VALUE[,KEY=VALUE]…]` with
/// KIND one of `hang drop nan parity transient dma-abort hbm-ue fatal` and keys `core`,
/// `engine` (`pe act pool dve sp`), `exec` (1-based execution number on the core; absent or
/// `0`: the core's next execution once the plan is armed) and
/// `count` (`0` = every execution from `exec` on). Example:
/// `NRT_SIM_FAULTS="hang@core=0,engine=act,exec=3;nan@exec=5,count=2"`.
pub fn parse_faults(s: &str) -> Result<Vec<FaultSpec>, FaultParseError> {
    let mut out = Vec::new();
    for entry in s.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let err = |reason: String| FaultParseError {
            entry: entry.to_owned(),
            reason,
        };
        let (kind, args) = entry.split_once('@').unwrap_or((entry, ""));
        let kind = FaultKind::from_name(kind.trim()).ok_or_else(|| {
            err(format!(
                "unknown fault kind {:?} (expected one of {})",
                kind.trim(),
                FaultKind::ALL.map(|k| k.name()).join(", ")
            ))
        })?;
        // Without `exec` (or with `exec=0`): the core's next execution once armed — the
        // first one for a plan given at start-up.
        let mut spec = FaultSpec::new(kind);
        for kv in args.split(',').map(str::trim).filter(|a| !a.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| err(format!("{kv:?} is not KEY=VALUE")))?;
            let num = |v: &str| {
                v.trim()
                    .parse::<u64>()
                    .map_err(|_| err(format!("{k}={v:?} is not a number")))
            };
            match k.trim() {
                "core" => {
                    spec.core = u32::try_from(num(v)?)
                        .map_err(|_| err(format!("core={v:?} is not a core index")))?
                }
                "exec" => spec.execution = num(v)?,
                "count" => spec.count = num(v)?,
                "engine" => {
                    spec.engine = Some(
                        nrt_hal::Engine::ALL
                            .into_iter()
                            .find(|e| e.name().eq_ignore_ascii_case(v.trim()))
                            .ok_or_else(|| {
                                err(format!("unknown engine {v:?} (pe, act, pool, dve, sp)"))
                            })?,
                    )
                }
                other => {
                    return Err(err(format!(
                        "unknown key {other:?} (core, engine, exec, count)"
                    )));
                }
            }
        }
        out.push(spec);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_syntax() {
        let p = parse_faults("hang@core=1,engine=act,exec=3; nan@exec=5,count=2;drop").unwrap();
        assert_eq!(
            p,
            vec![
                FaultSpec::new(FaultKind::Hang)
                    .on_core(1)
                    .on_engine(Engine::Act)
                    .at_execution(3),
                FaultSpec::new(FaultKind::Nan).at_execution(5).times(2),
                FaultSpec::new(FaultKind::DropNotifications),
            ]
        );
        assert!(
            p[1].fires_on(0, 5)
                && p[1].fires_on(0, 6)
                && !p[1].fires_on(0, 7)
                && !p[1].fires_on(1, 5)
        );
        assert_eq!(p[2].target_engine(), None);
        assert_eq!(p[0].to_string(), "hang@core=1,engine=act,exec=3,count=1");
    }

    #[test]
    fn errors_name_the_entry() {
        let e = parse_faults("nan;bogus@core=1").unwrap_err();
        assert_eq!(e.entry, "bogus@core=1");
        assert!(e.to_string().contains("unknown fault kind"));
        assert!(
            parse_faults("nan@engine=xyz")
                .unwrap_err()
                .reason
                .contains("unknown engine")
        );
        assert!(
            parse_faults("nan@core")
                .unwrap_err()
                .reason
                .contains("KEY=VALUE")
        );
        assert!(
            parse_faults("nan@exec=x")
                .unwrap_err()
                .reason
                .contains("not a number")
        );
        assert!(
            parse_faults("nan@when=1")
                .unwrap_err()
                .reason
                .contains("unknown key")
        );
    }
}
