//! Fuzzes past the decoder: any byte string that decodes and validates is loaded on a small
//! software NeuronCore and executed once. A model that validates but then crashes, hangs or
//! corrupts the device (D1: an operand whose extent wrapped `i64` wrote out of bounds) is a
//! finding; a load or execution error is the expected outcome for a hostile model.
//!
//! Bounded so the fuzzer cannot OOM: a 256 MiB device (models asking for more fail to load
//! with `NRT_RESOURCE`), I/O tensors of at most 16 MiB, a 100 ms execution timeout and the
//! device's 20 ms hang watchdog.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nrt_model::{CompiledModel, Usage};
use nrt_runtime::{LoadOptions, Placement, Runtime, RuntimeConfig, TensorSet};
use nrt_sim::{SimConfig, SoftDevice};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

const DEVICE_BYTES: u64 = 256 << 20;
const MAX_IO_BYTES: u64 = 16 << 20;

fn runtime() -> &'static Runtime {
    static RT: OnceLock<Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        let dev = SoftDevice::new(SimConfig {
            memory_bytes: DEVICE_BYTES,
            ..SimConfig::default()
        })
        .expect("a 256 MiB software device");
        Runtime::init(Arc::new(dev), RuntimeConfig::default()).expect("runtime")
    })
}

fuzz_target!(|data: &[u8]| {
    // The decoder alone is cheap; only what validates reaches the device.
    let Ok(decoded) = CompiledModel::decode(data) else {
        return;
    };
    if decoded.io.iter().any(|t| t.byte_size() > MAX_IO_BYTES) {
        return;
    }
    let rt = runtime();
    let opts = LoadOptions {
        exec_timeout: Some(Duration::from_millis(100)),
    };
    let Ok(model) = rt.load(data, 0, &opts) else {
        return;
    };
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    let mut tensors = Vec::new();
    let mut complete = true;
    for info in model.tensor_info() {
        match rt.allocate_tensor(Placement::Device, model.vnc() as i32, info.size, &info.name) {
            Ok(t) => {
                match info.usage {
                    Usage::Input => ins.add(&info.name, &t),
                    Usage::Output => outs.add(&info.name, &t),
                }
                tensors.push(t);
            }
            Err(_) => complete = false,
        }
    }
    if complete && rt.execute(&model, &ins, &outs).is_err() {
        // A fatal error leaves the logical core unrecoverable until reset.
        let _ = rt.reset_vnc(model.vnc());
    }
    drop((ins, outs, tensors));
    rt.unload(&model).expect("a loaded model unloads");
});
