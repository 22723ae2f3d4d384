//! The subset of `onnx.proto` the compiler reads, transcribed by hand as `prost` messages.
//!
//! Field numbers follow the official `onnx/onnx.proto` (IR version 10). Fields we never read
//! are left out: protobuf decoders skip unknown fields, so models that carry them still
//! decode. Repeated scalars accept both packed and unpacked encodings (protobuf requires
//! decoders to), so files written by proto2 and proto3 producers both read.

use prost::Message;

/// `ModelProto`: the top-level file.
#[derive(Clone, PartialEq, Message)]
pub struct ModelProto {
    /// IR version.
    #[prost(int64, tag = "1")]
    pub ir_version: i64,
    /// Operator sets the graph uses.
    #[prost(message, repeated, tag = "8")]
    pub opset_import: Vec<OperatorSetIdProto>,
    /// Producer.
    #[prost(string, tag = "2")]
    pub producer_name: String,
    /// Producer version.
    #[prost(string, tag = "3")]
    pub producer_version: String,
    /// Model domain.
    #[prost(string, tag = "4")]
    pub domain: String,
    /// Model version.
    #[prost(int64, tag = "5")]
    pub model_version: i64,
    /// The graph.
    #[prost(message, optional, tag = "7")]
    pub graph: Option<GraphProto>,
}

/// `OperatorSetIdProto`.
#[derive(Clone, PartialEq, Message)]
pub struct OperatorSetIdProto {
    /// Domain (`""` or `"ai.onnx"` is the default operator set).
    #[prost(string, tag = "1")]
    pub domain: String,
    /// Version.
    #[prost(int64, tag = "2")]
    pub version: i64,
}

/// `GraphProto`.
#[derive(Clone, PartialEq, Message)]
pub struct GraphProto {
    /// Nodes, in topological order (we sort if they are not).
    #[prost(message, repeated, tag = "1")]
    pub node: Vec<NodeProto>,
    /// Graph name.
    #[prost(string, tag = "2")]
    pub name: String,
    /// Constant tensors.
    #[prost(message, repeated, tag = "5")]
    pub initializer: Vec<TensorProto>,
    /// Sparse constant tensors (rejected when present).
    #[prost(bytes = "vec", repeated, tag = "15")]
    pub sparse_initializer: Vec<Vec<u8>>,
    /// Inputs (in IR < 4 they include the initializers).
    #[prost(message, repeated, tag = "11")]
    pub input: Vec<ValueInfoProto>,
    /// Outputs.
    #[prost(message, repeated, tag = "12")]
    pub output: Vec<ValueInfoProto>,
    /// Types of intermediate values (informational).
    #[prost(message, repeated, tag = "13")]
    pub value_info: Vec<ValueInfoProto>,
}

/// `NodeProto`.
#[derive(Clone, PartialEq, Message)]
pub struct NodeProto {
    /// Input value names (`""` = optional input omitted).
    #[prost(string, repeated, tag = "1")]
    pub input: Vec<String>,
    /// Output value names (`""` = optional output omitted).
    #[prost(string, repeated, tag = "2")]
    pub output: Vec<String>,
    /// Node name (may be empty).
    #[prost(string, tag = "3")]
    pub name: String,
    /// Operator.
    #[prost(string, tag = "4")]
    pub op_type: String,
    /// Operator domain.
    #[prost(string, tag = "7")]
    pub domain: String,
    /// Attributes.
    #[prost(message, repeated, tag = "5")]
    pub attribute: Vec<AttributeProto>,
}

/// `AttributeProto.AttributeType`.
pub mod attribute_type {
    /// Not set.
    pub const UNDEFINED: i32 = 0;
    /// `f`.
    pub const FLOAT: i32 = 1;
    /// `i`.
    pub const INT: i32 = 2;
    /// `s`.
    pub const STRING: i32 = 3;
    /// `t`.
    pub const TENSOR: i32 = 4;
    /// `g`.
    pub const GRAPH: i32 = 5;
    /// `floats`.
    pub const FLOATS: i32 = 6;
    /// `ints`.
    pub const INTS: i32 = 7;
    /// `strings`.
    pub const STRINGS: i32 = 8;
}

/// `AttributeProto`.
#[derive(Clone, PartialEq, Message)]
pub struct AttributeProto {
    /// Name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Reference to a function attribute (rejected: we compile no functions).
    #[prost(string, tag = "21")]
    pub ref_attr_name: String,
    /// Type ([`attribute_type`]).
    #[prost(int32, tag = "20")]
    pub r#type: i32,
    /// Float.
    #[prost(float, tag = "2")]
    pub f: f32,
    /// Integer.
    #[prost(int64, tag = "3")]
    pub i: i64,
    /// Bytes / string.
    #[prost(bytes = "vec", tag = "4")]
    pub s: Vec<u8>,
    /// Tensor.
    #[prost(message, optional, tag = "5")]
    pub t: Option<TensorProto>,
    /// Graph (control flow; rejected).
    #[prost(bytes = "vec", optional, tag = "6")]
    pub g: Option<Vec<u8>>,
    /// Floats.
    #[prost(float, repeated, packed = "false", tag = "7")]
    pub floats: Vec<f32>,
    /// Integers.
    #[prost(int64, repeated, packed = "false", tag = "8")]
    pub ints: Vec<i64>,
    /// Strings.
    #[prost(bytes = "vec", repeated, tag = "9")]
    pub strings: Vec<Vec<u8>>,
}

