//! Zero heap allocations per steady-state execution *through the C layer*: the exported
//! `extern "C"` functions are called directly (the crate's rlib), with a counting global
//! allocator that sees every thread (the caller, the device thread, the XU workers). Each
//! entry point is measured quiet and again beside busy-looping co-tenant threads, one per
//! CPU, so the slow paths that only preemption makes run are measured too (issue #18).

mod common;
use nrt::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

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

/// Runs `f` 100 times to warm up, then `n` times between two allocator snapshots.
fn measure(n: usize, mut f: impl FnMut()) -> (u64, u64) {
    for _ in 0..100 {
        f();
    }
    let (a0, f0) = counts();
    for _ in 0..n {
        f();
    }
    let (a1, f1) = counts();
    (a1 - a0, f1 - f0)
}

/// [`measure`] while one busy-looping thread per CPU competes for the CPUs: at least 50
/// calls and at least 300 ms, so the window spans many preemptions.
fn measure_contended(mut f: impl FnMut()) -> (u64, u64) {
    let _co = nrt_sim::testkit::CoTenants::one_per_cpu();
    for _ in 0..50 {
        f();
    }
    let (a0, f0) = counts();
    let start = Instant::now();
    let mut calls = 0;
    while calls < 50 || start.elapsed() < Duration::from_millis(300) {
        f();
        calls += 1;
    }
    let (a1, f1) = counts();
    (a1 - a0, f1 - f0)
}

const OK: i32 = 0;

/// One test: the runtime is process-global, so everything runs in order here.
#[test]
fn c_entry_points_allocate_nothing_per_execution() {
    // SAFETY: nothing else runs yet (one test in this binary): no concurrent env access.
    unsafe { std::env::remove_var("NEURON_RT_LOG_LEVEL") };
    // A runtime directory of its own: nrt_init takes ownership of the cores (and publishes
    // its statistics, which must not allocate either).
    // SAFETY: as above.
    unsafe { std::env::set_var("NRT_RUNTIME_DIR", common::private_runtime_dir()) };
    let bytes = common::near_null();
    // SAFETY: every pointer passed below is valid for what the C API does with it: the
    // model bytes, NUL-terminated literals, out-pointers to locals, buffers of 16 bytes.
    unsafe {
        assert_eq!(nrt_init(1, c"".as_ptr(), c"".as_ptr()), OK);
        let mut model = null_mut();
        assert_eq!(
            nrt_load(bytes.as_ptr().cast(), bytes.len(), 0, -1, &mut model),
            OK
        );
        let (mut x, mut y) = (null_mut(), null_mut());
        assert_eq!(nrt_tensor_allocate(0, 0, 16, c"x".as_ptr(), &mut x), OK);
        assert_eq!(nrt_tensor_allocate(0, 0, 16, c"y".as_ptr(), &mut y), OK);
        let (mut ins, mut outs) = (null_mut(), null_mut());
        assert_eq!(nrt_allocate_tensor_set(&mut ins), OK);
        assert_eq!(nrt_allocate_tensor_set(&mut outs), OK);
        assert_eq!(nrt_add_tensor_to_tensor_set(ins, c"x".as_ptr(), x), OK);
        assert_eq!(nrt_add_tensor_to_tensor_set(outs, c"y".as_ptr(), y), OK);
        let input = [1.0f32, 2.0, 3.0, 4.0];
        assert_eq!(nrt_tensor_write(x, input.as_ptr().cast(), 0, 16), OK);

        // nrt_execute: the synchronous hot path.
        let exec = || assert_eq!(nrt_execute(model, ins, outs), OK);
        assert_eq!(measure(1000, exec), (0, 0), "nrt_execute allocated");
        assert_eq!(
            measure_contended(exec),
            (0, 0),
            "nrt_execute allocated beside co-tenants"
        );

        let mut out = [0f32; 4];
        assert_eq!(nrt_tensor_read(y, out.as_mut_ptr().cast(), 0, 16), OK);
        assert_eq!(out, input);

        // nrta_execute_schedule + nrta_is_completed: the NRT 3.0 hot path.
        let mut status = -1i32;
        let mut seq = 0u64;
        let mut run = || {
            assert_eq!(
                nrta_execute_schedule(model, ins, outs, 0, &mut status, &mut seq),
                OK
            );
            let mut done = false;
            while !done {
                assert_eq!(nrta_is_completed(seq, &mut done), OK);
            }
        };
        assert_eq!(
            measure(1000, &mut run),
            (0, 0),
            "nrta_execute_schedule allocated"
        );
        assert_eq!(
            measure_contended(&mut run),
            (0, 0),
            "nrta_execute_schedule allocated beside co-tenants"
        );
        assert_eq!(status, OK);

        nrt_tensor_free(&mut x);
        nrt_tensor_free(&mut y);
        nrt_destroy_tensor_set(&mut ins);
        nrt_destroy_tensor_set(&mut outs);
        assert_eq!(nrt_unload(model), OK);
        nrt_close();
        assert!(x.is_null() && ins.is_null());
    }
}
