//! `nrt` — compile, run, inspect, trace, benchmark and conformance-test models on the
//! software NeuronCore. Run `nrt help` for the commands (the command line is declared with
//! clap in `args.rs`).

mod args;
mod bench;
mod conformance;
mod environment;
mod hostview;
mod http;
mod llm;
mod llm_quality;
mod npy;
mod procfs;
mod samples;
mod serve;
mod session;
mod tools;
mod top;

use args::{
    Cli, Command, CompileArgs, DemoArgs, IdleArgs, InspectArgs, RunArgs, SamplesArgs, TraceArgs,
};
use clap::{CommandFactory, Parser};
use nrt_isa::op;
use nrt_runtime::{Stage, TensorInfo};
use session::{Res, fmt_ns, percentiles};
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counts heap allocations so `nrt bench` can report allocations per execution.
struct CountingAllocator;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// Heap allocations since the process started.
pub fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

fn main() {
    // Like any Unix filter: `nrt inspect m.ncm | head` ends quietly when the pipe closes
    // (Rust ignores SIGPIPE by default, and printing then panics).
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    // Under the name of a real Neuron tool (a link made by `nrt install-tools`), as that tool.
    let cli = Cli::parse_from(tools::as_nrt_command_line(std::env::args_os().collect()));
    let name = cli.command.name();
    let code = match dispatch(cli.command) {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) => {
            eprintln!("nrt {name}: {e}");
            2
        }
    };
    std::process::exit(code);
}

impl Command {
    /// The subcommand's name, for error messages.
    fn name(&self) -> &'static str {
        match self {
            Command::Demo(_) => "demo",
            Command::Compile(_) => "compile",
            Command::Run(_) => "run",
            Command::Inspect(_) => "inspect",
            Command::Trace(_) => "trace",
            Command::Bench(_) => "bench",
            Command::Conformance(_) => "conformance",
            Command::Idle(_) => "idle",
            Command::Samples(_) => "samples",
            Command::Ls(_) => "ls",
            Command::Monitor(_) => "monitor",
            Command::Top(_) => "top",
            Command::InstallTools(_) => "install-tools",
            Command::Llm(_) => "llm",
            Command::Completions { .. } => "completions",
        }
    }
}

fn dispatch(cmd: Command) -> Res<bool> {
    match cmd {
        Command::Demo(a) => demo(&a).map(|_| true),
        Command::Compile(a) => compile(&a).map(|_| true),
        Command::Run(a) => run(&a).map(|_| true),
        Command::Inspect(a) => inspect(&a).map(|_| true),
        Command::Trace(a) => trace(&a).map(|_| true),
        Command::Bench(a) => bench::main(&a).map(|_| true),
        Command::Conformance(a) => conformance::main(&a),
        Command::Samples(a) => write_samples(&a).map(|_| true),
        Command::Idle(a) => idle(&a).map(|_| true),
        Command::Ls(a) => hostview::ls(&a).map(|_| true),
        Command::Monitor(a) => hostview::monitor(&a).map(|_| true),
        Command::Top(a) => top::main(&a).map(|_| true),
        Command::InstallTools(a) => tools::install(&a).map(|_| true),
        Command::Llm(a) => llm::main(&a).map(|_| true),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "nrt", &mut std::io::stdout());
            Ok(true)
        }
    }
}

/// CPU time (user + system) the whole process has used.
pub(crate) fn cpu_time() -> std::time::Duration {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a rusage into the pointer we pass; RUSAGE_SELF is valid.
    let ru = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr());
        ru.assume_init()
    };
    let tv = |t: libc::timeval| std::time::Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn idle(a: &IdleArgs) -> Res<()> {
    let seconds = a.seconds;
    let (dev, rt) = session::runtime(None)?;
    let m = session::load(&rt, &nrt_runtime::builtin::near_null(1), 0)?;
    let (ins, outs, _k) = session::io_tensors(&rt, &m)?;
    rt.execute(&m, &ins, &outs).map_err(|e| e.to_string())?;
    // Let the device thread's and the workers' spin windows pass.
    std::thread::sleep(std::time::Duration::from_millis(50));
    let (c0, t0) = (cpu_time(), std::time::Instant::now());
    std::thread::sleep(std::time::Duration::from_secs_f64(seconds));
    let (c1, t1) = (cpu_time(), std::time::Instant::now());
    let cpu = (c1 - c0).as_secs_f64();
    let wall = (t1 - t0).as_secs_f64();
    println!(
        "idle for {wall:.2} s with a runtime loaded: {:.3} ms of CPU ({:.3}% of one vCPU); device thread parked: {}",
        cpu * 1e3,
        100.0 * cpu / wall,
        dev.is_parked()
    );
    Ok(())
}

