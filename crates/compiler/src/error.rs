//! Compile errors: a class, the node they concern (name and op type) when there is one, and
//! a message saying what was wrong.

use core::fmt;

/// What kind of problem stopped the compilation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The file is not a readable ONNX model (truncated, corrupt, not protobuf).
    Decode,
    /// An operator (or operator domain / opset) the compiler does not support.
    UnsupportedOp,
    /// An attribute with a value the operator (or the compiler) does not accept.
    BadAttribute,
    /// An element type the compiler does not support for this use.
    UnsupportedDType,
    /// Shapes that do not agree.
    ShapeMismatch,
    /// A value nobody produces (or a cycle).
    DanglingEdge,
    /// A declared shape that is invalid (negative, unbound symbolic dimension, …).
    BadShape,
    /// A problem with the caller's options (unknown input name, wrong tensor, …).
    BadOption,
    /// Reading a file (the model, its external data) failed.
    Io,
    /// A size past what the device's instructions can address.
    TooLarge,
    /// A bug in the compiler (an invariant did not hold).
    Internal,
}

impl ErrorKind {
    /// A short lower-case name (`"unsupported op"`, …).
    pub const fn name(self) -> &'static str {
        match self {
            ErrorKind::Decode => "decode error",
            ErrorKind::UnsupportedOp => "unsupported op",
            ErrorKind::BadAttribute => "bad attribute",
            ErrorKind::UnsupportedDType => "unsupported dtype",
            ErrorKind::ShapeMismatch => "shape mismatch",
            ErrorKind::DanglingEdge => "dangling edge",
            ErrorKind::BadShape => "bad shape",
            ErrorKind::BadOption => "bad option",
            ErrorKind::Io => "i/o error",
            ErrorKind::TooLarge => "too large",
            ErrorKind::Internal => "internal compiler error",
        }
    }

    /// Whether the error means "the compiler lacks a feature" rather than "the model is
    /// wrong" (conformance runners report these as UNSUPPORTED).
    pub const fn is_unsupported(self) -> bool {
        matches!(
            self,
            ErrorKind::UnsupportedOp | ErrorKind::UnsupportedDType | ErrorKind::TooLarge
        )
    }
}

/// The node an error concerns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRef {
    /// Node name (may be empty in the model; then its first output's name is used).
    pub name: String,
    /// Operator type.
    pub op_type: String,
}

/// A compile error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompileError {
    /// The class of problem.
    pub kind: ErrorKind,
    /// The node, if the problem is in one.
    pub node: Option<NodeRef>,
    /// What was wrong.
    pub message: String,
    /// When the problem is that a value must be known at compile time and is not: the
    /// graph inputs it depends on (found by walking its producers back), in model order.
    /// Giving their values (`CompileOptions::input_values`) specializes the model on them;
    /// `nrt conformance` and `nrt run` do that when they hold the values. Empty otherwise.
    pub needs_inputs: Vec<String>,
    /// When the problem is that an input's shape is not fully known (a symbolic or `-1`
    /// dimension and no shape given): that input. Its shape goes in
    /// `CompileOptions::input_shapes`; a front end adds how its users give it (the CLI's
    /// flags, Python's keyword). (A boxed str: the error stays small enough to return.)
    pub needs_shape_of: Option<Box<str>>,
}

impl CompileError {
    /// An error not tied to a node.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        CompileError {
            kind,
            node: None,
            message: message.into(),
            needs_inputs: Vec::new(),
            needs_shape_of: None,
        }
    }

    /// Records the graph inputs the value this error is about depends on
    /// ([`CompileError::needs_inputs`]).
    pub fn needing(mut self, inputs: Vec<String>) -> Self {
        self.needs_inputs = inputs;
        self
    }

    /// Records the input whose shape must be given ([`CompileError::needs_shape_of`]).
    pub fn needing_shape_of(mut self, input: &str) -> Self {
        self.needs_shape_of = Some(input.into());
        self
    }

    /// Attaches the node (keeps an already attached one).
    pub fn at_node(mut self, name: &str, op_type: &str) -> Self {
        if self.node.is_none() {
            self.node = Some(NodeRef {
                name: name.to_owned(),
                op_type: op_type.to_owned(),
            });
        }
        self
    }
}

impl fmt::Display for CompileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.kind.name())?;
        if let Some(n) = &self.node {
            write!(f, "node '{}' ({}): ", n.name, n.op_type)?;
        }
        f.write_str(&self.message)?;
        if !self.needs_inputs.is_empty() {
            write!(
                f,
                " (it depends on the graph input(s) {}: give their values (input_values) to specialize the model on them)",
                self.needs_inputs.join(", ")
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for CompileError {}

/// Result of the compiler's functions.
pub type Result<T, E = CompileError> = core::result::Result<T, E>;

/// Shorthand constructors.
pub(crate) fn err<T>(kind: ErrorKind, message: impl Into<String>) -> Result<T> {
    Err(CompileError::new(kind, message))
}
