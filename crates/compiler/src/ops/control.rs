//! Control flow. `If` whose condition is known at compile time (a constant, a folded shape
//! comparison, an input given with `input_values`) is replaced before inference by the
//! nodes of the branch it takes ([`crate::graph::inline_if`]); nothing of it reaches the
//! device. One whose condition is computed at run time is an error naming the node.
//! `Scan` (opset 9+) is unrolled over its compile-time sequence length the same way
//! ([`crate::graph::inline_scan`]). `Loop` is not supported.

use super::Registry;
use crate::error::{ErrorKind, Result};
use crate::params::{Ctx, Out};

pub(super) fn register(r: &mut Registry) {
    r.op("If", 1, infer_if)
        .note("condition known at compile time: folded to its branch");
    r.op("Scan", 9, infer_if)
        .note("unrolled over the sequence (at most 4096 steps)");
}

/// Never reached: inference inlines every `If` and `Scan` first.
fn infer_if(c: &Ctx) -> Result<Vec<Out>> {
    Err(c.e(
        ErrorKind::Internal,
        format!("{} reached inference without being inlined", c.n.op),
    ))
}