fn write_samples(a: &SamplesArgs) -> Res<()> {
    for (name, bytes) in samples::all() {
        let dir = a.out.join(name);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        std::fs::write(dir.join("model.onnx"), bytes)
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        println!("{}", dir.join("model.onnx").display());
    }
    Ok(())
}

fn compile(a: &CompileArgs) -> Res<()> {
    let (input, out) = (&a.model, &a.output);
    let opts = session::compile_options(&a.compile)?;
    let c = session::compile_with_progress(input, &opts)?;
    std::fs::write(out, session::image(&c.model)?).map_err(|e| format!("writing {out}: {e}"))?;
    println!("compiled {input} -> {out}");
    print!("{}", c.report);
    Ok(())
}

fn describe(info: &[TensorInfo]) {
    for t in info {
        println!(
            "  {:?} {:<24} {} {:?} ({} bytes)",
            t.usage, t.name, t.dtype, t.shape, t.size
        );
    }
}

fn run(a: &RunArgs) -> Res<()> {
    let path = &a.model;
    // Inputs given as files fix the shapes of symbolic or -1 dimensions (an explicit
    // --input-shape wins).
    let mut files = std::collections::BTreeMap::new();
    for s in &a.input {
        let (n, f) = args::name_value(s, "--input")?;
        let h = if f.ends_with(".npy") {
            npy::read(Path::new(&f))?
        } else {
            nrt_compiler::read_tensor_pb(Path::new(&f))
                .map_err(|e| format!("{f}: {e}"))?
                .1
        };
        files.insert(n, (f, h));
    }
    let mut opts = session::compile_options(&a.compile)?;
    let mut from_files = Vec::new();
    for (n, (f, h)) in &files {
        if !opts.input_shapes.contains_key(n) {
            opts.input_shapes.insert(n.clone(), h.shape.clone());
            from_files.push(format!("{n}={f} {:?}", h.shape));
        }
    }
    let with_shapes = |e: String| {
        if from_files.is_empty() {
            e
        } else {
            format!(
                "{e} (input shapes taken from --input {})",
                from_files.join(", ")
            )
        }
    };
    // A model that needs some values at compile time (a Range's bounds, a Loop's trip
    // count, a Reshape's shape computed from inputs) is specialized on the inputs the
    // compiler names, when --input gave them.
    let p = if path.ends_with(".onnx") {
        let values = files
            .iter()
            .map(|(n, (_, h))| (n.clone(), h.clone()))
            .collect();
        let (c, bound) =
            session::compile_specializing(path, &mut opts, &values).map_err(with_shapes)?;
        if !bound.is_empty() {
            eprintln!(
                "specialized the model on the values of input(s) {}: the compiler needs them at compile time; \
                 the compiled model takes the other inputs only",
                bound.join(", ")
            );
            for n in &bound {
                files.remove(n);
            }
        }
        session::Prepared {
            ncm: session::image(&c.model)?,
            report: Some(c.report),
        }
    } else {
        a.compile.refuse_for_compiled(path)?;
        session::prepare(path, &opts).map_err(with_shapes)?
    };
    let (_dev, rt) = session::runtime_for(&p.ncm)?;
    let m = session::load(&rt, &p.ncm, -1)?;
    let (ins, outs, all) = session::io_tensors(&rt, &m)?;
    // Every file checked against the model's inputs before anything is written or printed.
    let inputs: Vec<&TensorInfo> = all
        .iter()
        .map(|(i, _)| i)
        .filter(|i| i.usage == nrt_model::Usage::Input)
        .collect();
    if let Some(n) = files.keys().find(|n| !inputs.iter().any(|i| &i.name == *n)) {
        return Err(format!(
            "--input {n}: the model has no input named '{n}'; its inputs: {}",
            session::describe_inputs(&inputs)
        ));
    }
    let mut given = std::collections::BTreeMap::new();
    for (n, (f, h)) in files {
        let info = inputs.iter().find(|i| i.name == n).expect("checked above");
        given.insert(n, session::input_file_bytes(&f, &h, info)?);
    }
    let seed = a.seed;
    for (i, (info, t)) in all.iter().enumerate() {
        if info.usage != nrt_model::Usage::Input {
            continue;
        }
        let bytes = match given.remove(&info.name) {
            Some(b) => b,
            None => {
                println!(
                    "input '{}': random values (seed {})",
                    info.name,
                    seed + i as u64
                );
                session::random_bytes(info, seed + i as u64)
            }
        };
        t.write(&bytes, 0).map_err(|e| e.to_string())?;
    }
    rt.execute(&m, &ins, &outs).map_err(|e| e.to_string())?;
    // An output whose extent depends on the data is shown (and written) trimmed to its
    // actual shape; its `<name>:shape` companion is not shown on its own.
    for (info, t) in all.iter().filter(|(i, _)| {
        i.usage == nrt_model::Usage::Output && !session::is_shape_companion(&all, &i.name)
    }) {
        // One host copy of the output (its device bytes): the first elements are shown
        // from it and the `.pb` written straight from it (a 1.6 GB output took 10.9 GB of
        // memory through host tensors and their encodings; now 4.7 GB, /usr/bin/time).
        let (shape, bytes) = session::read_output_bytes(&all, info, t)?;
        let size = info.dtype.size().max(1);
        let n = bytes.len() / size;
        let shown = n.min(8);
        let head =
            session::from_device_bytes_shaped(info.dtype, vec![shown], &bytes[..shown * size])?;
        let head: Vec<String> = (0..shown)
            .map(|i| format!("{:.5}", head.get_f64(i)))
            .collect();
        println!(
            "output '{}' {:?}: [{}{}]",
            info.name,
            shape,
            head.join(", "),
            if n > 8 { ", ..." } else { "" }
        );
        if let Some(dir) = &a.output_dir {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let f = dir.join(format!("{}.pb", info.name));
            nrt_compiler::write_tensor_pb_raw(&f, &info.name, info.dtype, &shape, &bytes)
                .map_err(|e| e.to_string())?;
            println!("  written to {}", f.display());
            if a.npy {
                let f = dir.join(format!("{}.npy", info.name));
                let h = session::from_device_bytes_shaped(info.dtype, shape, &bytes)?;
                npy::write(&f, &h)?;
                println!("  written to {}", f.display());
            }
        }
    }
    Ok(())
}

