//! The rows of the runtime's surfaces: the spinning round-trip limit, the device alone, the
//! synchronous surface (one thread or several), explicit and implicit async at a queue
//! depth, first-after-switch; and the device threads' CPU share noted beside a row.

use super::*;
use crate::session::{self, Res, fmt_ns};
use nrt_runtime::builtin::near_null;
use nrt_runtime::{LoadOptions, Model, Runtime, RuntimeConfig, SeqId, Tensor, TensorSet};
use nrt_sim::SoftDevice;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The spinning round-trip limit: two threads bouncing a counter through one cache line.
pub(super) fn pingpong(seconds: f64) -> Timing {
    let ping = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (p2, s2) = (ping.clone(), stop.clone());
    let t = std::thread::spawn(move || {
        let mut last = 0;
        while !s2.load(Ordering::Relaxed) {
            let v = p2.load(Ordering::Acquire);
            if v != last && v % 2 == 1 {
                p2.store(v + 1, Ordering::Release);
                last = v + 1;
            }
            std::hint::spin_loop();
        }
    });
    let mut v = 0u64;
    let mut samples = Vec::with_capacity(1 << 22);
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(seconds.min(1.0));
    while Instant::now() < end && samples.len() < samples.capacity() {
        let t0 = Instant::now();
        ping.store(v + 1, Ordering::Release);
        while ping.load(Ordering::Acquire) != v + 2 {
            std::hint::spin_loop();
        }
        v += 2;
        samples.push(t0.elapsed().as_nanos() as u64);
    }
    let elapsed = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    let _ = t.join();
    Timing {
        samples,
        elapsed,
        allocs: 0,
        cpu: elapsed,
    }
}

/// The device alone: stage an empty request, ring, spin until all five END records.
pub(super) fn device_only(seconds: f64) -> Res<Timing> {
    let dev = session::device()?;
    let mut d = nrt_sim::testkit::DirectDriver::new(&*dev, 0).map_err(|e| e.to_string())?;
    let blocks = d.empty_blocks().map_err(|e| e.to_string())?;
    let mut idx = 0u32;
    time_calls(seconds, || {
        d.stage(blocks, idx, 0, 0, 1);
        idx = idx.wrapping_add(1);
        d.doorbell().map_err(|e| e.to_string())?;
        if d.spin_for_execution(Duration::from_secs(5)) {
            Ok(())
        } else {
            Err("device did not finish".into())
        }
    })
}

pub(super) fn sync_rows(
    rt: &Runtime,
    m: &Model,
    label: &str,
    cores: u32,
    seconds: f64,
) -> Res<Row> {
    let (ins, outs, _keep) = session::io_tensors(rt, m)?;
    fill_random(&ins, m)?;
    let t = time_calls(seconds, || {
        rt.execute(m, &ins, &outs).map_err(|e| e.to_string())
    })?;
    Ok(row(label, "sync", 1, cores, t, ""))
}

