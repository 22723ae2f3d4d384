//! Writes the built-in near-null model as an NCM file (a fuzzing seed, a smoke-test input):
//!
//!     cargo run -p nrt-runtime --example near_null -- OUT.ncm [CORES]

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(out), cores) = (args.next(), args.next()) else {
        eprintln!("usage: near_null OUT.ncm [CORES]");
        std::process::exit(2);
    };
    let cores: u32 = match cores.as_deref().unwrap_or("1").parse() {
        Ok(c @ 1..=2) => c,
        _ => {
            eprintln!("near_null: CORES must be 1 or 2");
            std::process::exit(2);
        }
    };
    if let Err(e) = std::fs::write(&out, nrt_runtime::builtin::near_null(cores)) {
        eprintln!("near_null: writing {out}: {e}");
        std::process::exit(1);
    }
}