fn inspect(a: &InspectArgs) -> Res<()> {
    let path = &a.model;
    if !path.ends_with(".onnx") {
        a.compile.refuse_for_compiled(path)?;
    }
    let p = session::prepare(path, &session::compile_options(&a.compile)?)?;
    let m = nrt_model::CompiledModel::decode(&p.ncm).map_err(|e| e.to_string())?;
    println!(
        "model '{}' ({}), {} core(s), {} bytes",
        m.name,
        m.producer,
        m.sg_count,
        p.ncm.len()
    );
    println!("I/O:");
    for (i, t) in m.io.iter().enumerate() {
        println!(
            "  var {i}: {:?} {:<24} {} {:?}",
            t.usage, t.name, t.dtype, t.shape
        );
    }
    println!(
        "plan ({} entries, arena {} bytes, constants {} bytes):",
        m.mem_refs.len(),
        m.scratch_bytes(),
        m.constants.len()
    );
    for (i, r) in m.mem_refs.iter().enumerate() {
        println!(
            "  [{i}] {:<20} size {:>10} align {:>5} offset {}",
            r.kind.name(),
            r.size,
            r.align,
            r.offset
        );
    }
    println!("blocks:");
    for b in &m.blocks {
        let n = nrt_isa::decode_block(&b.code, b.engine)
            .map(|v| v.len() - 1)
            .unwrap_or(0);
        println!(
            "  core {} {:<4} {:>5} instructions {:>7} bytes {:>4} relocations",
            b.core,
            b.engine.name(),
            n,
            b.code.len(),
            b.relocations.len()
        );
    }
    print_epilogues(&m);
    if let Some(r) = p.report {
        print!("{r}");
    }
    Ok(())
}

