//! The GGUF reader: header, metadata, tensor infos, tensor data (versions 2 and 3).
//!
//! GGUF is llama.cpp's single-file model format. All numbers are little-endian:
//!
//! ```text
//! magic "GGUF" | version u32 | tensor_count u64 | kv_count u64
//! kv_count × { key: string, value_type u32, value }
//! tensor_count × { name: string, n_dims u32, ne[n_dims] u64, ggml_type u32, offset u64 }
//! padding to `general.alignment` (default 32)
//! tensor data: each tensor at data_start + offset (offset a multiple of the alignment)
//! ```
//!
//! A string is a u64 byte length and UTF-8 bytes; an array is an element type u32, a u64
//! count and the elements (arrays of arrays are allowed). `ne[0]` is the innermost dimension
//! (a matrix of `ne = [cols, rows]` is `rows` rows of `cols` values, each row a whole number of
//! quantization blocks).
//!
//! The file is hostile input. Every count, length and offset read from it is checked against
//! the bytes that remain (or the file's length) with checked arithmetic before anything is
//! allocated, every allocation it sizes is a fallible `try_reserve`, and every problem is a
//! [`GgufError`] naming the byte offset and the culprit (the key, the tensor, the field). The
//! parser never panics; a property test mutates real headers to hold it to that.
//!
//! Version 1 (32-bit counts) and big-endian files are refused with an error saying so.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::quant::GgmlType;

/// The four bytes every GGUF file starts with.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// The data section's alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The most dimensions a tensor has (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;
/// How deeply arrays of arrays may nest (the format allows any depth; real files use one).
pub const MAX_ARRAY_DEPTH: usize = 8;

/// What was wrong with a GGUF file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GgufErrorKind {
    /// The file ends before the field.
    Truncated {
        /// Bytes the field needs.
        needed: u64,
        /// Bytes left.
        available: u64,
    },
    /// The first four bytes are not `GGUF`.
    BadMagic([u8; 4]),
    /// A version other than 2 or 3 (or a big-endian file).
    UnsupportedVersion(u32),
    /// A string that is not UTF-8.
    NotUtf8,
    /// A metadata value type outside the format's 13.
    BadValueType(u32),
    /// Arrays nested deeper than [`MAX_ARRAY_DEPTH`].
    TooDeep,
    /// A key (or tensor name) that appears twice.
    Duplicate,
    /// `general.alignment` that is not a power of two, or not a u32.
    BadAlignment(String),
    /// A tensor with more than [`MAX_DIMS`] dimensions.
    TooManyDims(u32),
    /// A ggml type id this reader does not know.
    UnknownType(u32),
    /// A shape whose element count overflows, or whose first dimension is not a whole number
    /// of the type's blocks.
    BadShape(String),
    /// A tensor offset that is not a multiple of the alignment.
    Misaligned {
        /// The offset (relative to the data section).
        offset: u64,
        /// The alignment.
        alignment: u64,
    },
    /// Tensor data beyond the end of the file.
    OutOfBounds {
        /// The tensor's first byte (absolute).
        start: u64,
        /// Its byte size.
        size: u64,
        /// The file's length.
        file_len: u64,
    },
    /// The host cannot give the memory the file asks for.
    OutOfMemory(u64),
    /// The file could not be read.
    Io(String),
}

/// An error reading a GGUF file: where, what it was reading, what was wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GgufError {
    /// The byte offset in the file.
    pub offset: u64,
    /// What was being read: `header`, `key 'llama.block_count'`, `tensor 'blk.0.attn_q.weight'`.
    pub what: String,
    /// What was wrong.
    pub kind: GgufErrorKind,
}

