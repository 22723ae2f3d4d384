//! Helpers of the end-to-end compile tests: compiling a model that must compile (checked,
//! round-tripped and ordered), and one that must fail with a given error kind and node.

use nrt_compiler::check::check_ordering;
use nrt_compiler::{CompileOptions, Compiled, ErrorKind, compile};
use nrt_model::CompiledModel;

pub fn ok(bytes: &[u8], opts: &CompileOptions) -> Compiled {
    let c = compile(bytes, None, opts).unwrap_or_else(|e| panic!("{e}"));
    let back = CompiledModel::decode(&c.model.encode()).expect("round trip");
    assert_eq!(back, c.model);
    check_ordering(&c.model).unwrap_or_else(|e| panic!("ordering: {e}"));
    c
}

pub fn fails(bytes: &[u8], kind: ErrorKind, node: Option<&str>) -> String {
    let e = compile(bytes, None, &CompileOptions::default()).expect_err("should fail");
    assert_eq!(e.kind, kind, "{e}");
    if let Some(n) = node {
        let r = e.node.as_ref().unwrap_or_else(|| panic!("no node in {e}"));
        assert_eq!(r.name, n, "{e}");
        assert!(e.to_string().contains(n));
    }
    e.to_string()
}