/// The MatMuls that carry a fused epilogue, one line each: what the PE engine computes on
/// each output tile besides the product.
fn print_epilogues(m: &nrt_model::CompiledModel) {
    let mut lines = Vec::new();
    let (mut matmuls, mut cast) = (0usize, std::collections::BTreeMap::new());
    let mut packed = 0usize;
    let (mut int_products, mut int_packed) = (0usize, 0usize);
    for b in &m.blocks {
        let Ok(ops) = nrt_isa::decode_block(&b.code, b.engine) else {
            continue;
        };
        for (i, (_, ins)) in ops.iter().enumerate() {
            if let nrt_isa::Op::Conv(op::Conv {
                output,
                bias,
                act: (func, ..),
                ..
            }) = &ins.op
                && *func != nrt_isa::ActFunc::Identity
            {
                lines.push(format!(
                    "  core {} {} #{i}: Conv -> {:?}{} + {func:?}",
                    b.core,
                    b.engine.name(),
                    output.shape,
                    if bias.is_some() { " + bias" } else { "" },
                ));
                continue;
            }
            if let nrt_isa::Op::MatMulInteger(op::MatMulInteger {
                b: wb,
                c,
                packed_b,
                scale,
                ..
            }) = &ins.op
            {
                int_products += 1;
                int_packed += *packed_b as usize;
                if scale.is_some() {
                    lines.push(format!(
                        "  core {} {} #{i}: MatMulInteger ({} weights) -> {:?} f32 + scale",
                        b.core,
                        b.engine.name(),
                        wb.dtype,
                        c.shape
                    ));
                }
                continue;
            }
            let nrt_isa::Op::MatMul(op::MatMul {
                b: wb,
                c,
                alpha,
                flags,
                epilogue: e,
                ..
            }) = &ins.op
            else {
                continue;
            };
            matmuls += 1;
            if flags & nrt_isa::matmul_flags::PACKED_B != 0 {
                packed += 1;
            }
            if wb.dtype != nrt_hal::DType::F32 {
                *cast.entry(wb.dtype.to_string()).or_insert(0usize) += 1;
            }
            if e.is_none() {
                continue;
            }
            let mut what = Vec::new();
            if *alpha != 1.0 {
                what.push(format!("scale {alpha}"));
            }
            if let Some(x) = &e.bias {
                what.push(format!("bias (strides {:?})", x.stride));
            }
            if let Some(x) = &e.residual {
                what.push(format!("residual (strides {:?})", x.stride));
            }
            if e.func != nrt_isa::ActFunc::Identity {
                what.push(format!("{:?}", e.func));
            }
            lines.push(format!(
                "  core {} {} #{i}: MatMul -> {:?} + {}",
                b.core,
                b.engine.name(),
                c.shape,
                what.join(" + ")
            ));
        }
    }
    // The cast policy is recorded in the producer string by `nrt compile --auto-cast`.
    let policy = m
        .producer
        .split("; ")
        .find_map(|p| p.strip_prefix("auto-cast "))
        .unwrap_or("none");
    let weights: Vec<String> = cast
        .iter()
        .map(|(d, n)| format!("{n} with {d} weights"))
        .collect();
    println!(
        "auto-cast: {policy} ({matmuls} MatMuls{}{})",
        if weights.is_empty() { "" } else { ", " },
        weights.join(", ")
    );
    println!("packed weights: {packed} of {matmuls} MatMuls read B packed in panels");
    if int_products > 0 {
        println!(
            "integer products: {int_packed} of {int_products} MatMulIntegers read constant B packed"
        );
    }
    if !lines.is_empty() {
        println!("fused epilogues ({}):", lines.len());
        for l in lines {
            println!("{l}");
        }
    }
}

/// A stage's name; a device engine's is marked as such.
fn stage_label(s: Stage) -> String {
    if s.is_pipeline() {
        s.name().to_owned()
    } else {
        format!("device {}", s.name())
    }
}

/// Per-stage medians of the traced executions, then per device engine (core 0).
fn stage_summary(spans: &[nrt_runtime::Span]) -> Vec<(Stage, f64, f64)> {
    let engines = (0..nrt_hal::NUM_ENGINES as u8).map(|engine| Stage::Engine { core: 0, engine });
    Stage::ALL
        .iter()
        .copied()
        .chain(engines)
        .filter(|&s| spans.iter().any(|x| x.stage == s))
        .map(|s| {
            let mut v: Vec<u64> = spans
                .iter()
                .filter(|x| x.stage == s)
                .map(|x| x.end_ns - x.start_ns)
                .collect();
            let (med, p99) = percentiles(&mut v);
            (s, med, p99)
        })
        .collect()
}

