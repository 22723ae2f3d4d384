//! `nrt bench`: the project's benchmark harness. Every row is measured in this run:
//! per-execution latency (median, p99), executions per second, and heap allocations per
//! execution (from the counting allocator of the `nrt` binary).
//!
//! Without a model it runs the standard rows: the spinning round-trip limit of this machine
//! (two threads ping-ponging on atomics), the device-only round trip of an empty request,
//! the near-null model synchronously (steady state, 1 and 2 cores), the async surfaces at
//! several queue depths, and first-after-switch on each surface (two models alternating).

use crate::args::{BenchArgs, Surface};
use crate::session::{self, Res, fmt_ns, percentiles};
use nrt_isa::op;
use nrt_runtime::builtin::near_null;
use nrt_runtime::{
    LoadOptions, Model, Placement, Runtime, RuntimeConfig, SeqId, Tensor, TensorSet,
};
use nrt_sim::SoftDevice;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// One result row (`--json` prints each as one JSON object per line).
#[derive(Clone, Debug, serde::Serialize)]
pub struct Row {
    pub model: String,
    pub surface: String,
    pub depth: usize,
    pub cores: u32,
    pub n: usize,
    pub median_ns: f64,
    pub p99_ns: f64,
    pub execs_per_s: f64,
    pub allocs_per_exec: f64,
    /// CPU time of the calling thread (the one that submits and waits) per execution, in
    /// ns (`getrusage(RUSAGE_THREAD)` around the timed window).
    pub caller_cpu_ns: f64,
    /// The calling thread's share of one vCPU during the timed window (1.0 = it never
    /// stopped running: a spinning waiter).
    pub caller_cpu_share: f64,
    pub note: String,
}

