//! Gives the shared library the SONAME C programs link against: `libnrt.so.1`.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnrt.so.1");
    println!("cargo:rerun-if-changed=build.rs");
}