impl fmt::Display for GgufErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use GgufErrorKind::*;
        match self {
            Truncated { needed, available } => write!(
                f,
                "the file ends early: {needed} bytes needed, {available} left"
            ),
            BadMagic(m) => write!(f, "not a GGUF file (magic {m:02x?}, expected \"GGUF\")"),
            UnsupportedVersion(v) if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
                write!(
                    f,
                    "a big-endian GGUF file; only little-endian files are read"
                )
            }
            UnsupportedVersion(v) => write!(f, "GGUF version {v}; versions 2 and 3 are read"),
            NotUtf8 => write!(f, "the string is not UTF-8"),
            BadValueType(t) => write!(f, "unknown metadata value type {t}"),
            TooDeep => write!(f, "arrays nested more than {MAX_ARRAY_DEPTH} deep"),
            Duplicate => write!(f, "it appears twice"),
            BadAlignment(why) => write!(f, "bad general.alignment: {why}"),
            TooManyDims(n) => write!(f, "{n} dimensions (at most {MAX_DIMS})"),
            UnknownType(t) => write!(f, "unknown ggml type {t}"),
            BadShape(why) => write!(f, "bad shape: {why}"),
            Misaligned { offset, alignment } => write!(
                f,
                "data offset {offset} is not a multiple of the alignment {alignment}"
            ),
            OutOfBounds {
                start,
                size,
                file_len,
            } => write!(
                f,
                "its {size} bytes at byte {start} run past the end of the file ({file_len} bytes)"
            ),
            OutOfMemory(n) => write!(f, "cannot allocate memory for {n} items"),
            Io(e) => write!(f, "{e}"),
        }
    }
}

impl fmt::Display for GgufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid GGUF at byte {} ({}): {}",
            self.offset, self.what, self.kind
        )
    }
}

impl std::error::Error for GgufError {}

/// The element type of a metadata value (the format's `gguf_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    /// The type for the format's id.
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The name in error messages (`u32`, `string`, ...).
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }

    /// The encoded size of one scalar (strings and arrays: their smallest, the length fields).
    fn min_size(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Array),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A metadata array: one vector per element type, so a long array costs what its elements
/// cost (not an enum per element).
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<Array>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl Value {
    /// The value's type.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// An integer of any width and signedness, when it is a non-negative one.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// A float (f32 or f64; f64 rounded to f32).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    /// A string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// A bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// An array.
    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// A short description for error messages: `u32`, `array of 3 string`.
    pub fn describe(&self) -> String {
        match self {
            Value::Array(a) => format!("array of {} {}", a.len(), a.elem_type().name()),
            v => v.value_type().name().to_string(),
        }
    }
}

impl Array {
    /// The element type.
    pub fn elem_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One tensor's entry in the header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// The name (`blk.0.attn_q.weight`).
    pub name: String,
    /// The dimensions, innermost first (ggml's `ne`).
    pub dims: Vec<u64>,
    /// The element (or block) type.
    pub ggml_type: GgmlType,
    /// The data's offset relative to the data section.
    pub offset: u64,
    /// The data's absolute offset in the file.
    pub start: u64,
    /// The data's size in bytes.
    pub size: u64,
    /// Where the header entry starts (for error messages).
    pub header_offset: u64,
}

impl TensorInfo {
    /// The number of elements.
    pub fn n_elements(&self) -> u64 {
        // Checked at parse time: the product does not overflow.
        self.dims.iter().product()
    }

    /// The number of rows (every dimension but the first); a vector has one.
    pub fn n_rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }

    /// The byte range of the data in the file.
    pub fn range(&self) -> Range<usize> {
        // Checked at parse time: start + size <= the file's length, which is a usize.
        self.start as usize..(self.start + self.size) as usize
    }
}

/// A parsed GGUF header: metadata and tensor infos (the data stays in the caller's bytes).
#[derive(Clone, Debug)]
pub struct Gguf {
    /// The format version (2 or 3).
    pub version: u32,
    /// The data section's alignment.
    pub alignment: u64,
    /// The absolute offset of the data section.
    pub data_start: u64,
    /// The file's length in bytes.
    pub file_len: u64,
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

/// Smallest encoded metadata entry: key length, type, a one-byte value.
const MIN_KV_SIZE: u64 = 8 + 4 + 1;
/// Smallest encoded tensor info: name length, n_dims, type, offset.
const MIN_TENSOR_INFO_SIZE: u64 = 8 + 4 + 4 + 8;

/// A cursor over the file's bytes that checks every read.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    /// What is being read, for errors.
    what: String,
}