/// `ValueInfoProto`.
#[derive(Clone, PartialEq, Message)]
pub struct ValueInfoProto {
    /// Name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Type.
    #[prost(message, optional, tag = "2")]
    pub r#type: Option<TypeProto>,
}

/// `TypeProto` (only the tensor alternative of its `oneof`; others decode as absent).
#[derive(Clone, PartialEq, Message)]
pub struct TypeProto {
    /// `tensor_type`.
    #[prost(message, optional, tag = "1")]
    pub tensor_type: Option<TypeProtoTensor>,
    /// `sequence_type` (present means "not a tensor": rejected).
    #[prost(bytes = "vec", optional, tag = "4")]
    pub sequence_type: Option<Vec<u8>>,
    /// `map_type` (rejected).
    #[prost(bytes = "vec", optional, tag = "5")]
    pub map_type: Option<Vec<u8>>,
    /// `optional_type` (rejected).
    #[prost(bytes = "vec", optional, tag = "9")]
    pub optional_type: Option<Vec<u8>>,
}

/// `TypeProto.Tensor`.
#[derive(Clone, PartialEq, Message)]
pub struct TypeProtoTensor {
    /// `TensorProto.DataType`.
    #[prost(int32, tag = "1")]
    pub elem_type: i32,
    /// Shape (absent: unknown rank).
    #[prost(message, optional, tag = "2")]
    pub shape: Option<TensorShapeProto>,
}

/// `TensorShapeProto`.
#[derive(Clone, PartialEq, Message)]
pub struct TensorShapeProto {
    /// Dimensions.
    #[prost(message, repeated, tag = "1")]
    pub dim: Vec<Dimension>,
}

/// `TensorShapeProto.Dimension` (its `oneof` as two optional fields).
#[derive(Clone, PartialEq, Message)]
pub struct Dimension {
    /// A fixed size.
    #[prost(int64, optional, tag = "1")]
    pub dim_value: Option<i64>,
    /// A symbolic size.
    #[prost(string, optional, tag = "2")]
    pub dim_param: Option<String>,
}

/// `TensorProto.DataType`.
pub mod data_type {
    /// float32.
    pub const FLOAT: i32 = 1;
    /// uint8.
    pub const UINT8: i32 = 2;
    /// int8.
    pub const INT8: i32 = 3;
    /// uint16.
    pub const UINT16: i32 = 4;
    /// int16.
    pub const INT16: i32 = 5;
    /// int32.
    pub const INT32: i32 = 6;
    /// int64.
    pub const INT64: i32 = 7;
    /// string.
    pub const STRING: i32 = 8;
    /// bool.
    pub const BOOL: i32 = 9;
    /// float16.
    pub const FLOAT16: i32 = 10;
    /// float64.
    pub const DOUBLE: i32 = 11;
    /// uint32.
    pub const UINT32: i32 = 12;
    /// uint64.
    pub const UINT64: i32 = 13;
    /// bfloat16.
    pub const BFLOAT16: i32 = 16;
}

/// `TensorProto`.
#[derive(Clone, PartialEq, Message)]
pub struct TensorProto {
    /// Shape.
    #[prost(int64, repeated, packed = "false", tag = "1")]
    pub dims: Vec<i64>,
    /// [`data_type`].
    #[prost(int32, tag = "2")]
    pub data_type: i32,
    /// float data.
    #[prost(float, repeated, tag = "4")]
    pub float_data: Vec<f32>,
    /// int32/int16/int8/uint16/uint8/bool/float16/bfloat16 data.
    #[prost(int32, repeated, tag = "5")]
    pub int32_data: Vec<i32>,
    /// string data (rejected).
    #[prost(bytes = "vec", repeated, tag = "6")]
    pub string_data: Vec<Vec<u8>>,
    /// int64 data.
    #[prost(int64, repeated, tag = "7")]
    pub int64_data: Vec<i64>,
    /// Name.
    #[prost(string, tag = "8")]
    pub name: String,
    /// Raw little-endian data.
    #[prost(bytes = "vec", tag = "9")]
    pub raw_data: Vec<u8>,
    /// double data.
    #[prost(double, repeated, tag = "10")]
    pub double_data: Vec<f64>,
    /// uint32/uint64 data.
    #[prost(uint64, repeated, tag = "11")]
    pub uint64_data: Vec<u64>,
    /// Where external data lives (`location`, `offset`, `length`).
    #[prost(message, repeated, tag = "13")]
    pub external_data: Vec<StringStringEntryProto>,
    /// 0 = inline, 1 = external.
    #[prost(int32, tag = "14")]
    pub data_location: i32,
}

/// `StringStringEntryProto`.
#[derive(Clone, PartialEq, Message)]
pub struct StringStringEntryProto {
    /// Key.
    #[prost(string, tag = "1")]
    pub key: String,
    /// Value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// Decodes a model file image.
pub fn decode_model(bytes: &[u8]) -> Result<ModelProto, prost::DecodeError> {
    ModelProto::decode(bytes)
}

/// Encodes a model (tests build their models with it).
pub fn encode_model(m: &ModelProto) -> Vec<u8> {
    m.encode_to_vec()
}
