//! The virtual host: how many Neuron devices the software NeuronCore stands for, how many
//! NeuronCores each has, and how much device memory.
//!
//! | variable | meaning |
//! |---|---|
//! | `NRT_SIM_INSTANCE` | a preset from the public instance tables (below); default `sim` |
//! | `NRT_SIM_DEVICES` | number of Neuron devices (overrides the preset) |
//! | `NRT_SIM_CORES_PER_DEVICE` | NeuronCores per device (overrides the preset) |
//! | `NRT_SIM_DEVICE_MEMORY` | device memory per device: bytes, or with `K`/`M`/`G`/`T` (powers of 1024; `GiB` etc. accepted) |
//!
//! | preset | devices | cores/device | memory/device |
//! |---|---|---|---|
//! | `sim` (default: today's software device) | 1 | 2 | 16 GiB |
//! | `inf2.xlarge`, `inf2.8xlarge` | 1 | 2 | 32 GiB |
//! | `inf2.24xlarge` | 6 | 2 | 32 GiB |
//! | `inf2.48xlarge` | 12 | 2 | 32 GiB |
//! | `trn1.2xlarge` | 1 | 2 | 32 GiB |
//! | `trn1.32xlarge`, `trn1n.32xlarge` | 16 | 2 | 32 GiB |
//! | `trn2.3xlarge` | 1 | 8 | 96 GiB |
//! | `trn2.48xlarge` | 16 | 8 | 96 GiB |
//!
//! trn2 counts physical cores (8 per device); group them into logical cores with
//! `NEURON_LOGICAL_NC_CONFIG=2` as on the real instance. Global core ids run over the devices
//! in order: device `d` holds cores `d*cores_per_device ..`. The software device is one
//! address space of `devices * memory` bytes (reserved lazily), shared by all its cores.

use std::fmt;

/// The shape of the virtual host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostShape {
    /// The preset's name (`sim` when none was chosen), reported as the instance type.
    pub instance_type: String,
    /// Neuron devices.
    pub devices: u32,
    /// NeuronCores per device.
    pub cores_per_device: u32,
    /// Device memory per device, in bytes.
    pub device_memory: u64,
}

const GIB: u64 = 1 << 30;

/// The presets: `(name, devices, cores per device, GiB per device)`.
pub const PRESETS: &[(&str, u32, u32, u64)] = &[
    ("sim", 1, 2, 16),
    ("inf2.xlarge", 1, 2, 32),
    ("inf2.8xlarge", 1, 2, 32),
    ("inf2.24xlarge", 6, 2, 32),
    ("inf2.48xlarge", 12, 2, 32),
    ("trn1.2xlarge", 1, 2, 32),
    ("trn1.32xlarge", 16, 2, 32),
    ("trn1n.32xlarge", 16, 2, 32),
    ("trn2.3xlarge", 1, 8, 96),
    ("trn2.48xlarge", 16, 8, 96),
];

/// The most NeuronCores a virtual host may have (trn2.48xlarge has 128).
pub const MAX_HOST_CORES: u32 = 256;

/// A bad host setting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostError(pub String);

impl fmt::Display for HostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for HostError {}

impl Default for HostShape {
    fn default() -> Self {
        HostShape::preset("sim").expect("the default preset exists")
    }
}

impl HostShape {
    /// A preset by name.
    pub fn preset(name: &str) -> Option<HostShape> {
        PRESETS
            .iter()
            .find(|p| p.0 == name)
            .map(|&(n, d, c, g)| HostShape {
                instance_type: n.to_owned(),
                devices: d,
                cores_per_device: c,
                device_memory: g * GIB,
            })
    }

