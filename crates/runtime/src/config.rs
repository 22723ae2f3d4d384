//! Runtime configuration, from code or from the public environment variables.
//!
//! | variable | read at | meaning |
//! |---|---|---|
//! | `NEURON_RT_VISIBLE_CORES` | init | exact cores: `3`, `3-6`, `3,4,5`, `3-5,6`; contiguous, increasing; renumbered from 0 |
//! | `NEURON_RT_NUM_CORES` | init | how many cores to reserve (0 or unset = all); ignored when VISIBLE_CORES is set |
//! | `NEURON_LOGICAL_NC_CONFIG` | init | physical cores per logical core (vcore): 1 (default) or 2 |
//! | `NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS` | init | 0 = synchronous; N in 1..=63 = implicit async with N in flight |
//! | `NEURON_RT_EXEC_TIMEOUT` | load | seconds an execution may take (fractional seconds accepted; default 30) |
//! | `NEURON_RT_LOG_LEVEL[_NRT/_NMGR/_TDRV]` | init | see [`crate::log`] |
//! | `NEURON_RT_INSPECT_ENABLE`, `NEURON_RT_INSPECT_OUTPUT_DIR`, `NEURON_RT_INSPECT_DEVICE_PROFILE`, `NEURON_RT_INSPECT_DEVICE_PROFILE_NUM_WARMUP` | init | profile the whole process ([`crate::trace`]) |
//! | `NRT_SIM_SYNC_ON_CALLER` | init | which synchronous one-core executions run their device work on the calling thread ([`SyncOnCaller`]): `short` (default), `always`, `never` |
//! | `NRT_HOST_MEMORY_MAX` | init (checked), each large host or device allocation (read) | a cap on this process's memory (bytes, or e.g. `4G`): large allocations past the cap less its resident memory are refused (`nrt_hal::host_memory`), as past the host's `MemAvailable` or a container's limit |
//! | `NRT_RUNTIME_DIR` | init | where cores are locked and statistics published ([`crate::host`]); default per user: `$XDG_RUNTIME_DIR/nrt-rs`, else `/dev/shm/nrt-rs-<uid>`; checked ([`crate::host::rundir`]) |
//!
//! Global core ids count over the virtual host's devices (`NRT_SIM_INSTANCE`, see
//! `nrt_sim::host`): device `d` of `n` cores per device holds cores `d*n ..= d*n+n-1`.

use crate::error::{NrtError, Result};
use nrt_hal::{NrtStatus, tuning};
use std::time::Duration;

/// How a runtime starts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimeConfig {
    /// Exact physical cores to reserve (`NEURON_RT_VISIBLE_CORES`); `None` = by count.
    pub visible_cores: Option<Vec<u32>>,
    /// How many cores to reserve when `visible_cores` is `None` (`0` = all).
    pub num_cores: u32,
    /// Physical cores per logical core (`NEURON_LOGICAL_NC_CONFIG`, 1 or 2; `0` means 1).
    pub logical_nc: u32,
    /// Implicit async in-flight cap (`NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS`); 0 = sync.
    pub async_inflight: u32,
    /// The runtime directory in which to lock the reserved cores against other processes
    /// and publish statistics ([`crate::host`]). [`RuntimeConfig::from_env`] sets it
    /// (`NRT_RUNTIME_DIR` or its default), as a real process would; `None` (the default of a
    /// configuration built in code) takes no locks and keeps the statistics private.
    pub ownership: Option<std::path::PathBuf>,
    /// Profile every model from init on (`NEURON_RT_INSPECT_*`, [`crate::trace`]); `None`
    /// (the default) records nothing.
    pub inspect: Option<crate::trace::InspectConfig>,
    /// Which synchronous executions the calling thread runs itself on a software device
    /// (`NRT_SIM_SYNC_ON_CALLER`).
    pub sync_on_caller: SyncOnCaller,
}

/// Which synchronous executions of a one-core model run their device work on the calling
/// thread ([`nrt_hal::Device::host_serves`]) instead of the device thread, on a software
/// device (hardware runs everything itself). Multi-core models always run on the device
/// threads: their cores compute in parallel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SyncOnCaller {
    /// Those expected within [`tuning::SYNC_SERVES_CORE_MAX`], which the caller would spin
    /// through anyway; longer ones run on the device thread while the caller blocks (a
    /// vCPU left free for the application, as on hardware).
    #[default]
    Short,
    /// All of them, like an in-thread call (tract, ONNX Runtime): no hand-off between CPUs
    /// and no wake-up on the path, one CPU per execution instead of two — the lowest latency
    /// on a shared or noisy host, while the caller's thread does the computing.
    Always,
    /// None: the device thread runs every execution (the hardware's split of the work).
    Never,
}

impl SyncOnCaller {
    /// `NRT_SIM_SYNC_ON_CALLER`'s value, or the default when it is unset or empty.
    pub fn from_env() -> Result<SyncOnCaller> {
        match std::env::var("NRT_SIM_SYNC_ON_CALLER") {
            Ok(v) if !v.trim().is_empty() => SyncOnCaller::parse(&v),
            _ => Ok(SyncOnCaller::default()),
        }
    }

