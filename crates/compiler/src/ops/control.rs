//! Control flow. `If` whose condition is known at compile time (a constant, a folded shape
//! comparison, an input given with `input_values`) is replaced before inference by the
//! nodes of the branch it takes ([`crate::graph::inline_if`]); nothing of it reaches the
//! device. One whose condition is computed at run time is an error naming the node.
//! `Scan` is unrolled over its compile-time sequence length the same way (opset 8's batched
//! form per batch entry)
//! ([`crate::graph::inline_scan`]). `Loop` whose trip count and condition are known at
//! compile time is unrolled the same way, one iteration at a time, each inferred before the
//! next is decided ([`crate::graph::inline_loop`]); one whose trip count or condition is
//! computed at run time is an error naming the node and that input (and the graph inputs it
//! depends on, so a caller holding their values can specialize the model on them).

use super::Registry;
use crate::error::{ErrorKind, Result};
use crate::params::{Ctx, Out};

pub(super) fn register(r: &mut Registry) {
    r.op("If", 1, infer_if)
        .note("condition known at compile time: folded to its branch");
    r.op("Scan", 8, infer_if)
        .note("unrolled over the sequence (at most 4096 steps; opset 8: per batch entry, full sequence_lens)");
    r.op("Loop", 1, infer_if).note(
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