fn trace(a: &TraceArgs) -> Res<()> {
    let path = &a.model;
    let out = &a.output;
    let n = a.executions;
    // `near-null` is the built-in model of `nrt bench`: the stages of the pure overhead path.
    if !path.ends_with(".onnx") {
        a.compile.refuse_for_compiled(path)?;
    }
    let ncm = if path == "near-null" {
        nrt_runtime::builtin::near_null(1)
    } else {
        session::prepare(path, &session::compile_options(&a.compile)?)?.ncm
    };
    let (dev, rt) = session::runtime_for(&ncm)?;
    let m = session::load(&rt, &ncm, -1)?;
    let (ins, outs, _all) = session::io_tensors(&rt, &m)?;
    if a.instructions {
        // Room for every instruction of every execution, up to a bound on the memory.
        let per_core = ncm_instructions(&ncm)
            .saturating_mul(n)
            .min(TRACE_INSTRUCTIONS_PER_CORE_MAX);
        dev.record_instructions(per_core)
            .map_err(|e| format!("--instructions: {e}"))?;
    }
    rt.set_tracing(true);
    for _ in 0..n {
        rt.execute(&m, &ins, &outs).map_err(|e| e.to_string())?;
    }
    let spans = rt.trace_spans();
    let zero = rt.trace_device_epoch_ns().unwrap_or(0);
    let instructions: Vec<nrt_runtime::InstructionSpan> = dev
        .instruction_events()
        .into_iter()
        .map(|e| nrt_runtime::InstructionSpan {
            core: e.core.min(u8::MAX as u32) as u8,
            engine: e.engine.index() as u8,
            exec_idx: e.exec_idx,
            pc: e.pc,
            op: e.op,
            start_ns: e.start_ns.saturating_sub(zero),
            end_ns: e.end_ns.saturating_sub(zero),
        })
        .collect();
    let json =
        nrt_runtime::chrome_json_with_instructions(&spans, &[(m.id(), m.name())], &instructions);
    std::fs::write(out, json).map_err(|e| format!("writing {out}: {e}"))?;
    println!(
        "{} executions, {} spans{} -> {out} (open in https://ui.perfetto.dev or chrome://tracing)",
        n,
        spans.len(),
        if a.instructions {
            format!(", {} instructions", instructions.len())
        } else {
            String::new()
        }
    );
    for (s, med, p99) in stage_summary(&spans) {
        println!(
            "  {:<11} median {:>10}  p99 {:>10}",
            stage_label(s),
            fmt_ns(med),
            fmt_ns(p99)
        );
    }
    if a.instructions {
        print_instruction_summary(&instructions, n);
    }
    Ok(())
}

/// The most instruction events `nrt trace --instructions` keeps per core (~48 MiB).
const TRACE_INSTRUCTIONS_PER_CORE_MAX: usize = 1 << 20;

/// Instructions in a compiled model's blocks (all cores and engines), decoded from its NCM;
/// a bound for the timeline's room, so an unreadable count is a generous guess.
fn ncm_instructions(ncm: &[u8]) -> usize {
    nrt_model::CompiledModel::decode(ncm)
        .map(|m| {
            m.blocks
                .iter()
                .map(|b| nrt_isa::decode_block(&b.code, b.engine).map_or(4096, |v| v.len()))
                .sum::<usize>()
        })
        .unwrap_or(4096)
        .max(1)
}

/// Where the device time went, by opcode: total, share, count, and the mean per execution.
fn print_instruction_summary(instructions: &[nrt_runtime::InstructionSpan], executions: usize) {
    let mut by_op: Vec<(&str, u64, usize)> = Vec::new();
    for i in instructions {
        let d = i.end_ns.saturating_sub(i.start_ns);
        match by_op.iter_mut().find(|(op, _, _)| *op == i.op) {
            Some(e) => {
                e.1 += d;
                e.2 += 1;
            }
            None => by_op.push((i.op, d, 1)),
        }
    }
    by_op.sort_by_key(|e| std::cmp::Reverse(e.1));
    let total: u64 = by_op.iter().map(|e| e.1).sum();
    println!("device time by opcode (all cores and engines, summed):");
    for (op, ns, count) in by_op {
        println!(
            "  {op:<20} {:>10} per execution  {:>5.1}%  {count} instructions",
            fmt_ns(ns as f64 / executions.max(1) as f64),
            100.0 * ns as f64 / total.max(1) as f64
        );
    }
}