impl<'a> Reader<'a> {
    fn err(&self, kind: GgufErrorKind) -> GgufError {
        GgufError {
            offset: self.pos as u64,
            what: self.what.clone(),
            kind,
        }
    }

    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8], GgufError> {
        let available = self.remaining();
        if n > available {
            return Err(self.err(GgufErrorKind::Truncated {
                needed: n,
                available,
            }));
        }
        // n <= remaining, so it fits in usize and the slice is in bounds.
        let n = n as usize;
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn string(&mut self) -> Result<String, GgufError> {
        let start = self.pos;
        let len = self.u64()?;
        let bytes = self.take(len)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => {
                let mut out = String::new();
                out.try_reserve_exact(s.len())
                    .map_err(|_| self.err(GgufErrorKind::OutOfMemory(len)))?;
                out.push_str(s);
                Ok(out)
            }
            Err(_) => Err(GgufError {
                offset: start as u64,
                what: self.what.clone(),
                kind: GgufErrorKind::NotUtf8,
            }),
        }
    }

    /// A vector for `count` elements of at least `min_size` encoded bytes each: the count is
    /// checked against the bytes left before anything is reserved.
    fn vec_for<T>(&self, count: u64, min_size: u64) -> Result<Vec<T>, GgufError> {
        let needed = count.saturating_mul(min_size);
        let available = self.remaining();
        if needed > available {
            return Err(self.err(GgufErrorKind::Truncated { needed, available }));
        }
        let mut v = Vec::new();
        // count <= remaining bytes, so it fits in usize.
        v.try_reserve_exact(count as usize)
            .map_err(|_| self.err(GgufErrorKind::OutOfMemory(count)))?;
        Ok(v)
    }

    fn value_type(&mut self) -> Result<ValueType, GgufError> {
        let at = self.pos;
        let id = self.u32()?;
        ValueType::from_id(id).ok_or_else(|| GgufError {
            offset: at as u64,
            what: self.what.clone(),
            kind: GgufErrorKind::BadValueType(id),
        })
    }

    fn value(&mut self, ty: ValueType, depth: usize) -> Result<Value, GgufError> {
        Ok(match ty {
            ValueType::U8 => Value::U8(u8::from_le_bytes(self.array()?)),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array()?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array()?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array()?)),
            ValueType::U32 => Value::U32(self.u32()?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array()?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array()?)),
            ValueType::Bool => Value::Bool(self.array::<1>()?[0] != 0),
            ValueType::String => Value::String(self.string()?),
            ValueType::Array => Value::Array(self.array_value(depth + 1)?),
            ValueType::U64 => Value::U64(self.u64()?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array()?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array()?)),
        })
    }

    fn array_value(&mut self, depth: usize) -> Result<Array, GgufError> {
        if depth > MAX_ARRAY_DEPTH {
            return Err(self.err(GgufErrorKind::TooDeep));
        }
        let elem = self.value_type()?;
        let count = self.u64()?;
        let min = elem.min_size();
        macro_rules! fixed {
            ($variant:ident, $t:ty) => {{
                let mut v: Vec<$t> = self.vec_for(count, min)?;
                for _ in 0..count {
                    v.push(<$t>::from_le_bytes(self.array()?));
                }
                Array::$variant(v)
            }};
        }
        Ok(match elem {
            ValueType::U8 => fixed!(U8, u8),
            ValueType::I8 => fixed!(I8, i8),
            ValueType::U16 => fixed!(U16, u16),
            ValueType::I16 => fixed!(I16, i16),
            ValueType::U32 => fixed!(U32, u32),
            ValueType::I32 => fixed!(I32, i32),
            ValueType::F32 => fixed!(F32, f32),
            ValueType::U64 => fixed!(U64, u64),
            ValueType::I64 => fixed!(I64, i64),
            ValueType::F64 => fixed!(F64, f64),
            ValueType::Bool => {
                let mut v = self.vec_for(count, min)?;
                for _ in 0..count {
                    v.push(self.array::<1>()?[0] != 0);
                }
                Array::Bool(v)
            }
            ValueType::String => {
                let mut v = self.vec_for(count, min)?;
                for _ in 0..count {
                    v.push(self.string()?);
                }
                Array::String(v)
            }
            ValueType::Array => {
                let mut v = self.vec_for(count, min)?;
                for _ in 0..count {
                    v.push(self.array_value(depth + 1)?);
                }
                Array::Array(v)
            }
        })
    }
}