/// The synchronous surface driven by `threads` threads at once, each with its own tensors,
/// for `seconds` after a warm-up: one sample per execution (its call), the process's CPU
/// (callers, device and worker threads) per execution in the note, the callers' own in the
/// CPU column.
pub(super) fn threads_rows(
    rt: &Runtime,
    m: &Model,
    label: &str,
    cores: u32,
    threads: usize,
    seconds: f64,
) -> Res<Row> {
    let sets: Vec<_> = (0..threads)
        .map(|_| session::io_tensors(rt, m))
        .collect::<Res<_>>()?;
    for (ins, _, _) in &sets {
        fill_random(ins, m)?;
    }
    let start_line = std::sync::Barrier::new(threads + 1);
    let (warm, run) = (Duration::from_millis(300), Duration::from_secs_f64(seconds));
    let per_thread = (4 << 20) / threads;
    let (results, window) = std::thread::scope(|s| {
        let handles: Vec<_> = sets
            .iter()
            .map(|(ins, outs, _)| {
                let start_line = &start_line;
                s.spawn(move || -> Res<(Vec<u64>, Duration)> {
                    let exec = || rt.execute(m, ins, outs).map_err(|e| e.to_string());
                    let until = Instant::now() + warm;
                    let warmed = (|| {
                        while Instant::now() < until {
                            exec()?;
                        }
                        Ok::<(), String>(())
                    })();
                    let mut samples = Vec::with_capacity(per_thread);
                    // Every thread reaches the start line, a failed one too: the others and
                    // the timing thread wait there for all of them.
                    start_line.wait();
                    warmed?;
                    let cpu0 = thread_cpu();
                    let mut t = Instant::now();
                    let end = t + run;
                    while t < end && samples.len() < samples.capacity() {
                        exec()?;
                        let now = Instant::now();
                        samples.push((now - t).as_nanos() as u64);
                        t = now;
                    }
                    Ok((samples, thread_cpu() - cpu0))
                })
            })
            .collect();
        // Room for the results before the window opens: the window counts every thread's
        // allocations, this one's too.
        let mut results = Vec::with_capacity(handles.len());
        start_line.wait();
        let (a0, c0, t0) = (crate::allocations(), crate::cpu_time(), Instant::now());
        for h in handles {
            results.push(
                h.join()
                    .unwrap_or_else(|_| Err("a bench thread panicked".into())),
            );
        }
        let window = (
            crate::allocations() - a0,
            crate::cpu_time() - c0,
            t0.elapsed(),
        );
        (results, window)
    });
    let (allocs, process, elapsed) = window;
    let mut samples = Vec::new();
    let mut cpu = Duration::ZERO;
    for r in results {
        let (s, c) = r?;
        samples.extend(s);
        cpu += c;
    }
    let n = samples.len().max(1) as f64;
    let note = format!(
        "{threads} threads; the process {:.2} vCPUs, {} of CPU per execution",
        process.as_secs_f64() / elapsed.as_secs_f64().max(1e-9),
        fmt_ns(process.as_nanos() as f64 / n)
    );
    Ok(row(
        label,
        "sync",
        threads,
        cores,
        Timing {
            samples,
            elapsed,
            allocs,
            cpu,
        },
        &note,
    ))
}

