//! Compiles an ONNX file and prints the plan report:
//! `ncc MODEL.onnx [--cores N] [--dump] [-o OUT.ncm]` (`--dump` lists every instruction).

use nrt_compiler::{CompileOptions, check::check_ordering, compile_file};
use nrt_isa::op;
use std::path::PathBuf;

fn main() {
    let mut args = std::env::args().skip(1);
    let mut opts = CompileOptions::default();
    let mut input = None;
    let mut out: Option<PathBuf> = None;
    let mut dump = false;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--cores" => opts.cores = args.next().and_then(|v| v.parse().ok()).unwrap_or(1),
            "--dump" => dump = true,
            "-o" => out = args.next().map(PathBuf::from),
            _ => input = Some(PathBuf::from(a)),
        }
    }
    let Some(input) = input else {
        eprintln!("usage: ncc MODEL.onnx [--cores N] [-o OUT.ncm]");
        std::process::exit(2);
    };
    match compile_file(&input, &opts) {
        Ok(c) => {
            print!("{}", c.report);
            if dump {
                for b in &c.model.blocks {
                    println!("core {} {:?}:", b.core, b.engine);
                    match nrt_isa::decode_block(&b.code, b.engine) {
                        Ok(instrs) => {
                            for (_, ins) in instrs {
                                println!("  {}", brief(&ins.op));
                            }
                        }
                        Err(e) => println!("  undecodable: {e:?}"),
                    }
                }
            }
            match check_ordering(&c.model) {
                Ok(()) => println!("ordering: ok"),
                Err(e) => println!("ordering: {e}"),
            }
            if let Some(o) = out {
                std::fs::write(&o, c.model.encode()).expect("write");
            }
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}

/// One line per instruction: mnemonic and operand shapes/strides.
fn brief(op: &nrt_isa::Op) -> String {
    let mut s = format!("{:<12}", op.name());
    let mut op = *op;
    nrt_compiler::schedule::for_each_ap_mut(&mut op, |ap, w| {
        s.push_str(&format!(
            " {}{:?}/{:?}",
            if w { "w" } else { "r" },
            ap.shape,
            ap.stride
        ));
    });
    match op {
        nrt_isa::Op::Activation(op::Activation { func, scale, .. }) => {
            s.push_str(&format!(" {func:?} scale={scale}"))
        }
        nrt_isa::Op::MatMul(op::MatMul { alpha, flags, .. }) => {
            s.push_str(&format!(" alpha={alpha} flags={flags}"))
        }
        nrt_isa::Op::Binary(op::Binary { op, .. }) => s.push_str(&format!(" {op:?}")),
        nrt_isa::Op::TensorScalar(op::TensorScalar { op, scalar, .. }) => {
            s.push_str(&format!(" {op:?} {scalar}"))
        }
        _ => {}
    }
    s
}
