//! The operator table: every ONNX operator the compiler supports is one [`OpDef`] —
//! name, first opset, shape inference, constant folding, element-type rule, lowering — that
//! its family's file registers (`r.op("LRN", 1, infer_lrn).device(lower!(lower_lrn))`, the way tract
//! registers ops; `.folds(fold_x)` adds its host computation on constants). Shape inference
//! ([`crate::infer`]), folding ([`crate::eval`]), the device type check and lowering
//! ([`crate::lower`]) are lookups in this one table, and [`supported_report`] lists it.
//! Adding an operator is one `r.op(…)` line and its functions in one family file.

/// `lower!(lower_x)`: the lowering `|l, at| l.lower_x(at)` of a registration, as a
/// [`LowerFn`] (a method of `impl<'a> Lowerer<'a>` is not itself one: its lifetime is the
/// impl's, not higher-ranked).
macro_rules! lower {
    ($f:ident) => {
        |l, at| l.$f(at)
    };
}

mod attention;
mod bitwise;
mod blockq;
mod cached_attention;
mod composite;
mod constant;
mod control;
mod conv;
mod deform;
mod dynshape;
mod einsum;
mod elementwise;
mod flex_attention;
mod gather;
mod grid;
mod layout;
mod linear_attention;
mod loss;
mod matmul;
mod norm;
mod pool;
mod quant;
mod reduce;
mod resize;
mod rnn;
mod roi;
mod sample;
mod spectral;
mod unary;

pub(crate) use sample::DOMAIN as SAMPLE_DOMAIN;

use crate::error::{ErrorKind, Result};
use crate::lower::{At, Lowerer};
use crate::params::{Ctx, Out, require_float};
use crate::tensor::HostTensor;
use nrt_hal::DType;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::OnceLock;

/// Shape and type inference of a node (constant outputs when the operator always folds).
pub(crate) type InferFn = fn(&Ctx) -> Result<Vec<Out>>;
/// Lowering of a node to engine instructions.
pub(crate) type LowerFn = for<'a> fn(&mut Lowerer<'a>, At<'a>) -> Result<()>;
/// Constant folding of a node whose inputs are all constants: its outputs' values, computed
/// on the host (`outs`: its inferred outputs), or `None` when the hook does not compute this
/// case (an element type, a rank) and the device computes the node instead.
pub(crate) type FoldFn = fn(&Ctx, &[Out]) -> Result<Option<Vec<HostTensor>>>;
/// Replaces node `ni` of the graph by the nodes that define the operator (inferred next),
/// for operators ONNX defines as a function of others (`Attention`).
pub(crate) type ExpandFn = fn(&mut crate::graph::Graph, usize) -> Result<()>;

/// How an operator is computed at compile time.
#[derive(Clone, Copy)]
pub(crate) enum Fold {
    /// On the host by its folding hook ([`OpDef::folds`]) when all inputs are constants; an
    /// operator without one (or whose hook declines) is computed on the device.
    Host,
    /// Never: always on the device.
    Never,
    /// Only: a model where the inputs are not constants is unsupported.
    Only,
}

/// Element types the device computes an operator in (checked on input 0 of nodes that are
/// not folded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dtypes {
    /// Whatever inference accepts.
    Any,
    /// f32 only.
    Float,
    /// f32, i32, i64 (reductions).
    Reduce,
    /// Not u64 or bool: narrower integers and halves are widened to i64 / f32 around the
    /// operation; u64 would not survive the round trip.
    Elementwise,
}

/// One operator.
pub(crate) struct OpDef {
    pub name: &'static str,
    /// The first ONNX opset (default domain) of the operator; every later one is accepted.
    pub since: u16,
    pub infer: InferFn,
    pub fold: Fold,
    /// Its host computation on constant inputs (see [`Fold::Host`]).
    pub folds: Option<FoldFn>,
    pub dtypes: Dtypes,
    /// `None`: computed at compile time only.
    pub lower: Option<LowerFn>,
    /// Decomposed into other operators before inference (then `infer` and `lower` are
    /// never reached).
    pub expand: Option<ExpandFn>,
    /// Decomposed only when this holds of the node (`None`: always).
    pub expand_when: Option<fn(&crate::graph::Graph, &crate::graph::Node) -> bool>,
    /// Inlined as the nodes of its subgraphs before inference (`If`, `Scan`, `Loop`: see
    /// [`crate::graph`]): what runs on the device is theirs.
    pub inlined: bool,
    /// Limits worth listing in the report.
    pub notes: &'static str,
}

