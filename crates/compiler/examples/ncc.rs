//! Compiles an ONNX file and prints the plan report: `ncc MODEL.onnx [--cores N] [-o OUT.ncm]`.

use nrt_compiler::{CompileOptions, check::check_ordering, compile_file};
use std::path::PathBuf;

fn main() {
    let mut args = std::env::args().skip(1);
    let mut opts = CompileOptions::default();
    let mut input = None;
    let mut out: Option<PathBuf> = None;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--cores" => opts.cores = args.next().and_then(|v| v.parse().ok()).unwrap_or(1),
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
