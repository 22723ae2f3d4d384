//! `Sample` (domain `ai.nrt`, the project's own operator): one token per row of logits on the
//! device — greedy, or temperature with top-k and top-p — as one POOL instruction
//! (`Op::Sample`, NCM 1.10, `kernels/src/sample.rs`). A decoder LLM's programs end with it,
//! so only token ids (and their log-probabilities) leave the device, never the logits.
//!
//! Inputs: `logits` f32 `[B, V]`, then per row `temperature` f32 `[B]`, `top_k` i64 `[B]`
//! (0: all), `top_p` f32 `[B]` (1: all), `seed` i64 `[B]`, `step` i64 `[B]` (the counter of
//! the draw). Outputs: `token` i64 `[B]`, `logprob` f32 `[B]`.

use super::{Fold, Registry};
use crate::error::{ErrorKind, Result};
use crate::lower::view::dense_ap;
use crate::lower::{At, Lowerer};
use crate::params::{Ctx, Out, out};
use nrt_hal::{DType, Engine};
use nrt_isa::{Op, op};

/// The operator's domain.
pub(crate) const DOMAIN: &str = "ai.nrt";

pub(super) fn register(r: &mut Registry) {
    r.op("Sample", 1, infer_sample)
        .fold(Fold::Never)
        .note("domain ai.nrt: greedy / temperature, top-k, top-p with a counter-based draw of (seed, step); f32 logits [B, V]")
        .device(lower!(lower_sample));
}

fn infer_sample(c: &Ctx) -> Result<Vec<Out>> {
    let logits = c.input(0)?;
    let [b, _v] = logits.shape[..] else {
        return Err(c.mismatch(format!(
            "logits of shape {:?}; Sample takes [batch, vocabulary]",
            logits.shape
        )));
    };
    if logits.dtype != DType::F32 {
        return Err(c.e(
            ErrorKind::UnsupportedDType,
            format!("logits of type {}", logits.dtype),
        ));
    }
    let per_row = [
        ("temperature", DType::F32),
        ("top_k", DType::I64),
        ("top_p", DType::F32),
        ("seed", DType::I64),
        ("step", DType::I64),
    ];
    for (i, (name, dt)) in per_row.into_iter().enumerate() {
        let t = c.input(i + 1)?;
        if t.shape != [b] || t.dtype != dt {
            return Err(c.mismatch(format!(
                "{name} is {} {:?}; expected {dt} [{b}]",
                t.dtype, t.shape
            )));
        }
    }
    Ok(vec![out(DType::I64, vec![b]), out(DType::F32, vec![b])])
}

impl<'a> Lowerer<'a> {
    pub(crate) fn lower_sample(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, o0, .. } = at;
        let lv = c.input(0)?;
        let (b, v) = (lv.shape[0], lv.shape[1]);
        let logits = self.input_view(n, 0)?;
        let mut rows = Vec::with_capacity(5);
        for i in 1..=5 {
            rows.push(self.input_view(n, i)?);
        }
        let token = self.alloc(o0);
        let logprob = match n.outputs.get(1).copied().flatten() {
            Some(o) => self.alloc(o),
            None => crate::lower::View::dense(self.temp(b * 4), DType::F32, &[b]),
        };
        if b == 0 || v == 0 {
            return Ok(());
        }
        let row = |x: &crate::lower::View| dense_ap(x.addr, x.dtype, &[b, 1]);
        self.emit(
            0,
            Engine::Pool,
            Op::Sample(op::Sample {
                logits: dense_ap(logits.addr, DType::F32, &[b, v])?,
                temperature: row(&rows[0])?,
                top_k: row(&rows[1])?,
                top_p: row(&rows[2])?,
                seed: row(&rows[3])?,
                step: row(&rows[4])?,
                token: row(&token)?,
                logprob: row(&logprob)?,
            }),
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::eval::testing::{Arg, out_types, var};
    use nrt_hal::DType;

    fn rows(b: usize, top_k: DType) -> Vec<Option<Arg>> {
        let (f, i) = (var(DType::F32, &[b]), var(DType::I64, &[b]));
        vec![
            var(DType::F32, &[b, 10]),
            f.clone(),
            var(top_k, &[b]),
            f,
            i.clone(),
            i,
        ]
    }

    #[test]
    fn sample_gives_a_token_and_logprob_per_row() {
        let t = out_types("Sample", 1, rows(3, DType::I64), vec![], 2).unwrap();
        assert_eq!(t, vec![(DType::I64, vec![3]), (DType::F32, vec![3])]);
        let e = out_types("Sample", 1, rows(3, DType::I32), vec![], 2).unwrap_err();
        assert!(
            e.message.contains("top_k is i32 [3]; expected i64 [3]"),
            "{e}"
        );
    }
}