impl Row {
    fn json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

struct Timing {
    samples: Vec<u64>,
    elapsed: Duration,
    allocs: u64,
    /// CPU time of the calling thread in the timed window.
    cpu: Duration,
}

/// CPU time (user + system) the calling thread has used.
fn thread_cpu() -> Duration {
    // SAFETY: `getrusage` fills the zeroed struct we pass; RUSAGE_THREAD (Linux ≥ 2.6.26)
    // cannot fail with a valid pointer.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn row(model: &str, surface: &str, depth: usize, cores: u32, t: Timing, note: &str) -> Row {
    let mut s = t.samples;
    let n = s.len();
    let (median, p99) = percentiles(&mut s);
    Row {
        model: model.into(),
        surface: surface.into(),
        depth,
        cores,
        n,
        median_ns: median,
        p99_ns: p99,
        execs_per_s: n as f64 / t.elapsed.as_secs_f64().max(1e-9),
        allocs_per_exec: t.allocs as f64 / n.max(1) as f64,
        caller_cpu_ns: t.cpu.as_nanos() as f64 / n.max(1) as f64,
        caller_cpu_share: t.cpu.as_secs_f64() / t.elapsed.as_secs_f64().max(1e-9),
        note: note.into(),
    }
}

/// Times `f` (one execution per call) for `seconds` after a warm-up.
fn time_calls(seconds: f64, mut f: impl FnMut() -> Res<()>) -> Res<Timing> {
    let warm = Instant::now() + Duration::from_millis(300);
    let mut k = 0;
    while Instant::now() < warm || k < 20 {
        f()?;
        k += 1;
    }
    let mut samples = Vec::with_capacity(4 << 20);
    let a0 = crate::allocations();
    let cpu0 = thread_cpu();
    // One clock read per call: each one ends a sample and starts the next (three reads per
    // call were ~90 ns here, a tenth of a near-null execution's rate).
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(seconds);
    let mut t = start;
    while (samples.len() < 200 || t < end) && samples.len() < samples.capacity() {
        f()?;
        let now = Instant::now();
        samples.push((now - t).as_nanos() as u64);
        t = now;
    }
    let elapsed = t - start;
    let cpu = thread_cpu() - cpu0;
    Ok(Timing {
        samples,
        elapsed,
        allocs: crate::allocations() - a0,
        cpu,
    })
}

/// The spinning round-trip limit: two threads bouncing a counter through one cache line.
fn pingpong(seconds: f64) -> Timing {
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
fn device_only(seconds: f64) -> Res<Timing> {
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

fn sync_rows(rt: &Runtime, m: &Model, label: &str, cores: u32, seconds: f64) -> Res<Row> {
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
fn threads_rows(
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
fn explicit_rows(rt: &Runtime, m: &Model, label: &str, depth: usize, seconds: f64) -> Res<Row> {
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

/// The configuration every row starts from: the environment's, as for every subcommand that
/// executes (`RuntimeConfig::from_env`: the bench holds its NeuronCores in the runtime
/// directory, so `nrt ls` lists it and a core another process holds is refused naming the
/// owner; `NEURON_RT_VISIBLE_CORES` picks them; `NRT_SIM_SYNC_ON_CALLER` benches the
/// software device's policies side by side). Each row then sets the surface it measures:
/// implicit async only where a row asks for it.
fn base_config() -> Res<RuntimeConfig> {
    let mut c = RuntimeConfig::from_env().map_err(|e| e.to_string())?;
    c.async_inflight = 0;
    Ok(c)
}

/// The logical-core size to run `ncm` on: `NEURON_LOGICAL_NC_CONFIG` when set (a mismatch
/// then fails with its error, as in the real runtime), else the model's own core count (a
/// model compiled with `--cores 2` needs no flag to bench).
fn cores_for(ncm: &[u8], base: &RuntimeConfig) -> u32 {
    if std::env::var_os("NEURON_LOGICAL_NC_CONFIG").is_some() {
        return base.lnc();
    }
    nrt_model::CompiledModel::core_count(ncm)
        .unwrap_or(1)
        .max(1)
}

/// Implicit async (`NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS = depth`): the client keeps
/// `depth` executions queued and waits for the oldest by reading a byte of its output, as an
/// application does (`nrt_execute`, then `nrt_tensor_read`, which waits for the execution).
/// Its CPU column is that wait's cost: for a long model the read blocks. (The client before
/// spun on its callback count, yielding every 8 polls: against it, near-null depth 8 runs at
/// 0.975× the throughput, 20 paired runs, and `encoder` depth 4 spent its whole execution
/// time, 2.2 ms, of caller CPU per execution, against ~25 µs now.)
/// `cores`: the model's NeuronCores per logical core (`NEURON_LOGICAL_NC_CONFIG`).
fn implicit_rows(label: &str, ncm: &[u8], cores: u32, depth: usize, seconds: f64) -> Res<Row> {
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
fn switch_rows(surface: &str, seconds: f64) -> Res<Row> {
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

/// A model with one MatMul `Y[M,N] = X[M,K] · W[K,N]` (W a constant), through the whole
/// device path: what the GEMM rows time.
/// The MatMul of a [`matmul_model`], with the model's constants placed in host memory
/// laid out as its plan says nothing about: A, B (the constant) and C in one buffer.
struct Standalone {
    op: nrt_isa::Op,
    mem: Vec<u64>,
}

fn model_matmul(bytes: &[u8]) -> Res<Standalone> {
    let m = nrt_model::CompiledModel::decode(bytes).map_err(|e| e.to_string())?;
    let pe = m.block(0, nrt_hal::Engine::Pe).ok_or("no PE block")?;
    let ops = nrt_isa::decode_block(&pe.code, nrt_hal::Engine::Pe).map_err(|e| e.to_string())?;
    let Some(nrt_isa::Op::MatMul(op::MatMul {
        a,
        b,
        c,
        alpha,
        flags,
        epilogue,
    })) = ops
        .into_iter()
        .map(|(_, i)| i.op)
        .find(|o| matches!(o, nrt_isa::Op::MatMul(_)))
    else {
        return Err("no MatMul".into());
    };
    let bytes = |ap: &nrt_isa::AccessPattern| ap.byte_extent().1 as u64;
    let (na, nb, nc) = (bytes(&a), bytes(&b), bytes(&c));
    let at = |x: u64| x.next_multiple_of(64);
    let (oa, ob) = (0, at(na));
    let oc = at(ob + nb);
    let mut mem = vec![0u64; (at(oc + nc) / 8) as usize];
    // SAFETY: u64 storage viewed as bytes.
    let raw =
        unsafe { core::slice::from_raw_parts_mut(mem.as_mut_ptr() as *mut u8, mem.len() * 8) };
    raw[ob as usize..(ob + nb) as usize].copy_from_slice(&m.constants[..nb as usize]);
    for (i, x) in raw[oa as usize..na as usize]
        .chunks_exact_mut(4)
        .enumerate()
    {
        x.copy_from_slice(&((i % 17) as f32 * 0.01).to_le_bytes());
    }
    let op = nrt_isa::Op::MatMul(op::MatMul {
        a: nrt_isa::AccessPattern { addr: oa, ..a },
        b: nrt_isa::AccessPattern { addr: ob, ..b },
        c: nrt_isa::AccessPattern { addr: oc, ..c },
        alpha,
        flags,
        epilogue,
    });
    Ok(Standalone { op, mem })
}

/// The first compute instruction of a compiled model's PE block, its every operand moved
/// into one host buffer (filled with small bytes: integer kernels' speed does not depend on
/// the values): what the int8 rows time alone.
fn model_op(bytes: &[u8]) -> Res<Standalone> {
    let m = nrt_model::CompiledModel::decode(bytes).map_err(|e| e.to_string())?;
    let pe = m.block(0, nrt_hal::Engine::Pe).ok_or("no PE block")?;
    let ops = nrt_isa::decode_block(&pe.code, nrt_hal::Engine::Pe).map_err(|e| e.to_string())?;
    let mut op = ops
        .into_iter()
        .map(|(_, i)| i.op)
        .find(|o| o.output().is_some())
        .ok_or("no compute instruction on PE")?;
    let mut end = 0u64;
    op.operands_mut(|o| {
        let (lo, hi) = o.ap.byte_extent();
        // `lo` is ≤ 0 only for negative strides, which these models do not have.
        let at = end.next_multiple_of(64);
        o.ap.addr = (at as i128 - lo) as u64;
        end = at + (hi - lo) as u64;
    });
    let mem = vec![0x0101_0101_0101_0101u64; (end.next_multiple_of(64) / 8) as usize];
    Ok(Standalone { op, mem })
}

/// The instruction alone (the kernel on host memory, no execution around it): what the
/// device's engine spends of the whole execution.
#[derive(Clone, Copy, Debug)]
struct KernelTime {
    /// Median time of one call, in ns.
    median_ns: f64,
    /// Mean time of a call in the best batch of consecutive calls lasting about
    /// [`PEAK_BATCH`] each, in ns — the statistic of the machine's limit ([`peak_measure`]:
    /// the best of such batches), so that the share compares like with like.
    best_batch_ns: f64,
}

/// How long one batch of the register-only limit loop runs ([`peak_measure`]), and so one
/// batch of the instruction's calls in [`KernelTime::best_batch_ns`].
const PEAK_BATCH: Duration = Duration::from_millis(30);

fn kernel_ns(s: &Standalone, seconds: f64) -> KernelTime {
    let mut mem = s.mem.clone();
    // SAFETY: the buffer outlives every call below.
    let dm = unsafe {
        nrt_kernels::DeviceMemory::new(mem.as_mut_ptr() as *mut u8, mem.len() as u64 * 8)
    };
    let mut ws = nrt_kernels::Workspace::new();
    // SAFETY: every operand lies inside the buffer, aligned (placed by `model_matmul`).
    let run = |ws: &mut nrt_kernels::Workspace| unsafe { nrt_kernels::execute(&s.op, dm, ws) };
    let _ = run(&mut ws);
    let budget = Duration::from_secs_f64((seconds / 2.0).max(0.05));
    let start = Instant::now();
    let mut times = Vec::new();
    while start.elapsed() < budget || times.len() < 5 {
        let t = Instant::now();
        let _ = run(&mut ws);
        times.push(t.elapsed().as_nanos() as f64);
    }
    // Consecutive calls in batches of about PEAK_BATCH (at least one call each).
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    let median_ns = sorted[sorted.len() / 2];
    let per_batch =
        ((PEAK_BATCH.as_nanos() as f64 / median_ns.max(1.0)).ceil() as usize).clamp(1, times.len());
    let best_batch_ns = times
        .chunks_exact(per_batch)
        .map(|b| b.iter().sum::<f64>() / b.len() as f64)
        .fold(f64::INFINITY, f64::min);
    KernelTime {
        median_ns,
        best_batch_ns: if best_batch_ns.is_finite() {
            best_batch_ns
        } else {
            median_ns
        },
    }
}

fn matmul_model(m: u32, k: u32, n: u32, bf16: bool, packed: bool) -> Vec<u8> {
    use nrt_hal::wire::{CUSTOM_SUB_ID_OUTPUT_DONE, CUSTOM_SUBTYPE_TENSOR};
    use nrt_hal::{DType, Engine};
    use nrt_isa::{AccessPattern, Instruction, Op, SemRef};
    use nrt_model::{ModelBuilder, vaddr};
    let mut b = ModelBuilder::new(&format!("matmul-{m}x{k}x{n}"), 1);
    let x = b.input("x", DType::F32, &[m, k]);
    let y = b.output("y", DType::F32, &[m, n]);
    // Packed (what `nrt compile` stores for constant weights): panels of the compiler's
    // width, the last one zero-padded (random values need no order here either).
    let nr = nrt_hal::tuning::GEMM_PACK_NR as u32;
    let kp = if bf16 { k.div_ceil(2) * 2 } else { k };
    let elems = if packed {
        n.div_ceil(nr) * nr * kp
    } else {
        k * n
    };
    let mut w = Vec::with_capacity((elems * 4) as usize);
    let mut s = 0x2545_F491u32;
    for _ in 0..elems {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        let x = (s as f32 / u32::MAX as f32 - 0.5) * 0.1;
        if bf16 {
            // Stored [N, K] as `--auto-cast` writes weights (values need no order here).
            w.extend_from_slice(&nrt_kernels::elem::f32_to_bf16(x).to_le_bytes());
        } else {
            w.extend_from_slice(&x.to_le_bytes());
        }
    }
    let wap = |addr| {
        if packed && bf16 {
            // Pairs of K side by side in each panel row.
            AccessPattern {
                addr,
                dtype: DType::Bf16,
                shape: [1, n.div_ceil(nr), kp / 2, 2 * nr],
                stride: [0, (kp * nr) as i32, 2 * nr as i32, 1],
            }
        } else if packed {
            AccessPattern {
                addr,
                dtype: DType::F32,
                shape: [1, n.div_ceil(nr), k, nr],
                stride: [0, (k * nr) as i32, nr as i32, 1],
            }
        } else if bf16 {
            AccessPattern {
                shape: [1, 1, k, n],
                stride: [0, 0, 1, k as i32],
                ..AccessPattern::dense(addr, DType::Bf16, &[k, n])
            }
        } else {
            AccessPattern::dense(addr, DType::F32, &[k, n])
        }
    };
    let wr = b.constant(&w, 64);
    let (xr, yr) = (b.io_mem_ref(x), b.io_mem_ref(y));
    let (dx, dy) = (b.io_descriptor(x), b.io_descriptor(y));
    let (inp, done) = (SemRef::local(4), SemRef::local(5));
    b.push(
        0,
        Engine::Sp,
        Instruction::new(Op::DmaDescriptors(op::DmaDescriptors {
            table: dx,
            count: 1,
        }))
        .signal(inp, 1),
    );
    b.push(
        0,
        Engine::Pe,
        Instruction::new(Op::MatMul(op::MatMul {
            a: AccessPattern::dense(vaddr(xr, 0), DType::F32, &[m, k]),
            b: wap(vaddr(wr, 0)),
            c: AccessPattern::dense(vaddr(yr, 0), DType::F32, &[m, n]),
            alpha: 1.0,
            flags: if packed {
                nrt_isa::matmul_flags::PACKED_B
            } else {
                0
            },
            epilogue: nrt_isa::Epilogue::NONE,
        }))
        .wait(inp, 1)
        .signal(done, 1),
    );
    b.push(
        0,
        Engine::Sp,
        Instruction::new(Op::DmaDescriptors(op::DmaDescriptors {
            table: dy,
            count: 1,
        }))
        .wait(done, 1),
    );
    b.push(
        0,
        Engine::Sp,
        Instruction::new(Op::Notify(op::Notify {
            subtype: CUSTOM_SUBTYPE_TENSOR,
            sub_id: CUSTOM_SUB_ID_OUTPUT_DONE,
            payload: y,
        })),
    );
    b.build().encode()
}

/// A busy-looping process competing for the CPUs (a co-tenant) for as long as it lives.
struct CoTenant(std::process::Child);

impl CoTenant {
    fn start() -> Res<CoTenant> {
        let child = std::process::Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start a co-tenant process (sh): {e}"))?;
        // Let it start spinning before the row is timed.
        std::thread::sleep(Duration::from_millis(100));
        Ok(CoTenant(child))
    }
}

impl Drop for CoTenant {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `f` (a row on a runtime of `dev`) and notes beside it the share of a vCPU that the
/// device's threads used over the row, warm-up included: a device thread spinning while its
/// caller runs the core itself (sync near-null) shows here, not in the caller's figures.
fn noting_device_threads(dev: &SoftDevice, f: impl FnOnce() -> Res<Row>) -> Res<Row> {
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

/// A sample model compiled for `cores` cores, run synchronously on a runtime of that many
/// logical cores.
fn compute_row(label: &str, onnx: &[u8], cores: u32, seconds: f64) -> Res<Row> {
    let opts = nrt_compiler::CompileOptions {
        cores,
        ..Default::default()
    };
    let c = nrt_compiler::compile(onnx, None, &opts).map_err(|e| format!("{label}: {e}"))?;
    let (d, rt) = session::runtime(Some(RuntimeConfig {
        logical_nc: cores,
        ..base_config()?
    }))?;
    let m = session::load(&rt, &c.model.encode(), 0)?;
    let before = d.thread_cpu_times();
    let mut r = sync_rows(&rt, &m, label, cores, seconds)?;
    let after = d.thread_cpu_times();
    // Includes the warm-up executions: a share, not an exact per-execution figure.
    let per: Vec<String> = before
        .iter()
        .zip(&after)
        .map(|(b, a)| fmt_ns((*a - *b).as_nanos() as f64 / r.n.max(1) as f64))
        .collect();
    r.note = format!(
        "sample model; caller {:.1}% of a vCPU; device threads' CPU/exec (incl. warm-up) {}",
        r.caller_cpu_share * 100.0,
        per.join(" + ")
    );
    Ok(r)
}

/// Two processes, one core each, running the same model synchronously at the same time
/// (each `nrt bench MODEL` on its own runtime, `NEURON_RT_VISIBLE_CORES` 0 and 1): their
/// aggregate throughput.
fn processes_row(label: &str, onnx: &[u8], seconds: f64) -> Res<Row> {
    let c = nrt_compiler::compile(onnx, None, &Default::default())
        .map_err(|e| format!("{label}: {e}"))?;
    let dir = std::env::temp_dir().join(format!("nrt-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(format!("{label}.ncm"));
    std::fs::write(&path, c.model.encode()).map_err(|e| format!("{}: {e}", path.display()))?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let children = (0..2)
        .map(|core| {
            std::process::Command::new(&exe)
                .arg("bench")
                .arg(&path)
                .args(["--json", "--seconds", &seconds.to_string()])
                .env("NEURON_RT_VISIBLE_CORES", core.to_string())
                .env("NRT_RUNTIME_DIR", dir.join("run"))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .spawn()
                .map_err(|e| format!("cannot start {}: {e}", exe.display()))
        })
        .collect::<Res<Vec<_>>>()?;
    let mut per = Vec::new();
    for child in children {
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout);
        let j: serde_json::Value = text
            .lines()
            .find_map(|l| serde_json::from_str(l).ok())
            .ok_or_else(|| format!("a {label} bench process printed no row ({})", out.status))?;
        let f = |k: &str| j.get(k).and_then(|v| v.as_f64()).unwrap_or(0.0);
        per.push((f("execs_per_s"), f("median_ns"), f("p99_ns"), f("n")));
    }
    let _ = std::fs::remove_dir_all(&dir);
    let total: f64 = per.iter().map(|p| p.0).sum();
    Ok(Row {
        model: label.into(),
        surface: "processes".into(),
        depth: 1,
        cores: 1,
        n: per.iter().map(|p| p.3 as usize).sum(),
        median_ns: per.iter().map(|p| p.1).fold(0.0, f64::max),
        p99_ns: per.iter().map(|p| p.2).fold(0.0, f64::max),
        execs_per_s: total,
        allocs_per_exec: 0.0,
        caller_cpu_ns: 0.0,
        caller_cpu_share: 0.0,
        note: format!(
            "2 processes x 1 core, aggregate ({:.0} + {:.0} execs/s); median/p99: the slower",
            per[0].0, per[1].0
        ),
    })
}

/// The machine's limit for `which`: the best of short register-only batches taken before and
/// after the GEMM rows (a co-tenant slows some batches; the best ones show the core).
fn peak_measure(which: nrt_kernels::peak::Peak) -> Option<f64> {
    nrt_kernels::peak::measure(which, PEAK_BATCH, 20)
}

fn peak_row(label: &str, g: Option<f64>) -> Row {
    Row {
        model: label.into(),
        surface: "peak".into(),
        depth: 1,
        cores: 1,
        n: 40,
        median_ns: 0.0,
        p99_ns: 0.0,
        execs_per_s: 0.0,
        allocs_per_exec: 0.0,
        caller_cpu_ns: 0.0,
        caller_cpu_share: 0.0,
        note: match g {
            Some(g) => format!("{g:.1} GFLOP/s (register-only loop, best of 40 batches)"),
            None => "not available on this CPU".into(),
        },
    }
}

/// The machine's f32 FMA and bf16 dot-product limits, then GEMM throughput through the
/// device (one MatMul per execution, GFLOP/s from the median) with f32 and bf16 weights,
/// each as a share of its limit.
fn gemm_rows(seconds: f64) -> Res<Vec<Row>> {
    use nrt_kernels::peak::Peak;
    let max = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, y) => x.or(y),
    };
    let (f32_before, bf16_before) = (peak_measure(Peak::F32Fma), peak_measure(Peak::Bf16Dot));
    let tile_before = peak_measure(Peak::Bf16Tile);
    let mut gemms = Vec::new();
    let (_d, rt) = session::runtime(Some(base_config()?))?;
    for (bf16, packed) in [(false, false), (false, true), (true, false), (true, true)] {
        for (m, k, n) in [
            (1u32, 512u32, 512u32),
            (64, 512, 512),
            (512, 512, 512),
            (128, 64, 128),
        ] {
            let model = session::load(&rt, &matmul_model(m, k, n, bf16, packed), 0)?;
            let label = format!(
                "matmul {m}x{k}x{n}{}",
                if bf16 && packed {
                    " bf16 packed"
                } else if bf16 {
                    " bf16"
                } else if packed {
                    " packed"
                } else {
                    ""
                }
            );
            let mut r = sync_rows(&rt, &model, &label, 1, seconds)?;
            r.surface = "gemm".into();
            let kernel = kernel_ns(
                &model_matmul(&matmul_model(m, k, n, bf16, packed))?,
                seconds,
            );
            gemms.push((r, 2.0 * m as f64 * k as f64 * n as f64, bf16, kernel));
            rt.unload(&model).map_err(|e| e.to_string())?;
        }
    }
    // int8: one MatMulInteger (u8 × i8 → i32, AVX-512 VNNI `vpdpbusd` where present, else
    // AVX2 `vpmaddwd`), as `nrt compile` emits it, in GOPS against the machine's limit for
    // that instruction; one row, a GEMV, bound by reading the weights.
    let (i8_before, i8_tile_before) = (peak_measure(Peak::I8Dot), peak_measure(Peak::I8Tile));
    let mut int8 = Vec::new();
    for (m, k, n) in [(1i64, 512i64, 512i64), (64, 512, 512), (512, 512, 512)] {
        let onnx = crate::samples::matmul_integer(m, k, n);
        let c = nrt_compiler::compile(&onnx, None, &nrt_compiler::CompileOptions::default())
            .map_err(|e| format!("matmul_integer: {e}"))?;
        let bytes = c.model.encode();
        let model = session::load(&rt, &bytes, 0)?;
        let mut r = sync_rows(&rt, &model, &format!("matmul {m}x{k}x{n} int8"), 1, seconds)?;
        r.surface = "gemm".into();
        let kernel = kernel_ns(&model_op(&bytes)?, seconds);
        int8.push((r, 2.0 * (m * k * n) as f64, kernel));
        rt.unload(&model).map_err(|e| e.to_string())?;
    }
    let f32_peak = max(f32_before, peak_measure(Peak::F32Fma));
    let bf16_peak = max(bf16_before, peak_measure(Peak::Bf16Dot));
    // Packed bf16 weights run on the AMX tile unit where the process may use it: those rows
    // are shares of the tile limit.
    let tile_peak = max(tile_before, peak_measure(Peak::Bf16Tile));
    let i8_peak = max(i8_before, peak_measure(Peak::I8Dot));
    // MatMulInteger runs on the AMX tile unit where the process may use it: its rows are
    // shares of that limit then.
    let i8_tile_peak = max(i8_tile_before, peak_measure(Peak::I8Tile));
    let mut rows = vec![
        peak_row("peak f32 FMA", f32_peak),
        peak_row("peak bf16 dot", bf16_peak),
        peak_row("peak bf16 tile (AMX)", tile_peak),
        Row {
            note: peak_row("", i8_peak).note.replace("GFLOP/s", "GOPS"),
            ..peak_row("peak int8 dot", i8_peak)
        },
        Row {
            note: peak_row("", i8_tile_peak).note.replace("GFLOP/s", "GOPS"),
            ..peak_row("peak int8 tile (AMX)", i8_tile_peak)
        },
    ];
    let (i8_peak, i8_which) = match i8_tile_peak {
        Some(p) => (Some(p), "int8 tile"),
        None => (i8_peak, "int8"),
    };
    for (mut r, ops, kernel) in int8 {
        let (gops, kops, bops) = (
            ops / r.median_ns,
            ops / kernel.median_ns,
            ops / kernel.best_batch_ns,
        );
        r.note = match i8_peak {
            Some(p) => format!(
                "{gops:.1} GOPS (whole execution), {:.0}% of the {i8_which} peak; the \
                 instruction alone {kops:.1}, {:.0}%; its best 30 ms batch {bops:.1}, {:.0}%",
                100.0 * gops / p,
                100.0 * kops / p,
                100.0 * bops / p,
            ),
            None => format!(
                "{gops:.1} GOPS (whole execution); the instruction alone {kops:.1}; its best \
                 30 ms batch {bops:.1}"
            ),
        };
        rows.push(r);
    }
    for (mut r, flop, bf16, kernel) in gemms {
        let gflops = flop / r.median_ns;
        let kflops = flop / kernel.median_ns;
        let bflops = flop / kernel.best_batch_ns;
        let tile = bf16 && r.model.ends_with("packed") && tile_peak.is_some();
        let (peak, which) = match (bf16, tile) {
            (true, true) => (tile_peak, "bf16 tile"),
            (true, false) => (bf16_peak, "bf16"),
            _ => (f32_peak, "f32"),
        };
        r.note = match peak {
            Some(p) => format!(
                "{gflops:.1} GFLOP/s (whole execution), {:.0}% of the {which} peak; the \
                 instruction alone {kflops:.1}, {:.0}%; its best 30 ms batch {bflops:.1}, \
                 {:.0}%",
                100.0 * gflops / p,
                100.0 * kflops / p,
                100.0 * bflops / p,
            ),
            None => format!(
                "{gflops:.1} GFLOP/s (whole execution); the instruction alone {kflops:.1}; its \
                 best 30 ms batch {bflops:.1}"
            ),
        };
        rows.push(r);
    }
    Ok(rows)
}

pub fn print_table(rows: &[Row]) {
    println!(
        "{:<22} {:<17} {:>5} {:>5} {:>12} {:>12} {:>14} {:>10} {:>12}  note",
        "model", "surface", "depth", "cores", "median", "p99", "execs/s", "allocs/ex", "caller cpu"
    );
    for r in rows {
        println!(
            "{:<22} {:<17} {:>5} {:>5} {:>12} {:>12} {:>14.0} {:>10.3} {:>12}  {}",
            r.model,
            r.surface,
            r.depth,
            r.cores,
            fmt_ns(r.median_ns),
            fmt_ns(r.p99_ns),
            r.execs_per_s,
            r.allocs_per_exec,
            fmt_ns(r.caller_cpu_ns),
            r.note
        );
    }
}

pub fn main(a: &BenchArgs) -> Res<()> {
    let seconds = a.seconds;
    let json = a.json;
    let surface = a.surface;
    let depth = a.depth;
    if a.threads > 1
        && (a.gemm
            || surface.is_some_and(|s| s != Surface::Sync)
            || (a.model.is_none() && surface.is_none()))
    {
        return Err(format!(
            "--threads {} drives the synchronous surface: use it with --surface sync or with a              model (and no other --surface)",
            a.threads
        ));
    }
    let mut rows = Vec::new();
    // Progress on stderr (drawn only on a terminal) between rows — never ticking on its own,
    // so nothing draws (or allocates) inside a row's timed window.
    let bar = indicatif::ProgressBar::new_spinner();
    let emit = |r: Row, rows: &mut Vec<Row>| {
        if json {
            println!("{}", r.json());
        }
        bar.set_message(format!(
            "{} rows; last: {} {} depth {}",
            rows.len() + 1,
            r.model,
            r.surface,
            r.depth
        ));
        rows.push(r);
    };
    if a.gemm {
        for r in gemm_rows(seconds)? {
            emit(r, &mut rows);
        }
    } else if let Some(path) = &a.model {
        let opts = session::compile_options(&a.compile)?;
        let p = session::prepare(path, &opts)?;
        let label = std::path::Path::new(path)
            .file_stem()
            .map_or("model".into(), |s| s.to_string_lossy().into_owned());
        let base = base_config()?;
        let cores = cores_for(&p.ncm, &base);
        let lnc = RuntimeConfig {
            logical_nc: cores,
            ..base
        };
        match surface.unwrap_or(Surface::Sync) {
            Surface::Sync => {
                let (_d, rt) = session::runtime(Some(lnc))?;
                let m = session::load(&rt, &p.ncm, 0)?;
                let r = if a.threads > 1 {
                    threads_rows(&rt, &m, &label, cores, a.threads.into(), seconds)?
                } else {
                    sync_rows(&rt, &m, &label, cores, seconds)?
                };
                emit(r, &mut rows);
            }
            Surface::Explicit => {
                let (_d, rt) = session::runtime(Some(lnc))?;
                let m = session::load(&rt, &p.ncm, 0)?;
                emit(
                    explicit_rows(&rt, &m, &label, depth.max(1), seconds)?,
                    &mut rows,
                );
            }
            Surface::Implicit => emit(
                implicit_rows(&label, &p.ncm, cores, depth.max(1), seconds)?,
                &mut rows,
            ),
        }
    } else if let Some(s) = surface {
        let (cores, ncm) = (a.compile.cores, near_null(a.compile.cores));
        let lnc = RuntimeConfig {
            logical_nc: cores,
            ..base_config()?
        };
        let r = match s {
            Surface::Sync => {
                let (d, rt) = session::runtime(Some(lnc))?;
                let m = session::load(&rt, &ncm, 0)?;
                if a.threads > 1 {
                    threads_rows(&rt, &m, "near-null", cores, a.threads.into(), seconds)?
                } else {
                    noting_device_threads(&d, || sync_rows(&rt, &m, "near-null", cores, seconds))?
                }
            }
            Surface::Explicit => {
                let (d, rt) = session::runtime(Some(lnc))?;
                let m = session::load(&rt, &ncm, 0)?;
                noting_device_threads(&d, || {
                    explicit_rows(&rt, &m, "near-null", depth.max(1), seconds)
                })?
            }
            Surface::Implicit => implicit_rows("near-null", &ncm, cores, depth.max(1), seconds)?,
        };
        emit(r, &mut rows);
    } else {
        emit(
            row(
                "spin-pingpong",
                "limit",
                1,
                0,
                pingpong(seconds),
                "two threads, one cache line",
            ),
            &mut rows,
        );
        emit(
            row(
                "empty-request",
                "device-only",
                1,
                1,
                device_only(seconds)?,
                "stage + doorbell + 5 END records",
            ),
            &mut rows,
        );
        {
            let (d, rt) = session::runtime(Some(base_config()?))?;
            let m = session::load(&rt, &near_null(1), 0)?;
            emit(
                noting_device_threads(&d, || sync_rows(&rt, &m, "near-null", 1, seconds))?,
                &mut rows,
            );
            let (ins, outs, _k) = session::io_tensors(&rt, &m)?;
            let mut hi = TensorSet::new();
            let mut ho = TensorSet::new();
            let x = rt
                .allocate_tensor(Placement::Host, -1, 16, "x")
                .map_err(|e| e.to_string())?;
            let y = rt
                .allocate_tensor(Placement::Host, -1, 16, "y")
                .map_err(|e| e.to_string())?;
            hi.add("x", &x);
            ho.add("y", &y);
            let _ = (ins, outs);
            let r = noting_device_threads(&d, || {
                let t = time_calls(seconds, || {
                    rt.execute(&m, &hi, &ho).map_err(|e| e.to_string())
                })?;
                Ok(row(
                    "near-null",
                    "sync-host",
                    1,
                    1,
                    t,
                    "host tensors, cloned",
                ))
            })?;
            emit(r, &mut rows);
            for depth in [1, 2, 4, 8, 16, 32] {
                emit(
                    noting_device_threads(&d, || {
                        explicit_rows(&rt, &m, "near-null", depth, seconds)
                    })?,
                    &mut rows,
                );
            }
        }
        for surface in ["sync", "explicit", "implicit"] {
            emit(switch_rows(surface, seconds)?, &mut rows);
        }
        {
            let (_d, rt) = session::runtime(Some(RuntimeConfig {
                logical_nc: 2,
                ..base_config()?
            }))?;
            let m = session::load(&rt, &near_null(2), 0)?;
            emit(sync_rows(&rt, &m, "near-null-2c", 2, seconds)?, &mut rows);
        }
        emit(
            implicit_rows("near-null", &near_null(1), 1, 8, seconds)?,
            &mut rows,
        );
        // A busy co-tenant process for the duration of these rows: sync and explicit depth 8
        // beside the quiet figures above.
        {
            let _busy = CoTenant::start()?;
            let (d, rt) = session::runtime(Some(base_config()?))?;
            let m = session::load(&rt, &near_null(1), 0)?;
            let mut r = noting_device_threads(&d, || {
                let mut r = sync_rows(&rt, &m, "near-null", 1, seconds)?;
                r.note = "one busy-looping process beside".into();
                Ok(r)
            })?;
            r.surface = "sync-cotenant".into();
            emit(r, &mut rows);
            let mut r = noting_device_threads(&d, || {
                let mut r = explicit_rows(&rt, &m, "near-null", 8, seconds)?;
                r.note = "one busy-looping process beside".into();
                Ok(r)
            })?;
            r.surface = "explicit-cotenant".into();
            emit(r, &mut rows);
        }
        // Compute: the sample models on one core and split across two (the caller's CPU
        // share is in the note), and two processes each running one core.
        let mlp_b64 = crate::samples::mlp(64, 512, 4);
        let encoder = crate::samples::transformer_block(128, 256, 4, 1024);
        for (label, onnx) in [("mlp_b64-sample", &mlp_b64), ("encoder-sample", &encoder)] {
            for cores in [1, 2] {
                emit(compute_row(label, onnx, cores, seconds)?, &mut rows);
            }
        }
        // The encoder beside a busy co-tenant process, on one core and split across two:
        // three runnable threads on two vCPUs, where a split that cannot run in parallel must
        // not cost more than one core (the device measures and serves the pair from one
        // thread then: nrt-sim's serve_mode).
        for cores in [1, 2] {
            let _busy = CoTenant::start()?;
            let mut r = compute_row("encoder-sample", &encoder, cores, seconds)?;
            r.surface = "sync-cotenant".into();
            r.note = format!("one busy-looping process beside; {}", r.note);
            emit(r, &mut rows);
        }
        emit(
            processes_row("mlp_b64-sample", &mlp_b64, seconds)?,
            &mut rows,
        );
    }
    bar.finish_and_clear();
    if !json {
        print_table(&rows);
        if let (Some(limit), Some(sync)) = (
            rows.iter().find(|r| r.surface == "limit"),
            rows.iter()
                .find(|r| r.surface == "sync" && r.model == "near-null"),
        ) {
            println!(
                "\nsync near-null round trip / spinning pingpong limit: {:.1}x",
                sync.median_ns / limit.median_ns.max(1.0)
            );
        }
        if let (Some(sync), Some(e8)) = (
            rows.iter()
                .find(|r| r.surface == "sync" && r.model == "near-null"),
            rows.iter()
                .find(|r| r.surface == "explicit" && r.depth == 8),
        ) {
            println!(
                "explicit async depth 8 / sync throughput: {:.1}x",
                e8.execs_per_s / sync.execs_per_s.max(1.0)
            );
        }
        let find = |m: &str, s: &str, d: usize, c: u32| {
            rows.iter()
                .find(|r| r.model == m && r.surface == s && r.depth == d && r.cores == c)
        };
        for (quiet, busy, d) in [
            ("sync", "sync-cotenant", 1),
            ("explicit", "explicit-cotenant", 8),
        ] {
            if let (Some(q), Some(b)) = (
                find("near-null", quiet, d, 1),
                find("near-null", busy, d, 1),
            ) {
                println!(
                    "{busy} / quiet throughput: {:.2}x",
                    b.execs_per_s / q.execs_per_s.max(1.0)
                );
            }
        }
        for m in ["mlp_b64-sample", "encoder-sample"] {
            if let (Some(one), Some(two)) = (find(m, "sync", 1, 1), find(m, "sync", 1, 2)) {
                println!(
                    "{m}: 2 cores / 1 core latency {:.2}x; caller CPU {:.1}% / {:.1}% of a vCPU",
                    two.median_ns / one.median_ns.max(1.0),
                    one.caller_cpu_share * 100.0,
                    two.caller_cpu_share * 100.0
                );
            }
        }
        if let (Some(one), Some(two)) = (
            find("encoder-sample", "sync-cotenant", 1, 1),
            find("encoder-sample", "sync-cotenant", 1, 2),
        ) {
            println!(
                "encoder-sample beside a co-tenant: 2 cores / 1 core throughput {:.2}x, p99 {:.2}x",
                two.execs_per_s / one.execs_per_s.max(1.0),
                two.p99_ns / one.p99_ns.max(1.0)
            );
        }
        if let (Some(one), Some(p)) = (
            find("mlp_b64-sample", "sync", 1, 1),
            find("mlp_b64-sample", "processes", 1, 1),
        ) {
            println!(
                "mlp_b64-sample: 2 processes / 1 process throughput {:.2}x",
                p.execs_per_s / one.execs_per_s.max(1.0)
            );
        }
    }
    Ok(())
}