impl OpDef {
    /// Sets how the operator folds (default [`Fold::Host`]).
    pub fn fold(&mut self, f: Fold) -> &mut Self {
        self.fold = f;
        self
    }

    /// Sets its host computation on constant inputs ([`FoldFn`]), beside its lowering.
    pub fn folds(&mut self, f: FoldFn) -> &mut Self {
        self.folds = Some(f);
        self
    }

    /// Sets its device element-type rule (default [`Dtypes::Any`]).
    pub fn dtypes(&mut self, d: Dtypes) -> &mut Self {
        self.dtypes = d;
        self
    }

    /// f32 only and never folded: a floating-point kernel that always runs on the device.
    pub fn f32_on_device(&mut self) -> &mut Self {
        self.dtypes(Dtypes::Float).fold(Fold::Never)
    }

    /// Inlined as its subgraphs' nodes before inference ([`OpDef::inlined`]).
    pub fn inlined(&mut self) -> &mut Self {
        self.inlined = true;
        self
    }

    /// Sets its lowering.
    pub fn device(&mut self, f: LowerFn) -> &mut Self {
        self.lower = Some(f);
        self
    }

    /// Makes it decompose into other operators ([`ExpandFn`]).
    pub fn expands(&mut self, f: ExpandFn) -> &mut Self {
        self.expand = Some(f);
        self
    }

    /// Makes it decompose into other operators when `when` holds of the node (a mode the
    /// kernel does not compute), and lower on its own otherwise.
    pub fn expands_when(
        &mut self,
        when: fn(&crate::graph::Graph, &crate::graph::Node) -> bool,
        f: ExpandFn,
    ) -> &mut Self {
        self.expand_when = Some(when);
        self.expands(f)
    }

    /// Sets the notes of the report.
    pub fn note(&mut self, s: &'static str) -> &mut Self {
        self.notes = s;
        self
    }

    /// Rejects element types the device cannot compute for this operator.
    pub(crate) fn check_device_dtypes(&self, c: &Ctx) -> Result<()> {
        let Some(x) = c.opt(0) else {
            return Ok(());
        };
        let ok = match self.dtypes {
            Dtypes::Any => true,
            Dtypes::Float => return require_float(c, x),
            Dtypes::Reduce => matches!(x.dtype, DType::F32 | DType::I32 | DType::I64),
            Dtypes::Elementwise => !matches!(x.dtype, DType::U64 | DType::Bool),
        };
        if ok {
            return Ok(());
        }
        let what = if self.dtypes == Dtypes::Reduce {
            "reductions compute f32, i32 and i64"
        } else {
            "the device computes f32, i32 and i64"
        };
        Err(c.e(
            ErrorKind::UnsupportedDType,
            format!("input '{}' is {}; {what}", x.name, x.dtype),
        ))
    }
}

/// The table.
pub(crate) struct Registry {
    ops: HashMap<&'static str, OpDef>,
}

impl Registry {
    /// Registers operator `name` (opset `since` and later) with its shape inference;
    /// folded on constants when it has a hook, any element type, no lowering until set.
    pub fn op(&mut self, name: &'static str, since: u16, infer: InferFn) -> &mut OpDef {
        assert!(!self.ops.contains_key(name), "{name} registered twice");
        self.ops.entry(name).or_insert(OpDef {
            name,
            since,
            infer,
            fold: Fold::Host,
            folds: None,
            dtypes: Dtypes::Any,
            lower: None,
            expand: None,
            expand_when: None,
            inlined: false,
            notes: "",
        })
    }
}