/// Rounds `x` up to a multiple of `align` (a power of two), `None` on overflow.
fn align_up(x: u64, align: u64) -> Option<u64> {
    Some(x.checked_add(align - 1)? & !(align - 1))
}

impl Gguf {
    /// Parses the header of a GGUF file held in `bytes` (the whole file: tensor extents are
    /// checked against its length).
    pub fn parse(bytes: &[u8]) -> Result<Gguf, GgufError> {
        let mut r = Reader {
            bytes,
            pos: 0,
            what: "header".to_string(),
        };
        let magic: [u8; 4] = r.array()?;
        if magic != MAGIC {
            return Err(GgufError {
                offset: 0,
                what: "header".into(),
                kind: GgufErrorKind::BadMagic(magic),
            });
        }
        let at = r.pos;
        let version = r.u32()?;
        if version != 2 && version != 3 {
            return Err(GgufError {
                offset: at as u64,
                what: "header: version".into(),
                kind: GgufErrorKind::UnsupportedVersion(version),
            });
        }
        r.what = "header: tensor_count".into();
        let tensor_count = r.u64()?;
        r.what = "header: kv_count".into();
        let kv_count = r.u64()?;

        r.what = "metadata".into();
        let mut metadata: Vec<(String, Value)> = r.vec_for(kv_count, MIN_KV_SIZE)?;
        let mut key_index = HashMap::new();
        key_index
            .try_reserve(metadata.capacity())
            .map_err(|_| r.err(GgufErrorKind::OutOfMemory(kv_count)))?;
        for i in 0..kv_count {
            let at = r.pos;
            r.what = format!("metadata entry {i}: key");
            let key = r.string()?;
            r.what = format!("key '{key}'");
            let ty = r.value_type()?;
            let value = r.value(ty, 0)?;
            if key_index.contains_key(&key) {
                return Err(GgufError {
                    offset: at as u64,
                    what: r.what,
                    kind: GgufErrorKind::Duplicate,
                });
            }
            key_index.insert(key.clone(), metadata.len());
            metadata.push((key, value));
        }

        let alignment = match key_index.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(&i) => {
                let bad = |why: String| GgufError {
                    offset: 0,
                    what: "key 'general.alignment'".into(),
                    kind: GgufErrorKind::BadAlignment(why),
                };
                match metadata[i].1 {
                    Value::U32(a) if a.is_power_of_two() => u64::from(a),
                    Value::U32(a) => return Err(bad(format!("{a} is not a power of two"))),
                    ref v => return Err(bad(format!("a {}, expected u32", v.describe()))),
                }
            }
        };