    /// The host the environment describes (`NRT_SIM_INSTANCE` and the overrides).
    pub fn from_env() -> Result<HostShape, HostError> {
        let var = |k: &str| -> Result<Option<String>, HostError> {
            match std::env::var(k) {
                Ok(v) if !v.trim().is_empty() => Ok(Some(v.trim().to_owned())),
                Ok(_) | Err(std::env::VarError::NotPresent) => Ok(None),
                Err(std::env::VarError::NotUnicode(_)) => {
                    Err(HostError(format!("{k}: the value is not UTF-8")))
                }
            }
        };
        let mut h = match var("NRT_SIM_INSTANCE")? {
            Some(n) => HostShape::preset(&n).ok_or_else(|| {
                let names: Vec<&str> = PRESETS.iter().map(|p| p.0).collect();
                HostError(format!(
                    "NRT_SIM_INSTANCE={n:?} is not a known instance type (one of {})",
                    names.join(", ")
                ))
            })?,
            None => HostShape::default(),
        };
        if let Some(v) = var("NRT_SIM_DEVICES")? {
            h.devices = parse_count("NRT_SIM_DEVICES", &v)?;
        }
        if let Some(v) = var("NRT_SIM_CORES_PER_DEVICE")? {
            h.cores_per_device = parse_count("NRT_SIM_CORES_PER_DEVICE", &v)?;
        }
        if let Some(v) = var("NRT_SIM_DEVICE_MEMORY")? {
            h.device_memory = parse_size("NRT_SIM_DEVICE_MEMORY", &v)?;
        }
        h.check()?;
        Ok(h)
    }

    /// Checks the shape: at least one core, at most [`MAX_HOST_CORES`], memory that the
    /// software device can reserve.
    pub fn check(&self) -> Result<(), HostError> {
        let cores = self.devices.checked_mul(self.cores_per_device);
        match cores {
            Some(c) if (1..=MAX_HOST_CORES).contains(&c) => {}
            _ => {
                return Err(HostError(format!(
                    "{} devices of {} cores: a virtual host has 1 to {MAX_HOST_CORES} NeuronCores",
                    self.devices, self.cores_per_device
                )));
            }
        }
        match self.total_memory() {
            Some(m) if self.device_memory >= 1 << 20 && m <= 1 << 46 => Ok(()),
            _ => Err(HostError(format!(
                "{} devices of {} bytes: device memory must be 1 MiB or more per device and 64 TiB at most in all",
                self.devices, self.device_memory
            ))),
        }
    }

    /// NeuronCores of the host.
    pub fn total_cores(&self) -> u32 {
        self.devices.saturating_mul(self.cores_per_device)
    }

    /// Device memory of the host (`None` on overflow).
    pub fn total_memory(&self) -> Option<u64> {
        self.device_memory.checked_mul(self.devices as u64)
    }

    /// Device memory per NeuronCore.
    pub fn memory_per_core(&self) -> u64 {
        self.device_memory / self.cores_per_device.max(1) as u64
    }

    /// The device that holds global core `core`.
    pub fn device_of(&self, core: u32) -> u32 {
        core / self.cores_per_device.max(1)
    }
}

fn parse_count(k: &str, v: &str) -> Result<u32, HostError> {
    match v.parse::<u32>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(HostError(format!("{k}={v:?} is not a positive integer"))),
    }
}

/// Parses `34359738368`, `32G`, `32GiB`, `512M`, `1T`.
pub fn parse_size(k: &str, v: &str) -> Result<u64, HostError> {
    nrt_hal::host_memory::parse_size(v).ok_or_else(|| {
        HostError(format!(
            "{k}={v:?} is not a size (bytes, or e.g. 32G, 512MiB)"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_and_sizes() {
        let t = HostShape::preset("trn2.48xlarge").unwrap();
        assert_eq!((t.total_cores(), t.memory_per_core()), (128, 12 * GIB));
        assert_eq!(
            HostShape::preset("inf2.48xlarge").unwrap().total_cores(),
            24
        );
        assert_eq!(HostShape::default().total_cores(), 2);
        for p in PRESETS {
            HostShape::preset(p.0).unwrap().check().unwrap();
        }
        assert_eq!(parse_size("x", "32G").unwrap(), 32 * GIB);
        assert_eq!(parse_size("x", "512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("x", "4096").unwrap(), 4096);
        assert!(parse_size("x", "99999999999T").is_err());
        assert!(parse_size("x", "3Q").is_err());
        let big = HostShape {
            devices: 1 << 20,
            ..HostShape::default()
        };
        assert!(big.check().is_err());
    }
}