/// The operator table, built once.
pub(crate) fn registry() -> &'static Registry {
    static REG: OnceLock<Registry> = OnceLock::new();
    REG.get_or_init(|| {
        let mut r = Registry {
            ops: HashMap::new(),
        };
        attention::register(&mut r);
        bitwise::register(&mut r);
        composite::register(&mut r);
        constant::register(&mut r);
        control::register(&mut r);
        conv::register(&mut r);
        deform::register(&mut r);
        dynshape::register(&mut r);
        einsum::register(&mut r);
        elementwise::register(&mut r);
        flex_attention::register(&mut r);
        gather::register(&mut r);
        grid::register(&mut r);
        layout::register(&mut r);
        linear_attention::register(&mut r);
        loss::register(&mut r);
        matmul::register(&mut r);
        norm::register(&mut r);
        pool::register(&mut r);
        quant::register(&mut r);
        reduce::register(&mut r);
        resize::register(&mut r);
        rnn::register(&mut r);
        roi::register(&mut r);
        sample::register(&mut r);
        blockq::register(&mut r);
        cached_attention::register(&mut r);
        spectral::register(&mut r);
        unary::register(&mut r);
        r
    })
}

/// The definition of operator `op`, if supported.
pub(crate) fn get(op: &str) -> Option<&'static OpDef> {
    registry().ops.get(op)
}

/// Every supported operator, sorted by name.
fn sorted() -> Vec<&'static OpDef> {
    let mut v: Vec<&OpDef> = registry().ops.values().collect();
    v.sort_by_key(|d| d.name);
    v
}

/// Operators the compiler supports (on the device, or folded at compile time), sorted.
pub fn supported_ops() -> Vec<&'static str> {
    sorted().into_iter().map(|d| d.name).collect()
}

/// Operators computed only at compile time: a model where their inputs are not constants
/// is rejected as unsupported.
pub fn fold_only_ops() -> Vec<&'static str> {
    sorted()
        .into_iter()
        .filter(|d| matches!(d.fold, Fold::Only))
        .map(|d| d.name)
        .collect()
}

/// One row of the conformance report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpInfo {
    pub name: &'static str,
    /// First ONNX opset; every later one is accepted.
    pub since: u16,
    /// Where it runs: `device`, `compile time` (always folded) or `compile time only`.
    pub runs: &'static str,
    /// Element types on the device.
    pub dtypes: &'static str,
    pub notes: &'static str,
}

/// The supported operators, from the table: name, opset range, where they run, notes.
pub fn supported_report() -> Vec<OpInfo> {
    sorted()
        .into_iter()
        .map(|d| OpInfo {
            name: d.name,
            since: d.since,
            runs: match (d.lower.is_some(), d.fold) {
                _ if d.expand.is_some() && d.expand_when.is_none() => "device (decomposed)",
                _ if d.inlined => "device (inlined)",
                (_, Fold::Only) => "compile time only",
                (false, _) => "compile time",
                (true, _) => "device",
            },
            dtypes: match d.dtypes {
                Dtypes::Any => "any",
                Dtypes::Float => "f32",
                Dtypes::Reduce => "f32, i32, i64",
                Dtypes::Elementwise => "all but u64, bool",
            },
            notes: d.notes,
        })
        .collect()
}

/// What stays unsupported by decision (out of scope), with the reason: operator or type,
/// and why.
pub const OUT_OF_SCOPE: &[(&str, &str)] = &[
    (
        "ImageDecoder",
        "decodes encoded image bytes (JPEG, PNG, …): not a computation on numeric tensors",
    ),
    (
        "string operators (StringNormalizer, StringConcat, StringSplit, RegexFullMatch, \
         TfIdfVectorizer, LabelEncoder …) and string tensors",
        "the device holds numeric tensors only",
    ),
    (
        "sequence and optional operators (SequenceConstruct, SequenceAt, SplitToSequence, \
         ConcatFromSequence, Optional, OptionalGetElement, OptionalHasElement …)",
        "sequence and optional values are not tensors",
    ),
    (
        "the `ai.onnx.ml` domain",
        "classical-ML operators (trees, encoders, scalers) outside the default domain",
    ),
    (
        "the `ai.onnx.preview.training` domain",
        "training operators (gradients, optimizers); this is an inference runtime",
    ),
    (
        "float8, float4, int4, int2 element types (Cast, QuantizeLinear, DequantizeLinear \
         … on them)",
        "sub-byte and 8-bit float storage formats the device does not hold",
    ),
    (
        "the `ai.onnx.preview` domain but FlexAttention",
        "experimental operators outside the default domain",
    ),
    (
        "Bernoulli, RandomUniform(Like), RandomNormal(Like), Multinomial",
        "their output depends on a random generator (no reference output to match)",
    ),
    (
        "Dropout with `training_mode` = 1 and `ratio` > 0",
        "its output depends on a random generator (with ratio 0 it is supported)",
    ),
];