        r.what = "tensor infos".into();
        let mut tensors: Vec<TensorInfo> = r.vec_for(tensor_count, MIN_TENSOR_INFO_SIZE)?;
        let mut tensor_index = HashMap::new();
        tensor_index
            .try_reserve(tensors.capacity())
            .map_err(|_| r.err(GgufErrorKind::OutOfMemory(tensor_count)))?;
        // Offsets are checked against the file once the data section's start is known.
        for i in 0..tensor_count {
            let header_offset = r.pos as u64;
            r.what = format!("tensor info {i}: name");
            let name = r.string()?;
            r.what = format!("tensor '{name}'");
            let at = r.pos as u64;
            let n_dims = r.u32()?;
            if n_dims as usize > MAX_DIMS {
                return Err(GgufError {
                    offset: at,
                    what: r.what,
                    kind: GgufErrorKind::TooManyDims(n_dims),
                });
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(r.u64()?);
            }
            let at = r.pos as u64;
            let type_id = r.u32()?;
            let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| GgufError {
                offset: at,
                what: r.what.clone(),
                kind: GgufErrorKind::UnknownType(type_id),
            })?;
            let at = r.pos as u64;
            let offset = r.u64()?;
            let shape_err = |why: String| GgufError {
                offset: header_offset,
                what: format!("tensor '{name}'"),
                kind: GgufErrorKind::BadShape(why),
            };
            let mut n: u64 = 1;
            for &d in &dims {
                // ggml keeps element counts in an int64_t.
                n = n
                    .checked_mul(d)
                    .filter(|&n| n <= i64::MAX as u64)
                    .ok_or_else(|| shape_err(format!("{dims:?} has too many elements")))?;
            }
            let size = ggml_type
                .row_bytes(n)
                .ok_or_else(|| {
                    shape_err(format!(
                        "{dims:?}: {} elements are not whole {} blocks of {}",
                        n,
                        ggml_type.name(),
                        ggml_type.block_size()
                    ))
                })
                .and_then(|size| {
                    if dims
                        .first()
                        .is_some_and(|&d| !d.is_multiple_of(ggml_type.block_size()))
                    {
                        Err(shape_err(format!(
                            "{dims:?}: the first dimension is not a multiple of the {} block \
                             size {}",
                            ggml_type.name(),
                            ggml_type.block_size()
                        )))
                    } else {
                        Ok(size)
                    }
                })?;
            if !offset.is_multiple_of(alignment) {
                return Err(GgufError {
                    offset: at,
                    what: r.what,
                    kind: GgufErrorKind::Misaligned { offset, alignment },
                });
            }
            if tensor_index.contains_key(&name) {
                return Err(GgufError {
                    offset: header_offset,
                    what: r.what,
                    kind: GgufErrorKind::Duplicate,
                });
            }
            tensor_index.insert(name.clone(), tensors.len());
            tensors.push(TensorInfo {
                name,
                dims,
                ggml_type,
                offset,
                start: 0,
                size,
                header_offset,
            });
        }

        let file_len = bytes.len() as u64;
        let data_start = align_up(r.pos as u64, alignment).ok_or_else(|| GgufError {
            offset: r.pos as u64,
            what: "data section".into(),
            kind: GgufErrorKind::Truncated {
                needed: alignment,
                available: r.remaining(),
            },
        })?;
        for t in &mut tensors {
            let oob = GgufError {
                offset: t.header_offset,
                what: format!("tensor '{}'", t.name),
                kind: GgufErrorKind::OutOfBounds {
                    start: data_start.saturating_add(t.offset),
                    size: t.size,
                    file_len,
                },
            };
            let start = data_start.checked_add(t.offset).ok_or(oob.clone())?;
            let end = start.checked_add(t.size).ok_or(oob.clone())?;
            if end > file_len {
                return Err(oob);
            }
            t.start = start;
        }

        Ok(Gguf {
            version,
            alignment,
            data_start,
            file_len,
            metadata,
            key_index,
            tensors,
            tensor_index,
        })
    }

    /// The metadata, in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// A metadata value.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// The tensor infos, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// A tensor's info.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }
}

/// A GGUF file read into memory: the parsed header and the bytes.
#[derive(Debug)]
pub struct GgufFile {
    /// Where it was read from.
    pub path: PathBuf,
    /// The header.
    pub gguf: Gguf,
    bytes: Vec<u8>,
}

