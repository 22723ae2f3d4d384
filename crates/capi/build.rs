//! Gives the shared library the SONAME C programs link against, `libnrt.so.1`, and makes
//! sure a `libnrt.so.1 -> libnrt.so` link sits next to where cargo puts `libnrt.so`
//! (`target/<profile>/` and `target/<profile>/deps/`), so a program linked with `-lnrt`
//! finds its SONAME after a plain `cargo build -p nrt-capi`. The link may dangle until the
//! library is built; it is made once and never changes. (`scripts/build-capi.sh` does the
//! same explicitly.)

use std::path::Path;

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnrt.so.1");
    println!("cargo:rerun-if-changed=build.rs");
    // OUT_DIR = <target>/[<triple>/]<profile>/build/nrt-capi-<hash>/out
    if let Some(profile_dir) = std::env::var_os("OUT_DIR")
        .as_deref()
        .map(Path::new)
        .and_then(|p| p.ancestors().nth(3))
    {
        for dir in [profile_dir.to_path_buf(), profile_dir.join("deps")] {
            let link = dir.join("libnrt.so.1");
            if std::fs::symlink_metadata(&link).is_err() && dir.is_dir() {
                // Best effort: a failure only means the caller must make the link itself.
                let _ = std::os::unix::fs::symlink("libnrt.so", &link);
            }
        }
    }
}
