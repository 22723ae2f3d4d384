//! `docs/supported-ops.md` is generated from the compiler's operator table: this test fails
//! when the committed file is stale, and rewrites it with `NRT_BLESS=1`.

#[test]
fn supported_ops_doc_matches_the_operator_table() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/supported-ops.md");
    let want = nrt_compiler::ops::supported_markdown();
    if std::env::var_os("NRT_BLESS").is_some() {
        std::fs::write(path, &want).expect("writing docs/supported-ops.md");
        return;
    }
    let have = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        have == want,
        "docs/supported-ops.md is stale: NRT_BLESS=1 cargo test -p nrt-compiler --test supported_ops"
    );
}

#[test]
fn the_table_and_the_public_lists_agree() {
    let report = nrt_compiler::supported_report();
    assert_eq!(report.len(), nrt_compiler::SUPPORTED_OPS.len());
    for r in &report {
        assert!(r.since >= 1, "{}", r.name);
        assert_eq!(
            r.runs == "compile time only",
            nrt_compiler::FOLD_ONLY_OPS.contains(&r.name),
            "{}",
            r.name
        );
    }
    assert_eq!(
        nrt_compiler::first_unsupported_op(&["Add".into(), "NoSuchOp".into()]),
        Some("NoSuchOp")
    );
}