impl GgufFile {
    /// Reads and parses a file.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let io = |e: std::io::Error| GgufError {
            offset: 0,
            what: path.display().to_string(),
            kind: GgufErrorKind::Io(e.to_string()),
        };
        use std::io::Read;
        let mut f = std::fs::File::open(path).map_err(io)?;
        let len = f.metadata().map_err(io)?.len();
        let mut bytes = Vec::new();
        usize::try_from(len)
            .ok()
            .and_then(|n| bytes.try_reserve_exact(n).ok())
            .ok_or_else(|| GgufError {
                offset: 0,
                what: path.display().to_string(),
                kind: GgufErrorKind::OutOfMemory(len),
            })?;
        f.read_to_end(&mut bytes).map_err(io)?;
        let gguf = Gguf::parse(&bytes)?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            gguf,
            bytes,
        })
    }

    /// Parses bytes already in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        let gguf = Gguf::parse(&bytes)?;
        Ok(GgufFile {
            path: PathBuf::new(),
            gguf,
            bytes,
        })
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// A tensor's info and data.
    pub fn tensor(&self, name: &str) -> Option<(&TensorInfo, &[u8])> {
        let t = self.gguf.tensor(name)?;
        Some((t, &self.bytes[t.range()]))
    }
}

/// Writes GGUF files (version 3): the test models of this crate and its users (a tiny llama
/// with random weights) and the hostile-input tests' seeds.
#[derive(Clone, Debug, Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn type_id(t: ValueType) -> u32 {
    use ValueType::*;
    match t {
        U8 => 0,
        I8 => 1,
        U16 => 2,
        I16 => 3,
        U32 => 4,
        I32 => 5,
        F32 => 6,
        Bool => 7,
        String => 8,
        Array => 9,
        U64 => 10,
        I64 => 11,
        F64 => 12,
    }
}

fn put_array(out: &mut Vec<u8>, a: &Array) {
    out.extend_from_slice(&type_id(a.elem_type()).to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! each {
        ($v:expr) => {
            for x in $v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        Array::U8(v) => each!(v),
        Array::I8(v) => each!(v),
        Array::U16(v) => each!(v),
        Array::I16(v) => each!(v),
        Array::U32(v) => each!(v),
        Array::I32(v) => each!(v),
        Array::F32(v) => each!(v),
        Array::U64(v) => each!(v),
        Array::I64(v) => each!(v),
        Array::F64(v) => each!(v),
        Array::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
        Array::String(v) => v.iter().for_each(|s| put_str(out, s)),
        Array::Array(v) => v.iter().for_each(|a| put_array(out, a)),
    }
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_str(out, s),
        Value::Array(a) => put_array(out, a),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

impl GgufWriter {
    /// An empty file.
    pub fn new() -> GgufWriter {
        GgufWriter::default()
    }

    /// Adds a metadata entry.
    pub fn kv(&mut self, key: impl Into<String>, value: Value) -> &mut GgufWriter {
        self.metadata.push((key.into(), value));
        self
    }

    /// Adds a tensor: `dims` innermost first, `data` its bytes in `ggml_type`'s layout.
    pub fn tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        ggml_type: GgmlType,
        data: Vec<u8>,
    ) -> &mut GgufWriter {
        self.tensors
            .push((name.into(), dims.to_vec(), ggml_type, data));
        self
    }

    /// Adds an f32 tensor.
    pub fn tensor_f32(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        values: &[f32],
    ) -> &mut GgufWriter {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensor(name, dims, GgmlType::F32, data)
    }

    /// The file's bytes. The alignment is `general.alignment` when it is a u32 power of two,
    /// else 32.
    pub fn to_bytes(&self) -> Vec<u8> {
        let alignment = match self.metadata.iter().find(|(k, _)| k == "general.alignment") {
            Some((_, Value::U32(a))) if a.is_power_of_two() => u64::from(*a),
            _ => DEFAULT_ALIGNMENT,
        };
        let pad = |n: u64| n.div_ceil(alignment) * alignment;
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut out, k);
            out.extend_from_slice(&type_id(v.value_type()).to_le_bytes());
            put_value(&mut out, v);
        }
        let mut offset = 0u64;
        for (name, dims, ty, data) in &self.tensors {
            put_str(&mut out, name);
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&ty.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offset = pad(offset + data.len() as u64);
        }
        out.resize(pad(out.len() as u64) as usize, 0);
        for (_, _, _, data) in &self.tensors {
            out.extend_from_slice(data);
            out.resize(pad(out.len() as u64) as usize, 0);
        }
        out
    }
}