fn demo(a: &DemoArgs) -> Res<()> {
    let seconds = a.seconds;
    let (name, onnx) = if a.cnn {
        ("small CNN (1x3x32x32 -> 10 classes)", samples::small_cnn())
    } else {
        (
            "transformer encoder block (seq 32, hidden 128, 4 heads, FFN 512)",
            samples::transformer_block(32, 128, 4, 512),
        )
    };
    println!(
        "== nrt-rs demo: {name}, built as ONNX by the project's own code ({} bytes)",
        onnx.len()
    );
    let compiled = nrt_compiler::compile(&onnx, None, &nrt_compiler::CompileOptions::default())
        .map_err(|e| e.to_string())?;
    println!(
        "\n== compiled to NCM ({} bytes); memory plan:",
        compiled.model.encode().len()
    );
    print!("{}", compiled.report);
    let (_dev, rt) = session::runtime(None)?;
    let m = session::load(&rt, &compiled.model.encode(), -1)?;
    println!(
        "\n== loaded on the software NeuronCore (vnc {}); I/O:",
        m.vnc()
    );
    describe(&m.tensor_info());
    let (ins, outs, all) = session::io_tensors(&rt, &m)?;
    for (i, (info, t)) in all.iter().enumerate() {
        if info.usage == nrt_model::Usage::Input {
            t.write(&session::random_bytes(info, 42 + i as u64), 0)
                .map_err(|e| e.to_string())?;
        }
    }
    rt.execute(&m, &ins, &outs).map_err(|e| e.to_string())?;
    println!("\n== outputs:");
    for (info, t) in all
        .iter()
        .filter(|(i, _)| i.usage == nrt_model::Usage::Output)
    {
        let mut b = vec![0u8; info.size as usize];
        t.read(&mut b, 0).map_err(|e| e.to_string())?;
        let h = session::from_device_bytes(info, &b)?;
        let v: Vec<f64> = (0..h.len()).map(|i| h.get_f64(i)).collect();
        let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
        let head: Vec<String> = v.iter().take(6).map(|x| format!("{x:+.5}")).collect();
        println!(
            "  {} {:?}: [{}, ...] mean {mean:+.6}",
            info.name,
            info.shape,
            head.join(", ")
        );
    }
    rt.set_tracing(true);
    let end = std::time::Instant::now() + std::time::Duration::from_secs_f64(seconds);
    let mut n = 0usize;
    while std::time::Instant::now() < end || n < 20 {
        rt.execute(&m, &ins, &outs).map_err(|e| e.to_string())?;
        n += 1;
    }
    let spans = rt.trace_spans();
    println!("\n== per-stage latency over {n} executions (median / p99):");
    let mut total = 0.0;
    for (s, med, p99) in stage_summary(&spans) {
        if s.is_pipeline() {
            total += med; // engine spans run inside the harvest
        }
        println!(
            "  {:<11} {:>10} / {:>10}",
            stage_label(s),
            fmt_ns(med),
            fmt_ns(p99)
        );
    }
    println!("  {:<9} {:>10}", "sum", fmt_ns(total));
    let c = rt.switch_counters();
    println!(
        "\n  model switches (reload-config): {}; steady-state core-executions: {}",
        c.model_switches, c.steady
    );
    println!("\n{DEMO_GLOSSARY}");
    Ok(())
}

/// What the demo's words mean, and where to go next (printed last).
const DEMO_GLOSSARY: &str = "== the words above:
  NCM: the compiled model file; lowered: ONNX nodes turned into engine instructions (folded: computed at compile time); arena: the one scratch buffer every intermediate tensor is packed into
  PE, ACT, POOL, DVE, SP: a NeuronCore's engines (matrix multiply, activations, pooling and gathers, vector, sync); validate, bind, stage, doorbell, harvest: the host's steps of one execution (harvest: reading the device's completions)
  reload-config: a core switched from one model to another (a model switch); steady-state: executions of the model already on the core
next: nrt samples --out models && nrt run models/mlp/model.onnx; nrt inspect models/mlp/model.onnx; nrt bench; nrt --help";
