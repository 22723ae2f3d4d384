//! Control flow: `If`, `Scan` and `Loop` are inlined as their subgraphs' nodes before
//! inference ([`crate::graph::inline_if`], [`crate::graph::inline_scan`],
//! [`crate::graph::inline_loop`]), so none reaches inference or lowering itself. `If` whose
//! condition is known at compile time takes its branch; one whose condition is computed at
//! run time keeps both, predicated on the device (`Op::Guard`), and selects each output.
//! `Scan` is unrolled over its compile-time sequence length (opset 8's batched form per
//! batch entry). `Loop` whose trip count and condition are known at compile time is unrolled
//! one iteration at a time, each inferred before the next is decided; one whose trip count
//! or condition is computed at run time is an error naming the node and that input (and the
//! graph inputs it depends on, so a caller holding their values can specialize the model on
//! them).

use super::Registry;
use crate::error::{ErrorKind, Result};
use crate::params::{Ctx, Out};

pub(super) fn register(r: &mut Registry) {
    r.op("If", 1, infer_if).inlined().note(
        "condition known at compile time: folded to its branch; computed at run time: both branches predicated on the device (the one not taken moves no data), outputs selected; both must give each output one static shape",
    );
    r.op("Scan", 8, infer_if)
        .inlined()
        .note("unrolled over the sequence (at most 4096 steps; opset 8: per batch entry, full sequence_lens)");
    r.op("Loop", 1, infer_if).inlined().note(
        "trip count and condition known at compile time: unrolled (at most 4096 iterations); tensors only",
    );
}

/// Never reached: inference inlines every `If`, `Scan` and `Loop` first.
fn infer_if(c: &Ctx) -> Result<Vec<Out>> {
    Err(c.e(
        ErrorKind::Internal,
        format!("{} reached inference without being inlined", c.n.op),
    ))
}

#[cfg(test)]
mod tests {
    use crate::error::ErrorKind;
    use crate::eval::testing::{ctx, one_node, var};
    use nrt_hal::DType;

    #[test]
    fn control_flow_is_inlined_never_inferred() {
        for op in ["If", "Scan", "Loop"] {
            let def = crate::ops::get(op).expect("registered");
            assert!(def.inlined && def.lower.is_none(), "{op}");
            let g = one_node(op, 17, vec![var(DType::Bool, &[])], vec![], 1);
            let c = ctx(&g);
            let e = super::infer_if(&c).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Internal, "{e}");
            assert!(e.message.starts_with(op), "{e}");
        }
    }
}