/// Why operator `op` is unsupported by decision ([`OUT_OF_SCOPE`]), when it is.
pub fn out_of_scope_reason(op: &str) -> Option<&'static str> {
    let sequence = op.starts_with("Sequence")
        || op.starts_with("Optional")
        || matches!(op, "SplitToSequence" | "ConcatFromSequence");
    let string = matches!(
        op,
        "StringNormalizer"
            | "StringConcat"
            | "StringSplit"
            | "RegexFullMatch"
            | "TfIdfVectorizer"
            | "LabelEncoder"
    );
    let ml = matches!(
        op,
        "TreeEnsemble"
            | "TreeEnsembleClassifier"
            | "TreeEnsembleRegressor"
            | "Binarizer"
            | "ArrayFeatureExtractor"
            | "LinearClassifier"
            | "LinearRegressor"
            | "Normalizer"
            | "OneHotEncoder"
            | "Scaler"
            | "SVMClassifier"
            | "SVMRegressor"
            | "ZipMap"
            | "Imputer"
            | "CategoryMapper"
            | "DictVectorizer"
            | "FeatureVectorizer"
    );
    let training = matches!(op, "Adam" | "Adagrad" | "Momentum" | "Gradient");
    let random = matches!(
        op,
        "Bernoulli"
            | "RandomUniform"
            | "RandomUniformLike"
            | "RandomNormal"
            | "RandomNormalLike"
            | "Multinomial"
    );
    if sequence {
        Some("out of scope: sequence and optional values are not tensors")
    } else if ml {
        Some("out of scope: a classical-ML operator of the ai.onnx.ml domain")
    } else if training {
        Some("out of scope: a training operator of the ai.onnx.preview.training domain")
    } else if random {
        Some("its output depends on a random generator: no reference output to match")
    } else if string {
        Some("out of scope: the device holds numeric tensors only")
    } else if op == "ImageDecoder" {
        Some("out of scope: decodes encoded image bytes, not a computation on numeric tensors")
    } else {
        None
    }
}

/// [`supported_report`] as the Markdown of `docs/supported-ops.md`.
pub fn supported_markdown() -> String {
    let rows = supported_report();
    let mut s = String::from(
        "# Supported ONNX operators\n\n\
         Generated from the compiler's operator table (`crates/compiler/src/ops/`):\n\
         `NRT_BLESS=1 cargo test -p nrt-compiler --test supported_ops` rewrites it, and\n\
         the test fails when it is stale. Do not edit by hand.\n\n\
         Device types: the engines compute f32 (and i32/i64 where listed); \
         float16, bfloat16 and double tensors go through f32 \
         (`crates/compiler/src/widen.rs`): an `f32` operator accepts them too.\n\n",
    );
    let _ = writeln!(s, "{} operators (default domain).\n", rows.len());
    s.push_str("| operator | opsets | runs | device types | notes |\n");
    s.push_str("| --- | --- | --- | --- | --- |\n");
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {}+ | {} | {} | {} |",
            r.name, r.since, r.runs, r.dtypes, r.notes
        );
    }
    s.push_str("\n## Unsupported by decision\n\n");
    s.push_str(
        "Out of scope by the project's decisions (the compiler rejects them, naming the node):\n\n",
    );
    s.push_str("| operator or type | reason |\n| --- | --- |\n");
    for (what, why) in OUT_OF_SCOPE {
        let _ = writeln!(s, "| {what} | {why} |");
    }
    s
}
