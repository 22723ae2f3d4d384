//! Stress: 8 threads mixing surfaces over two models on two cores. Every completion must be
//! reported exactly once with the right status and output, with no deadlock and bounded
//! memory. CI runs 8 × 500; `cargo test -p nrt-runtime --release --test stress -- --ignored`
//! runs the full 8 × 10,000.

mod common;
use common::*;
use nrt_hal::NrtStatus;
use nrt_runtime::builtin::near_null;
use nrt_runtime::{LoadOptions, Placement, RuntimeConfig};
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

const THREADS: usize = 8;

fn stress_sync_and_explicit(iters: usize) {
    let (_d, rt) = runtime();
    assert_eq!(rt.vnc_count(), 2);
    let models = [
        rt.load(&near_null(1), 0, &LoadOptions::default()).unwrap(),
        rt.load(&near_null(1), 1, &LoadOptions::default()).unwrap(),
    ];
    let mem0 = rt.memory_stats(0).unwrap().bytes_used;
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (rt, m) = (rt.clone(), models[t % 2].clone());
            std::thread::spawn(move || {
                let (ins, outs, _k) = tensors(&rt, &m, Placement::Device);
                for i in 0..iters {
                    let x = [t as f32, i as f32, -(i as f32), 1.0];
                    ins.get("x").unwrap().write(&f32s(&x), 0).unwrap();
                    if i % 2 == 0 {
                        rt.execute(&m, &ins, &outs).unwrap();
                    } else {
                        let mut status = -1i32;
                        // SAFETY: `status` outlives the wait.
                        let s = unsafe { rt.execute_schedule_raw(&m, &ins, &outs, 0, &mut status) };
                        let s = match s {
                            Ok(s) => s,
                            Err(e) if e.status == NrtStatus::QueueFull => {
                                std::thread::yield_now();
                                continue;
                            }
                            Err(e) => panic!("{e}"),
                        };
                        assert_eq!(rt.wait(s).unwrap(), NrtStatus::Success);
                        assert_eq!(
                            status, 0,
                            "status slot written exactly once, before completion"
                        );
                    }
                    assert_eq!(
                        read_f32(outs.get("y").unwrap()),
                        x,
                        "thread {t} iteration {i}"
                    );
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // Every tensor the threads allocated is freed: memory is back where it was.
    assert_eq!(
        rt.memory_stats(0).unwrap().bytes_used,
        mem0,
        "device memory leaked"
    );
}

fn stress_implicit(iters: usize) {
    let d = device();
    let rt = runtime_on(
        &d,
        RuntimeConfig {
            async_inflight: 16,
            ..Default::default()
        },
    );
    let seen: Arc<Mutex<HashSet<u64>>> = Arc::new(Mutex::new(HashSet::new()));
    let dupes = Arc::new(AtomicU64::new(0));
    let (s2, d2) = (seen.clone(), dupes.clone());
    rt.register_async_callback(Arc::new(move |_, _, job, status| {
        assert_eq!(status, NrtStatus::Success);
        if !s2.lock().unwrap().insert(job) {
            d2.fetch_add(1, Ordering::Relaxed);
        }
    }))
    .unwrap();
    let models = [
        rt.load(&near_null(1), 0, &LoadOptions::default()).unwrap(),
        rt.load(&near_null(1), 1, &LoadOptions::default()).unwrap(),
    ];
    let submitted = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (rt, m, sub) = (rt.clone(), models[t % 2].clone(), submitted.clone());
            std::thread::spawn(move || {
                let (ins, outs, _k) = tensors(&rt, &m, Placement::Device);
                for i in 0..iters {
                    let x = [t as f32, i as f32, 0.0, 1.0];
                    // Implicit mode: the write waits for this thread's pending executions.
                    ins.get("x").unwrap().write(&f32s(&x), 0).unwrap();
                    loop {
                        match rt.execute(&m, &ins, &outs) {
                            Ok(()) => break,
                            Err(e) if e.status == NrtStatus::QueueFull => std::thread::yield_now(),
                            Err(e) => panic!("{e}"),
                        }
                    }
                    sub.fetch_add(1, Ordering::Relaxed);
                    // The read waits for the execution that writes `y`.
                    assert_eq!(
                        read_f32(outs.get("y").unwrap()),
                        x,
                        "thread {t} iteration {i}"
                    );
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    rt.async_drain(-1).unwrap();
    assert_eq!(
        dupes.load(Ordering::Relaxed),
        0,
        "a completion was reported twice"
    );
    assert_eq!(
        seen.lock().unwrap().len() as u64,
        submitted.load(Ordering::Relaxed),
        "every completion reported"
    );
}

fn iters() -> usize {
    std::env::var("NRT_STRESS_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500)
}

#[test]
fn stress_mixed_surfaces_two_models_two_cores() {
    stress_sync_and_explicit(iters());
    stress_implicit(iters());
}

#[test]
#[ignore = "full size (8 × 10,000); run in the benchmark job or by hand"]
fn stress_full_size() {
    stress_sync_and_explicit(10_000);
    stress_implicit(10_000);
}