fn fill_random(ins: &TensorSet, m: &Model) -> Res<()> {
    for (i, info) in m.tensor_info().iter().enumerate() {
        if let Some(t) = ins.get(&info.name) {
            t.write(&session::random_bytes(info, i as u64 + 1), 0)
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// Explicit async with `depth` executions kept in flight.
pub(super) fn explicit_rows(
    rt: &Runtime,
    m: &Model,
    label: &str,
    depth: usize,
    seconds: f64,
) -> Res<Row> {
    // One tensor set per slot in flight, so executions never share outputs.
    let sets: Vec<_> = (0..depth)
        .map(|_| session::io_tensors(rt, m))
        .collect::<Res<_>>()?;
    for (ins, _, _) in &sets {
        fill_random(ins, m)?;
    }
    let schedule = |k: usize| {
        rt.execute_schedule(m, &sets[k].0, &sets[k].1)
            .map_err(|e| e.to_string())
    };
    let mut q: VecDeque<(SeqId, Instant, usize)> = VecDeque::with_capacity(depth);
    let drain = |q: &mut VecDeque<(SeqId, Instant, usize)>| -> Res<()> {
        while let Some((s, _, _)) = q.pop_front() {
            rt.wait(s).map_err(|e| e.to_string())?;
        }
        Ok(())
    };
    // Warm-up.
    let warm = Instant::now() + Duration::from_millis(300);
    while Instant::now() < warm {
        for k in 0..depth {
            q.push_back((schedule(k)?, Instant::now(), k));
        }
        drain(&mut q)?;
    }
    let mut samples = Vec::with_capacity(4 << 20);
    let a0 = crate::allocations();
    let cpu0 = thread_cpu();
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(seconds);
    for k in 0..depth {
        q.push_back((schedule(k)?, start, k));
    }
    // One clock read per execution: it ends the oldest's sample and starts the next one's
    // (which includes its schedule call).
    let mut now = start;
    while now < end && samples.len() < samples.capacity() - depth {
        let (s, t0, k) = q.pop_front().expect("depth > 0");
        let mut polls = 0u32;
        while !rt.is_completed(s).map_err(|e| e.to_string())? {
            // A client polling is_completed: now and then it leaves the vCPU to whoever
            // needs it (the device thread, under a co-tenant); ~0.3 µs when nobody does.
            polls = polls.wrapping_add(1);
            if polls.is_multiple_of(64) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        now = Instant::now();
        samples.push((now - t0).as_nanos() as u64);
        q.push_back((schedule(k)?, now, k));
    }
    let elapsed = now - start;
    let allocs = crate::allocations() - a0;
    let cpu = thread_cpu() - cpu0;
    drain(&mut q)?;
    Ok(row(
        label,
        "explicit",
        depth,
        m.core_count(),
        Timing {
            samples,
            elapsed,
            allocs,
            cpu,
        },
        "",
    ))
}

/// Implicit async (`NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS = depth`): the client keeps
/// `depth` executions queued and waits for the oldest by reading a byte of its output, as an
/// application does (`nrt_execute`, then `nrt_tensor_read`, which waits for the execution).
/// Its CPU column is that wait's cost: for a long model the read blocks. (The client before
/// spun on its callback count, yielding every 8 polls: against it, near-null depth 8 runs at
/// 0.975× the throughput, 20 paired runs, and `encoder` depth 4 spent its whole execution
/// time, 2.2 ms, of caller CPU per execution, against ~25 µs now.)
/// `cores`: the model's NeuronCores per logical core (`NEURON_LOGICAL_NC_CONFIG`).
pub(super) fn implicit_rows(
    label: &str,
    ncm: &[u8],
    cores: u32,
    depth: usize,
    seconds: f64,
) -> Res<Row> {
    let (_dev, rt) = session::runtime(Some(RuntimeConfig {
        async_inflight: depth as u32,
        logical_nc: cores,
        ..base_config()?
    }))?;
    let done = Arc::new(AtomicU64::new(0));
    let d2 = done.clone();
    rt.register_async_callback(Arc::new(move |_, _, _, _| {
        d2.fetch_add(1, Ordering::Release);
    }))
    .map_err(|e| e.to_string())?;
    let m = rt
        .load(ncm, 0, &LoadOptions::default())
        .map_err(|e| e.to_string())?;
    let sets: Vec<_> = (0..depth)
        .map(|_| session::io_tensors(&rt, &m))
        .collect::<Res<_>>()?;
    // The first output of each set, and a word to read from it.
    let firsts: Vec<Tensor> = sets
        .iter()
        .map(|(_, _, all)| {
            all.iter()
                .find(|(info, _)| info.usage == nrt_model::Usage::Output)
                .map(|(_, t)| t.clone())
                .ok_or_else(|| "the model has no output".to_string())
        })
        .collect::<Res<_>>()?;
    let mut word = [0u8; 1];
    let mut submitted = 0u64;
    let mut times: VecDeque<Instant> = VecDeque::with_capacity(depth);
    let mut samples = Vec::with_capacity(4 << 20);
    let mut run = |samples: &mut Vec<u64>, until: Instant| -> Res<()> {
        // One clock read per batch of completions, as the explicit row reads one per
        // execution: it ends the finished executions' samples and starts those of the
        // submissions that follow (which include their `execute` calls). Two reads per
        // execution were 6% of the vCPU that the client shares with the XU worker.
        let mut now = Instant::now();
        while now < until && samples.len() < samples.capacity() {
            // Top up to `depth` submissions not yet sampled, not to `depth` in flight: the
            // worker can complete executions while this loop submits, and topping up to the
            // in-flight count then kept submitting without sampling, growing `times` past its
            // capacity (a reallocation in the measured window, issue #18). `times.len()` is
            // never below the in-flight count, so this also never exceeds the cap.
            while times.len() < depth {
                let k = (submitted % depth as u64) as usize;
                rt.execute(&m, &sets[k].0, &sets[k].1)
                    .map_err(|e| e.to_string())?;
                times.push_back(now);
                submitted += 1;
            }
            // Wait for the oldest as an application does: read its output, which waits
            // until the execution is retired (spinning only as long as the model's
            // executions are expected to take, then blocking).
            let target = submitted - depth as u64 + 1;
            let oldest = ((target - 1) % depth as u64) as usize;
            let t = &firsts[oldest];
            let n = t.size().min(1) as usize; // an empty output: the read still waits
            t.read(&mut word[..n], 0).map_err(|e| e.to_string())?;
            now = Instant::now();
            // Retired in order, and retired before its callback: every submission older than
            // what is in flight is done.
            let finished = done.load(Ordering::Acquire).max(target);
            let in_flight = submitted - finished;
            while times.len() as u64 > in_flight && samples.len() < samples.capacity() {
                let t0 = times.pop_front().expect("in flight");
                samples.push((now - t0).as_nanos() as u64);
            }
        }
        Ok(())
    };
    let mut warm = Vec::with_capacity(1 << 20);
    run(&mut warm, Instant::now() + Duration::from_millis(300))?;
    let a0 = crate::allocations();
    let cpu0 = thread_cpu();
    let start = Instant::now();
    run(&mut samples, start + Duration::from_secs_f64(seconds))?;
    let elapsed = start.elapsed();
    let allocs = crate::allocations() - a0;
    let cpu = thread_cpu() - cpu0;
    rt.async_drain(-1).map_err(|e| e.to_string())?;
    Ok(row(
        label,
        "implicit",
        depth,
        m.core_count(),
        Timing {
            samples,
            elapsed,
            allocs,
            cpu,
        },
        "",
    ))
}

/// Alternating two models on one core, one execution at a time: every execution is
/// first-after-switch (the device re-decodes the model's instruction blocks). `surface` is
/// "sync" (`execute`), "explicit" (`execute_schedule`, then polling `is_completed`) or
/// "implicit" (`execute` queued, then waiting for the callback).
pub(super) fn switch_rows(surface: &str, seconds: f64) -> Res<Row> {
    let implicit = surface == "implicit";
    let (_d, rt) = session::runtime(Some(RuntimeConfig {
        async_inflight: if implicit { 1 } else { 0 },
        ..base_config()?
    }))?;
    let done = Arc::new(AtomicU64::new(0));
    if implicit {
        let d2 = done.clone();
        rt.register_async_callback(Arc::new(move |_, _, _, _| {
            d2.fetch_add(1, Ordering::Release);
        }))
        .map_err(|e| e.to_string())?;
    }
    let a = session::load(&rt, &near_null(1), 0)?;
    let b = session::load(&rt, &near_null(1), 0)?;
    let (ia, oa, _k1) = session::io_tensors(&rt, &a)?;
    let (ib, ob, _k2) = session::io_tensors(&rt, &b)?;
    let mut flip = false;
    let mut submitted = 0u64;
    let c0 = rt.switch_counters();
    let t = time_calls(seconds, || {
        flip = !flip;
        let (m, i, o) = if flip { (&a, &ia, &oa) } else { (&b, &ib, &ob) };
        match surface {
            "explicit" => {
                let s = rt.execute_schedule(m, i, o).map_err(|e| e.to_string())?;
                while !rt.is_completed(s).map_err(|e| e.to_string())? {
                    std::hint::spin_loop();
                }
            }
            "implicit" => {
                rt.execute(m, i, o).map_err(|e| e.to_string())?;
                submitted += 1;
                let mut spins = 0u32;
                while done.load(Ordering::Acquire) < submitted {
                    // The XU worker delivers the callback: leave it the CPU now and then.
                    spins += 1;
                    if spins.is_multiple_of(64) {
                        std::thread::yield_now();
                    } else {
                        std::hint::spin_loop();
                    }
                }
            }
            _ => rt.execute(m, i, o).map_err(|e| e.to_string())?,
        }
        Ok(())
    })?;
    let c1 = rt.switch_counters();
    let note = format!(
        "{} switches, {} steady",
        c1.model_switches - c0.model_switches,
        c1.steady - c0.steady
    );
    Ok(row(
        "near-null",
        &format!("{surface}-switch"),
        1,
        1,
        t,
        &note,
    ))
}

/// Runs `f` (a row on a runtime of `dev`) and notes beside it the share of a vCPU that the
/// device's threads used over the row, warm-up included: a device thread spinning while its
/// caller runs the core itself (sync near-null) shows here, not in the caller's figures.
pub(super) fn noting_device_threads(dev: &SoftDevice, f: impl FnOnce() -> Res<Row>) -> Res<Row> {
    let cpu = || dev.thread_cpu_times().iter().sum::<Duration>();
    let (cpu0, t0) = (cpu(), Instant::now());
    let mut r = f()?;
    let share = cpu().saturating_sub(cpu0).as_secs_f64() / t0.elapsed().as_secs_f64().max(1e-9);
    let note = format!("device threads {:.0}% of a vCPU", share * 100.0);
    r.note = if r.note.is_empty() {
        note
    } else {
        format!("{}; {note}", r.note)
    };
    Ok(r)
}