    /// Parses `NRT_SIM_SYNC_ON_CALLER`'s value.
    pub fn parse(v: &str) -> Result<SyncOnCaller> {
        match v.trim() {
            "short" => Ok(SyncOnCaller::Short),
            "always" => Ok(SyncOnCaller::Always),
            "never" => Ok(SyncOnCaller::Never),
            _ => Err(NrtError::invalid(format!(
                "NRT_SIM_SYNC_ON_CALLER={v:?} is not one of short, always, never"
            ))),
        }
    }
}

impl RuntimeConfig {
    /// The configuration the public environment variables describe.
    pub fn from_env() -> Result<RuntimeConfig> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let mut c = RuntimeConfig::default();
        if let Some(v) = var("NEURON_RT_VISIBLE_CORES") {
            c.visible_cores = Some(parse_core_list(&v)?);
        }
        if let Some(v) = var("NEURON_RT_NUM_CORES") {
            c.num_cores = parse_u32("NEURON_RT_NUM_CORES", &v)?;
            if c.num_cores > MAX_CORE_ID {
                return Err(NrtError::invalid(format!(
                    "NEURON_RT_NUM_CORES={v:?} is more than the largest host has ({MAX_CORE_ID})"
                )));
            }
        }
        if let Some(v) = var("NEURON_LOGICAL_NC_CONFIG") {
            c.logical_nc = parse_u32("NEURON_LOGICAL_NC_CONFIG", &v)?;
        }
        if let Some(v) = var("NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS") {
            c.async_inflight = parse_u32("NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS", &v)?;
        }
        c.sync_on_caller = SyncOnCaller::from_env()?;
        // Read where host memory is checked (`nrt_hal::host_memory`); a bad value is an
        // error here rather than no cap there.
        nrt_hal::host_memory::memory_cap_from_env().map_err(NrtError::invalid)?;
        c.ownership = Some(crate::host::runtime_dir_from_env());
        c.inspect = crate::trace::InspectConfig::from_env()?;
        c.validate()?;
        Ok(c)
    }

    /// Checks ranges, naming the offending setting.
    pub fn validate(&self) -> Result<()> {
        if self.async_inflight > tuning::MAX_INFLIGHT_REQUESTS {
            return Err(NrtError::invalid(format!(
                "NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS={} exceeds the limit of {}",
                self.async_inflight,
                tuning::MAX_INFLIGHT_REQUESTS
            )));
        }
        if self.logical_nc as usize > crate::MAX_LOCKSTEP_CORES {
            return Err(NrtError::invalid(format!(
                "NEURON_LOGICAL_NC_CONFIG={} is not supported (1 to {})",
                self.logical_nc,
                crate::MAX_LOCKSTEP_CORES
            )));
        }
        Ok(())
    }

    /// Physical cores per vcore.
    pub fn lnc(&self) -> u32 {
        self.logical_nc.max(1)
    }
}

fn parse_u32(name: &str, v: &str) -> Result<u32> {
    v.trim()
        .parse::<u32>()
        .map_err(|_| NrtError::invalid(format!("{name}={v:?} is not a non-negative integer")))
}

/// Core ids are below this on every host (the largest preset has 128 cores; a runtime
/// directory record's core bitmap holds 256): lists and counts past it are refused while
/// parsed, before anything is sized by them.
const MAX_CORE_ID: u32 = (crate::host::CORE_WORDS * 64) as u32;

/// Parses `NEURON_RT_VISIBLE_CORES`: `3`, `3-6`, `3,4,5,6`, `3-5,6`. Must be contiguous and
/// increasing.
pub fn parse_core_list(v: &str) -> Result<Vec<u32>> {
    let bad = |why: &str| NrtError::invalid(format!("NEURON_RT_VISIBLE_CORES={v:?}: {why}"));
    let mut out: Vec<u32> = Vec::new();
    for part in v.split(',').map(str::trim) {
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (part, part),
        };
        let lo: u32 = lo
            .parse()
            .map_err(|_| bad(&format!("{part:?} is not a core index or range")))?;
        let hi: u32 = hi
            .parse()
            .map_err(|_| bad(&format!("{part:?} is not a core index or range")))?;
        if hi < lo {
            return Err(bad(&format!("range {part:?} is decreasing")));
        }
        if hi >= MAX_CORE_ID {
            return Err(bad(&format!(
                "core {hi} is past the largest host (core ids 0 to {})",
                MAX_CORE_ID - 1
            )));
        }
        for c in lo..=hi {
            if let Some(&last) = out.last()
                && c != last + 1
            {
                return Err(bad("cores must be contiguous and increasing"));
            }
            out.push(c);
        }
    }
    Ok(out)
}

