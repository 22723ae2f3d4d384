//! Every environment variable the runtime, the software device and the kernels read, with
//! its default: one table, printed by `nrt --help` (clap's `after_help`). A test
//! (`crates/cli/tests/environment.rs`) greps the crates' sources for the variables they read
//! and checks each is here.

/// One variable: its name, its default, and what it does.
pub struct Variable {
    pub name: &'static str,
    pub default: &'static str,
    pub meaning: &'static str,
}

const fn var(name: &'static str, default: &'static str, meaning: &'static str) -> Variable {
    Variable {
        name,
        default,
        meaning,
    }
}

/// The variables, public runtime's first, then the software device's and this project's.
pub const VARIABLES: &[Variable] = &[
    var(
        "NEURON_RT_VISIBLE_CORES",
        "unset (by count)",
        "exact cores to reserve: 3, 3-6, 3,4,5 (contiguous)",
    ),
    var(
        "NEURON_RT_NUM_CORES",
        "0 (all)",
        "how many cores to reserve when VISIBLE_CORES is unset",
    ),
    var(
        "NEURON_LOGICAL_NC_CONFIG",
        "1 (nrt run/trace/bench: the model's core count)",
        "physical cores per logical core: 1 or 2",
    ),
    var(
        "NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS",
        "0 (synchronous)",
        "implicit async with N (1..=63) executions in flight",
    ),
    var(
        "NEURON_RT_EXEC_TIMEOUT",
        "30",
        "seconds an execution may take (fractions accepted)",
    ),
    var(
        "NEURON_RT_LOG_LEVEL",
        "ERROR",
        "OFF, ERROR, WARN, INFO, DEBUG (API tracing), TRACE",
    ),
    var(
        "NEURON_RT_LOG_LEVEL_NRT",
        "NEURON_RT_LOG_LEVEL",
        "the runtime module's level",
    ),
    var(
        "NEURON_RT_LOG_LEVEL_NMGR",
        "NEURON_RT_LOG_LEVEL",
        "the model manager's level",
    ),
    var(
        "NEURON_RT_LOG_LEVEL_TDRV",
        "NEURON_RT_LOG_LEVEL",
        "the device driver layer's level",
    ),
    var(
        "NEURON_RT_INSPECT_ENABLE",
        "0",
        "1: profile the whole process (nrt trace's JSON per model)",
    ),
    var(
        "NEURON_RT_INSPECT_OUTPUT_DIR",
        "output",
        "where the profiles are written",
    ),
    var(
        "NEURON_RT_INSPECT_DEVICE_PROFILE",
        "model",
        "model (1): one execution per model; session (0): every one",
    ),
    var(
        "NEURON_RT_INSPECT_DEVICE_PROFILE_NUM_WARMUP",
        "0",
        "executions skipped before profiling",
    ),
    var(
        "NEURON_PROCESS_TAG",
        "empty",
        "a tag for this process in nrt ls / monitor / top",
    ),
    var(
        "NRT_RUNTIME_DIR",
        "$XDG_RUNTIME_DIR/nrt-rs, else /dev/shm/nrt-rs-<uid>",
        "where cores are locked and statistics published (a shared one: root's, group-writable, sticky)",
    ),
    var(
        "NRT_HOST_MEMORY_MAX",
        "unset (MemAvailable and the container's limit)",
        "a cap on the process's memory, e.g. 4G",
    ),
    var(
        "NRT_SIM_SYNC_ON_CALLER",
        "short",
        "which synchronous executions run on the caller's thread: short, always, never",
    ),
    var(
        "NRT_SIM_INSTANCE",
        "unset (1 device, 2 cores, 16 GiB)",
        "the virtual host: inf2.xlarge, inf2.48xlarge, trn1.2xlarge, trn1.32xlarge, trn2.48xlarge, ...",
    ),
    var(
        "NRT_SIM_DEVICES",
        "the instance's",
        "devices of the virtual host",
    ),
    var(
        "NRT_SIM_CORES_PER_DEVICE",
        "the instance's",
        "NeuronCores per device",
    ),
    var(
        "NRT_SIM_DEVICE_MEMORY",
        "the instance's",
        "memory per device (bytes, or e.g. 16G)",
    ),
    var(
        "NRT_SIM_THREADS",
        "0 (automatic)",
        "device threads (at most one per core)",
    ),
    var(
        "NRT_SIM_FAULTS",
        "none",
        "fault plan, e.g. \"hang@engine=act,exec=3;nan@exec=5\"",
    ),
    var(
        "NRT_SIM_ISA",
        "native",
        "avx2: the kernels without AVX-512 or AMX, as on a CPU without them",
    ),
    var("NRT_SIM_AMX", "1", "0: the matrix kernels without AMX"),
];

/// The `ENVIRONMENT` section of `nrt --help`: one variable a line, with its default.
pub fn help() -> String {
    let width = VARIABLES.iter().map(|v| v.name.len()).max().unwrap_or(0);
    let mut s = String::from("ENVIRONMENT (variable, default: meaning):\n");
    for v in VARIABLES {
        s.push_str(&format!(
            "  {:<width$}  {}: {}\n",
            v.name, v.default, v.meaning
        ));
    }
    s
}
