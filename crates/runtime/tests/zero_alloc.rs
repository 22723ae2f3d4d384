//! Zero heap allocations per steady-state execution, proven with a counting global
//! allocator that sees every thread (the caller, the device thread, the XU workers).
//!
//! `harness = false`: the checks run one after another on the main thread, because libtest's
//! own threads (spawning the next test, collecting output) allocate and would be counted.

mod common;
use common::*;
use nrt_runtime::builtin::near_null;
use nrt_runtime::{LoadOptions, Placement, RuntimeConfig};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static FREES: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        FREES.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        FREES.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn counts() -> (u64, u64) {
    (ALLOCS.load(Ordering::SeqCst), FREES.load(Ordering::SeqCst))
}

/// Runs `n` executions between two allocator snapshots; returns (allocations, frees).
fn measure(n: usize, mut f: impl FnMut()) -> (u64, u64) {
    for _ in 0..100 {
        f(); // warm up: first-after-switch decode, lazily grown buffers
    }
    let (a0, f0) = counts();
    for _ in 0..n {
        f();
    }
    let (a1, f1) = counts();
    (a1 - a0, f1 - f0)
}

fn sync_surface_allocates_nothing_per_execution() {
    let (_d, rt) = runtime();
    let m = rt.load(&near_null(1), 0, &LoadOptions::default()).unwrap();
    let (di, dout, _k1) = tensors(&rt, &m, Placement::Device);
    let (hi, hout, _k2) = tensors(&rt, &m, Placement::Host);
    assert_eq!(
        measure(1000, || rt.execute(&m, &di, &dout).unwrap()),
        (0, 0),
        "device tensors"
    );
    assert_eq!(
        measure(1000, || rt.execute(&m, &hi, &hout).unwrap()),
        (0, 0),
        "host tensors (sync clone)"
    );
    rt.set_tracing(true);
    assert_eq!(
        measure(1000, || rt.execute(&m, &di, &dout).unwrap()),
        (0, 0),
        "with tracing on"
    );
}

fn lockstep_two_core_executions_allocate_nothing() {
    let d = device();
    let rt = runtime_on(
        &d,
        RuntimeConfig {
            logical_nc: 2,
            ..Default::default()
        },
    );
    let m = rt.load(&near_null(2), 0, &LoadOptions::default()).unwrap();
    let (i, o, _k) = tensors(&rt, &m, Placement::Device);
    assert_eq!(measure(1000, || rt.execute(&m, &i, &o).unwrap()), (0, 0));
}

fn explicit_async_allocates_nothing_per_execution() {
    let (_d, rt) = runtime();
    let m = rt.load(&near_null(1), 0, &LoadOptions::default()).unwrap();
    let (i, o, _k) = tensors(&rt, &m, Placement::Device);
    let mut status = 0i32;
    let run = || {
        // SAFETY: `status` outlives the wait below.
        let s = unsafe { rt.execute_schedule_raw(&m, &i, &o, 0, &mut status) }.unwrap();
        while !rt.is_completed(s).unwrap() {
            std::hint::spin_loop();
        }
    };
    assert_eq!(measure(1000, run), (0, 0));
    // Eight in flight at a time.
    let run8 = || {
        let mut seqs = [nrt_runtime::SeqId(0); 8];
        for s in seqs.iter_mut() {
            *s = rt.execute_schedule(&m, &i, &o).unwrap();
        }
        for s in seqs {
            rt.wait(s).unwrap();
        }
    };
    assert_eq!(measure(125, run8), (0, 0));
}

fn implicit_async_allocates_nothing_per_execution() {
    let d = device();
    let rt = runtime_on(
        &d,
        RuntimeConfig {
            async_inflight: 8,
            ..Default::default()
        },
    );
    let done = std::sync::Arc::new(AtomicU64::new(0));
    let cb = done.clone();
    rt.register_async_callback(std::sync::Arc::new(move |_, _, _, s| {
        assert!(s.is_success());
        cb.fetch_add(1, Ordering::Release);
    }))
    .unwrap();
    let m = rt.load(&near_null(1), 0, &LoadOptions::default()).unwrap();
    let (i, o, _k) = tensors(&rt, &m, Placement::Device);
    let mut submitted = 0u64;
    let run = || {
        rt.execute(&m, &i, &o).unwrap();
        submitted += 1;
        while done.load(Ordering::Acquire) < submitted {
            std::hint::spin_loop();
        }
    };
    assert_eq!(measure(1000, run), (0, 0));
}

/// The counter is not blind: one planted allocation per execution is seen as one.
fn the_counter_sees_a_planted_allocation() {
    let (_d, rt) = runtime();
    let m = rt.load(&near_null(1), 0, &LoadOptions::default()).unwrap();
    let (i, o, _k) = tensors(&rt, &m, Placement::Device);
    let (allocs, frees) = measure(100, || {
        rt.execute(&m, &i, &o).unwrap();
        std::hint::black_box(Box::new(0u64));
    });
    assert_eq!((allocs, frees), (100, 100));
}

fn main() {
    let checks: [(&str, fn()); 5] = [
        (
            "the_counter_sees_a_planted_allocation",
            the_counter_sees_a_planted_allocation,
        ),
        (
            "sync_surface_allocates_nothing_per_execution",
            sync_surface_allocates_nothing_per_execution,
        ),
        (
            "lockstep_two_core_executions_allocate_nothing",
            lockstep_two_core_executions_allocate_nothing,
        ),
        (
            "explicit_async_allocates_nothing_per_execution",
            explicit_async_allocates_nothing_per_execution,
        ),
        (
            "implicit_async_allocates_nothing_per_execution",
            implicit_async_allocates_nothing_per_execution,
        ),
    ];
    // `cargo test -- <filter>` runs the checks whose name contains the filter.
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let mut ran = 0;
    for (name, check) in checks {
        if filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str())) {
            check();
            println!("test {name} ... ok");
            ran += 1;
        }
    }
    println!("\ntest result: ok. {ran} passed; 0 failed");
}