/// `NEURON_RT_EXEC_TIMEOUT`, read at model load: seconds (fractions accepted), at least
/// [`tuning::MIN_EXEC_TIMEOUT`]; the default when unset.
pub fn exec_timeout_from_env() -> Result<Duration> {
    match std::env::var("NEURON_RT_EXEC_TIMEOUT") {
        Ok(v) if !v.trim().is_empty() => parse_exec_timeout(&v),
        _ => Ok(tuning::DEFAULT_EXEC_TIMEOUT),
    }
}

/// Parses an exec timeout in seconds.
pub fn parse_exec_timeout(v: &str) -> Result<Duration> {
    let secs: f64 = v.trim().parse().map_err(|_| {
        NrtError::invalid(format!(
            "NEURON_RT_EXEC_TIMEOUT={v:?} is not a number of seconds"
        ))
    })?;
    if !secs.is_finite() || secs <= 0.0 || secs > 1e7 {
        return Err(NrtError::invalid(format!(
            "NEURON_RT_EXEC_TIMEOUT={v:?} is out of range"
        )));
    }
    Ok(Duration::from_secs_f64(secs).max(tuning::MIN_EXEC_TIMEOUT))
}

/// Maps the configuration onto a device of `device_cores` cores: the physical cores `init`
/// reserves (`NEURON_RT_VISIBLE_CORES`, else the first `NEURON_RT_NUM_CORES`, else all),
/// checked against the device and the logical-core size.
pub fn select_cores(cfg: &RuntimeConfig, device_cores: u32) -> Result<Vec<u32>> {
    let cores = match &cfg.visible_cores {
        Some(v) => v.clone(),
        None if cfg.num_cores == 0 => (0..device_cores).collect(),
        None => (0..cfg.num_cores).collect(),
    };
    if cores.is_empty() {
        return Err(NrtError::invalid("no NeuronCore selected"));
    }
    if let Some(&c) = cores.iter().find(|&&c| c >= device_cores) {
        return Err(NrtError::new(
            NrtStatus::Resource,
            format!(
                "NeuronCore(s) not available - Requested:{} (core {c}) Available:{device_cores}",
                cores.len()
            ),
        ));
    }
    if !(cores.len() as u32).is_multiple_of(cfg.lnc()) {
        return Err(NrtError::invalid(format!(
            "{} visible cores cannot form logical cores of {} (NEURON_LOGICAL_NC_CONFIG)",
            cores.len(),
            cfg.lnc()
        )));
    }
    Ok(cores)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_lists() {
        assert_eq!(parse_core_list("3").unwrap(), vec![3]);
        assert_eq!(parse_core_list("3-6").unwrap(), vec![3, 4, 5, 6]);
        assert_eq!(parse_core_list("3,4, 5,6").unwrap(), vec![3, 4, 5, 6]);
        assert_eq!(parse_core_list("3-5,6").unwrap(), vec![3, 4, 5, 6]);
        assert!(
            parse_core_list("3,5")
                .unwrap_err()
                .message
                .contains("contiguous")
        );
        assert!(
            parse_core_list("6-3")
                .unwrap_err()
                .message
                .contains("decreasing")
        );
        assert!(parse_core_list("x").unwrap_err().message.contains("\"x\""));
        // Hostile ranges are refused while parsed (a 16 GiB list was built before).
        for v in ["0-4294967295", "256", "3,4-256"] {
            let e = parse_core_list(v).unwrap_err();
            assert!(e.message.contains("past the largest host"), "{v}: {e}");
        }
        assert_eq!(parse_core_list("250-255").unwrap().len(), 6);
    }

    #[test]
    fn sync_on_caller_parses_its_three_values_and_names_a_bad_one() {
        assert_eq!(SyncOnCaller::parse("short").unwrap(), SyncOnCaller::Short);
        assert_eq!(
            SyncOnCaller::parse(" always ").unwrap(),
            SyncOnCaller::Always
        );
        assert_eq!(SyncOnCaller::parse("never").unwrap(), SyncOnCaller::Never);
        let e = SyncOnCaller::parse("sometimes").unwrap_err();
        assert!(
            e.message.contains("NRT_SIM_SYNC_ON_CALLER=\"sometimes\""),
            "{e}"
        );
    }

    #[test]
    fn limits_name_the_setting() {
        let c = RuntimeConfig {
            async_inflight: 64,
            ..Default::default()
        };
        let e = c.validate().unwrap_err();
        assert!(
            e.message
                .contains("NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS=64")
                && e.message.contains("63")
        );
        assert_eq!(
            parse_exec_timeout("0.5").unwrap(),
            Duration::from_millis(500)
        );
        assert_eq!(
            parse_exec_timeout("0.001").unwrap(),
            tuning::MIN_EXEC_TIMEOUT
        );
        assert!(parse_exec_timeout("-1").is_err() && parse_exec_timeout("abc").is_err());
        let sel = select_cores(
            &RuntimeConfig {
                visible_cores: Some(vec![2]),
                ..Default::default()
            },
            2,
        );
        assert_eq!(sel.unwrap_err().status, NrtStatus::Resource);
    }
}
