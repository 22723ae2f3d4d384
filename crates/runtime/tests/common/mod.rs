//! Shared helpers of the runtime's integration tests.
#![allow(dead_code, reason = "each test binary uses a different subset")]

pub mod scripted;

use nrt_runtime::{LoadOptions, Model, Placement, Runtime, RuntimeConfig, Tensor, TensorSet};
use nrt_sim::{SimConfig, SoftDevice};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub fn device() -> Arc<SoftDevice> {
    Arc::new(
        SoftDevice::new(SimConfig {
            memory_bytes: 2 << 30,
            ..SimConfig::default()
        })
        .unwrap(),
    )
}

pub fn runtime_on(dev: &Arc<SoftDevice>, config: RuntimeConfig) -> Runtime {
    Runtime::init(dev.clone(), config).unwrap()
}

pub fn runtime() -> (Arc<SoftDevice>, Runtime) {
    let d = device();
    let rt = runtime_on(&d, RuntimeConfig::default());
    (d, rt)
}

/// Waits until core `nc` of `dev` has taken more than `before` requests off its exec rings
/// (at most 10 s): a test that must act while an execution submitted from another thread is
/// in flight waits for it to be in flight, rather than sleeping a fixed time that a
/// submitter preempted by a co-tenant can outlast.
pub fn wait_until_taken(dev: &SoftDevice, nc: u32, before: u64) {
    let t0 = Instant::now();
    while dev.executions(nc).unwrap() <= before {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the device never took the execution"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

pub fn quick_timeout() -> LoadOptions {
    LoadOptions {
        exec_timeout: Some(Duration::from_millis(300)),
        ..Default::default()
    }
}

/// Allocates one tensor per model input/output, inputs filled with `fill(i)`.
pub fn tensors(
    rt: &Runtime,
    m: &Model,
    placement: Placement,
) -> (TensorSet, TensorSet, Vec<Tensor>) {
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    let mut all = Vec::new();
    for info in m.tensor_info() {
        let t = rt
            .allocate_tensor(placement, m.vnc() as i32, info.size, &info.name)
            .unwrap();
        match info.usage {
            nrt_model::Usage::Input => ins.add(&info.name, &t),
            nrt_model::Usage::Output => outs.add(&info.name, &t),
        }
        all.push(t);
    }
    (ins, outs, all)
}

pub fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn read_f32(t: &Tensor) -> Vec<f32> {
    let mut b = vec![0u8; t.size() as usize];
    t.read(&mut b, 0).unwrap();
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}
