//! Host tensors: constants, folded values, user-supplied values, and the ONNX `TensorProto`
//! (`.pb`) files of the ONNX node tests.
//!
//! Floating types (f32, f16, bf16) are held as `f32` values and integer/bool types as `i64`
//! values; [`HostTensor::to_bytes`] writes the element type's little-endian device encoding.

use crate::error::{ErrorKind, Result, err};
use crate::onnx::{TensorProto, data_type as dt};
use nrt_hal::DType;
use prost::Message;
use std::path::{Component, Path};

/// Element values of a [`HostTensor`].
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    /// Values of a floating type.
    F32(Vec<f32>),
    /// Values of an integer or bool type.
    I64(Vec<i64>),
}

/// A tensor in host memory.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    /// Element type.
    pub dtype: DType,
    /// Shape (empty: scalar).
    pub shape: Vec<usize>,
    /// Values, row-major.
    pub data: Data,
}

/// The compiler's one size budget: no tensor it imports, folds on the host, plans in device
/// memory or emits as an input or output may hold more than this many bytes (16 GiB, the
/// software NeuronCore's default memory). Shapes and attributes come from the model, so every
/// size is computed checked against it before anything is allocated.
pub const MAX_TENSOR_BYTES: usize = 1 << 34;

/// The element count of a `dtype` tensor of `shape`, if its size is within
/// [`MAX_TENSOR_BYTES`] (`None` if it is not, or the product overflows).
pub fn within_budget(shape: &[usize], dtype: DType) -> Option<usize> {
    let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))?;
    (n.checked_mul(dtype.size())? <= MAX_TENSOR_BYTES).then_some(n)
}

/// [`within_budget`], or the "too large" error naming `what` (a tensor, an output).
pub fn budget(what: &str, shape: &[usize], dtype: DType) -> Result<usize> {
    within_budget(shape, dtype).ok_or_else(|| {
        crate::error::CompileError::new(
            ErrorKind::TooLarge,
            format!(
                "{what} of shape {shape:?} ({dtype}) is larger than the compiler's tensor budget \
                 of {MAX_TENSOR_BYTES} bytes"
            ),
        )
    })
}

/// Reserves room for `n` values, failing with a "too large" error instead of aborting when
/// the host cannot provide it (sizes of folded tensors come from the model).
pub fn try_vec<T>(n: usize, what: &str) -> Result<Vec<T>> {
    // More than the host can back is refused up front (as the runtime's host tensors are,
    // `tuning::HOST_ALLOC_BACKING_CHECK_BYTES`): with overcommit the reservation succeeds and
    // the OOM killer ends the compile when the folded values are written.
    let bytes = n.saturating_mul(size_of::<T>()) as u64;
    if bytes >= nrt_hal::tuning::HOST_ALLOC_BACKING_CHECK_BYTES
        && let Some(avail) = nrt_hal::host_memory_available()
        && bytes > avail
    {
        return Err(crate::error::CompileError::new(
            ErrorKind::TooLarge,
            format!(
                "{what}: {n} elements ({bytes} bytes) are more than this host has available \
                 ({avail} bytes: the least of MemAvailable, the memory cgroup's headroom and \
                 NRT_HOST_MEMORY_MAX)"
            ),
        ));
    }
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| {
        crate::error::CompileError::new(
            ErrorKind::TooLarge,
            format!(
                "{what}: {} bytes ({n} elements) do not fit in the compiler's memory",
                n.saturating_mul(size_of::<T>())
            ),
        )
    })?;
    Ok(v)
}

/// Whether the host can give the compiler `bytes` more bytes now: the same checks as
/// [`try_vec`] (the host's `MemAvailable` and memory cgroup headroom, then a fallible reservation, which an address-space
/// limit refuses), made by reserving and releasing at once. Nothing is touched, so the probe
/// costs a map and an unmap; below [`nrt_hal::tuning::HOST_ALLOC_BACKING_CHECK_BYTES`] it is
/// skipped. For work whose allocations are too many to make each fallible (the host
/// evaluator's views and copies): it is admitted with its whole working set up front.
pub fn host_can_hold(bytes: usize) -> bool {
    bytes < nrt_hal::tuning::HOST_ALLOC_BACKING_CHECK_BYTES as usize
        || try_vec::<u8>(bytes, "host memory probe").is_ok()
}

/// Whether values of `d` are held as `f32` (double too: the device computes it in f32, so
/// the compiler keeps its values at that precision).
pub fn is_float(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::Bf16 | DType::F64)
}

/// The element type of an ONNX `TensorProto.DataType`, `None` if the device has none.
pub fn dtype_from_onnx(t: i32) -> Option<DType> {
    Some(match t {
        dt::FLOAT => DType::F32,
        dt::UINT8 => DType::U8,
        dt::INT8 => DType::I8,
        dt::UINT16 => DType::U16,
        dt::INT16 => DType::I16,
        dt::INT32 => DType::I32,
        dt::INT64 => DType::I64,
        dt::BOOL => DType::Bool,
        dt::FLOAT16 => DType::F16,
        dt::UINT32 => DType::U32,
        dt::UINT64 => DType::U64,
        dt::BFLOAT16 => DType::Bf16,
        dt::DOUBLE => DType::F64,
        _ => return None,
    })
}

/// The ONNX `TensorProto.DataType` of an element type.
pub fn dtype_to_onnx(d: DType) -> i32 {
    match d {
        DType::F32 => dt::FLOAT,
        DType::U8 => dt::UINT8,
        DType::I8 => dt::INT8,
        DType::U16 => dt::UINT16,
        DType::I16 => dt::INT16,
        DType::I32 => dt::INT32,
        DType::I64 => dt::INT64,
        DType::Bool => dt::BOOL,
        DType::F16 => dt::FLOAT16,
        DType::U32 => dt::UINT32,
        DType::U64 => dt::UINT64,
        DType::Bf16 => dt::BFLOAT16,
        DType::F64 => dt::DOUBLE,
    }
}

/// The name of an ONNX data type, for messages.
pub fn onnx_type_name(t: i32) -> String {
    let n = match t {
        dt::STRING => "string",
        dt::DOUBLE => "double",
        14 => "complex64",
        15 => "complex128",
        17..=20 => "float8",
        21 | 22 => "int4/uint4",
        23 => "float4",
        _ => return format!("data type {t}"),
    };
    n.to_owned()
}

/// `f32` → IEEE half bits (round to nearest even).
pub fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = m >> shift;
        let rem = m & ((1 << shift) - 1);
        let mid = 1 << (shift - 1);
        let round = rem > mid || (rem == mid && half & 1 == 1);
        return sign | (half + round as u32) as u16;
    }
    let half = ((e as u32) << 10) | (man >> 13);
    let rem = man & 0x1fff;
    let round = rem > 0x1000 || (rem == 0x1000 && half & 1 == 1);
    sign | (half + round as u32) as u16
}

/// IEEE half bits → `f32`.
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = if exp == 0 {
        if man == 0 {
            sign
        } else {
            let v = man as f32 / 1024.0 / 16384.0;
            return if sign != 0 { -v } else { v };
        }
    } else if exp == 0x1f {
        sign | 0x7f80_0000 | (man << 13)
    } else {
        sign | ((exp + 127 - 15) << 23) | (man << 13)
    };
    f32::from_bits(bits)
}

fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((b >> 16) & 1);
    ((b + round) >> 16) as u16
}

impl HostTensor {
    /// A float tensor.
    pub fn f32(shape: Vec<usize>, values: Vec<f32>) -> HostTensor {
        debug_assert_eq!(shape.iter().product::<usize>(), values.len());
        HostTensor {
            dtype: DType::F32,
            shape,
            data: Data::F32(values),
        }
    }

    /// An int64 tensor.
    pub fn i64(shape: Vec<usize>, values: Vec<i64>) -> HostTensor {
        Self::ints(DType::I64, shape, values)
    }

    /// An integer or bool tensor of type `dtype` (values are wrapped to the type).
    pub fn ints(dtype: DType, shape: Vec<usize>, values: Vec<i64>) -> HostTensor {
        debug_assert_eq!(shape.iter().product::<usize>(), values.len());
        let values = values.into_iter().map(|v| wrap_int(dtype, v)).collect();
        HostTensor {
            dtype,
            shape,
            data: Data::I64(values),
        }
    }

    /// [`HostTensor::from_f64s`] for a size that comes from the model: within the budget and
    /// allocated fallibly, else a "too large" error naming `what`.
    pub fn try_from_f64s(
        what: &str,
        dtype: DType,
        shape: Vec<usize>,
        values: impl Iterator<Item = f64>,
    ) -> Result<Self> {
        let n = budget(what, &shape, dtype)?;
        let data = if is_float(dtype) {
            let mut v = try_vec(n, what)?;
            v.extend(values.take(n).map(|x| round_float(dtype, x as f32)));
            Data::F32(v)
        } else {
            let mut v = try_vec(n, what)?;
            if dtype == DType::Bool {
                v.extend(values.take(n).map(|x| (x != 0.0) as i64));
            } else {
                v.extend(values.take(n).map(|x| wrap_int(dtype, x as i64)));
            }
            Data::I64(v)
        };
        Ok(HostTensor { dtype, shape, data })
    }

    /// A tensor of `dtype` from values given as `f64`s (converted like a cast).
    pub fn from_f64s(dtype: DType, shape: Vec<usize>, values: impl Iterator<Item = f64>) -> Self {
        if is_float(dtype) {
            let v = values.map(|x| round_float(dtype, x as f32)).collect();
            HostTensor {
                dtype,
                shape,
                data: Data::F32(v),
            }
        } else if dtype == DType::Bool {
            Self::ints(dtype, shape, values.map(|x| (x != 0.0) as i64).collect())
        } else {
            Self::ints(dtype, shape, values.map(|x| x as i64).collect())
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match &self.data {
            Data::F32(v) => v.len(),
            Data::I64(v) => v.len(),
        }
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` as `f64`.
    pub fn get_f64(&self, i: usize) -> f64 {
        match &self.data {
            Data::F32(v) => v[i] as f64,
            Data::I64(v) => v[i] as f64,
        }
    }

    /// The values as `f32`s: borrowed when they are held as such (a weight may be
    /// gigabytes; the lowering reads it without a copy), converted otherwise.
    pub fn to_f32s(&self) -> std::borrow::Cow<'_, [f32]> {
        match &self.data {
            Data::F32(v) => v.as_slice().into(),
            Data::I64(v) => v.iter().map(|&x| x as f32).collect::<Vec<_>>().into(),
        }
    }

    /// The values as `i64`s (floats truncate): borrowed when they are held as such.
    pub fn to_i64s(&self) -> std::borrow::Cow<'_, [i64]> {
        match &self.data {
            Data::F32(v) => v.iter().map(|&x| x as i64).collect::<Vec<_>>().into(),
            Data::I64(v) => v.as_slice().into(),
        }
    }

    /// The same values converted to `dtype` (ONNX `Cast` semantics).
    pub fn cast(&self, dtype: DType) -> HostTensor {
        match (&self.data, is_float(dtype)) {
            (Data::F32(v), true) => HostTensor {
                dtype,
                shape: self.shape.clone(),
                data: Data::F32(v.iter().map(|&x| round_float(dtype, x)).collect()),
            },
            (Data::I64(v), true) => HostTensor {
                dtype,
                shape: self.shape.clone(),
                data: Data::F32(v.iter().map(|&x| round_float(dtype, x as f32)).collect()),
            },
            (Data::F32(v), false) => {
                let vals = v
                    .iter()
                    .map(|&x| {
                        if dtype == DType::Bool {
                            (x != 0.0) as i64
                        } else {
                            x as i64
                        }
                    })
                    .collect();
                Self::ints(dtype, self.shape.clone(), vals)
            }
            (Data::I64(v), false) => {
                let vals = v
                    .iter()
                    .map(|&x| {
                        if dtype == DType::Bool {
                            (x != 0) as i64
                        } else {
                            x
                        }
                    })
                    .collect();
                Self::ints(dtype, self.shape.clone(), vals)
            }
        }
    }

    /// The same data with another shape (same element count).
    pub fn reshaped(&self, shape: Vec<usize>) -> HostTensor {
        HostTensor {
            dtype: self.dtype,
            shape,
            data: self.data.clone(),
        }
    }

    /// The device encoding: little-endian elements of `dtype`.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len() * self.dtype.size());
        self.write_bytes(&mut out);
        out
    }

    /// [`HostTensor::to_bytes`] for a tensor whose size comes from the model: allocated
    /// fallibly, else a "too large" error naming `what`.
    pub fn try_to_bytes(&self, what: &str) -> Result<Vec<u8>> {
        let mut out = try_vec(self.len().saturating_mul(self.dtype.size()), what)?;
        self.write_bytes(&mut out);
        Ok(out)
    }

    fn write_bytes(&self, out: &mut Vec<u8>) {
        match &self.data {
            Data::F32(v) => {
                for &x in v {
                    match self.dtype {
                        DType::F16 => out.extend_from_slice(&f32_to_f16(x).to_le_bytes()),
                        DType::Bf16 => out.extend_from_slice(&f32_to_bf16(x).to_le_bytes()),
                        DType::F64 => out.extend_from_slice(&(x as f64).to_le_bytes()),
                        _ => out.extend_from_slice(&x.to_le_bytes()),
                    }
                }
            }
            Data::I64(v) => {
                let size = self.dtype.size();
                for &x in v {
                    out.extend_from_slice(&x.to_le_bytes()[..size]);
                }
            }
        }
    }

    /// Reads the device encoding of `dtype`.
    pub fn from_bytes(dtype: DType, shape: Vec<usize>, bytes: &[u8]) -> Result<HostTensor> {
        let n: usize = shape.iter().product();
        let size = dtype.size();
        if bytes.len() != n * size {
            return err(
                ErrorKind::ShapeMismatch,
                format!(
                    "{} bytes of data for {n} elements of {dtype} ({} bytes expected)",
                    bytes.len(),
                    n * size
                ),
            );
        }
        let chunks = bytes.chunks_exact(size.max(1));
        Ok(if is_float(dtype) {
            let v = chunks
                .map(|c| match dtype {
                    DType::F16 => f16_to_f32(u16::from_le_bytes([c[0], c[1]])),
                    DType::Bf16 => f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16),
                    DType::F64 => {
                        f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f32
                    }
                    _ => f32::from_le_bytes([c[0], c[1], c[2], c[3]]),
                })
                .collect();
            HostTensor {
                dtype,
                shape,
                data: Data::F32(v),
            }
        } else {
            let v = chunks
                .map(|c| {
                    let mut b = [0u8; 8];
                    b[..size].copy_from_slice(c);
                    let raw = i64::from_le_bytes(b);
                    wrap_int(dtype, raw)
                })
                .collect();
            HostTensor {
                dtype,
                shape,
                data: Data::I64(v),
            }
        })
    }

    /// Converts an ONNX `TensorProto`. External data is read relative to `model_dir`.
    pub fn from_proto(t: &TensorProto, model_dir: Option<&Path>) -> Result<HostTensor> {
        let name = &t.name;
        let dtype = dtype_from_onnx(t.data_type).ok_or_else(|| {
            crate::error::CompileError::new(
                ErrorKind::UnsupportedDType,
                format!(
                    "tensor '{name}' has element type {}",
                    onnx_type_name(t.data_type)
                ),
            )
        })?;
        let mut shape = Vec::with_capacity(t.dims.len());
        for &d in &t.dims {
            if d < 0 {
                return err(
                    ErrorKind::BadShape,
                    format!("tensor '{name}' has negative dimension {d}"),
                );
            }
            shape.push(d as usize);
        }
        let n = budget(&format!("tensor '{name}'"), &shape, dtype)?;
        let bad_count = |got: usize| {
            err(
                ErrorKind::ShapeMismatch,
                format!("tensor '{name}' has {got} values for shape {shape:?}"),
            )
        };
        if t.data_location == 1 || !t.external_data.is_empty() {
            let bytes = read_external(t, model_dir)?;
            return Self::from_bytes(dtype, shape.clone(), &bytes).map_err(|mut e| {
                e.message = format!("external data of tensor '{name}': {}", e.message);
                e
            });
        }
        if !t.raw_data.is_empty() || n == 0 {
            return Self::from_bytes(dtype, shape.clone(), &t.raw_data).map_err(|mut e| {
                e.message = format!("raw data of tensor '{name}': {}", e.message);
                e
            });
        }
        let out = match t.data_type {
            dt::FLOAT => {
                if t.float_data.len() != n {
                    return bad_count(t.float_data.len());
                }
                HostTensor::f32(shape.clone(), t.float_data.clone())
            }
            dt::INT64 => {
                if t.int64_data.len() != n {
                    return bad_count(t.int64_data.len());
                }
                HostTensor::i64(shape.clone(), t.int64_data.clone())
            }
            dt::UINT32 | dt::UINT64 => {
                if t.uint64_data.len() != n {
                    return bad_count(t.uint64_data.len());
                }
                let v = t.uint64_data.iter().map(|&x| x as i64).collect();
                HostTensor::ints(dtype, shape.clone(), v)
            }
            dt::DOUBLE => {
                if t.double_data.len() != n {
                    return bad_count(t.double_data.len());
                }
                HostTensor {
                    dtype,
                    shape: shape.clone(),
                    data: Data::F32(t.double_data.iter().map(|&x| x as f32).collect()),
                }
            }
            dt::FLOAT16 | dt::BFLOAT16 => {
                if t.int32_data.len() != n {
                    return bad_count(t.int32_data.len());
                }
                let v = t
                    .int32_data
                    .iter()
                    .map(|&x| {
                        if dtype == DType::F16 {
                            f16_to_f32(x as u16)
                        } else {
                            f32::from_bits((x as u32 & 0xffff) << 16)
                        }
                    })
                    .collect();
                HostTensor {
                    dtype,
                    shape: shape.clone(),
                    data: Data::F32(v),
                }
            }
            _ => {
                if t.int32_data.len() != n {
                    return bad_count(t.int32_data.len());
                }
                let v = t.int32_data.iter().map(|&x| x as i64).collect();
                HostTensor::ints(dtype, shape.clone(), v)
            }
        };
        Ok(out)
    }

    /// Converts to an ONNX `TensorProto` (raw data).
    pub fn to_proto(&self, name: &str) -> TensorProto {
        TensorProto {
            dims: self.shape.iter().map(|&d| d as i64).collect(),
            data_type: dtype_to_onnx(self.dtype),
            name: name.to_owned(),
            raw_data: self.to_bytes(),
            ..Default::default()
        }
    }
}

fn wrap_int(dtype: DType, v: i64) -> i64 {
    match dtype {
        DType::I8 => v as i8 as i64,
        DType::U8 => v as u8 as i64,
        DType::I16 => v as i16 as i64,
        DType::U16 => v as u16 as i64,
        DType::I32 => v as i32 as i64,
        DType::U32 => v as u32 as i64,
        DType::Bool => (v != 0) as i64,
        _ => v,
    }
}

fn round_float(dtype: DType, x: f32) -> f32 {
    match dtype {
        DType::F16 => f16_to_f32(f32_to_f16(x)),
        DType::Bf16 => f32::from_bits((f32_to_bf16(x) as u32) << 16),
        _ => x,
    }
}

fn read_external(t: &TensorProto, model_dir: Option<&Path>) -> Result<Vec<u8>> {
    let name = &t.name;
    let mut location = None;
    let mut offset = 0u64;
    let mut length = None;
    for e in &t.external_data {
        let parse = |v: &str| {
            v.parse::<u64>().map_err(|_| {
                crate::error::CompileError::new(
                    ErrorKind::Decode,
                    format!(
                        "tensor '{name}': external_data {} = '{v}' is not a number",
                        e.key
                    ),
                )
            })
        };
        match e.key.as_str() {
            "location" => location = Some(e.value.clone()),
            "offset" => offset = parse(&e.value)?,
            "length" => length = Some(parse(&e.value)?),
            _ => {}
        }
    }
    let Some(location) = location else {
        return err(
            ErrorKind::Decode,
            format!("tensor '{name}' has external data without a location"),
        );
    };
    let rel = Path::new(&location);
    if rel.is_absolute()
        || rel
            .components()
            .any(|c| matches!(c, Component::ParentDir | Component::Prefix(_)))
    {
        return err(
            ErrorKind::Io,
            format!(
                "tensor '{name}': external data location '{location}' leaves the model's directory"
            ),
        );
    }
    let Some(dir) = model_dir else {
        return err(
            ErrorKind::Io,
            format!(
                "tensor '{name}' has external data ('{location}') but no model directory was given"
            ),
        );
    };
    let path = dir.join(rel);
    let bytes = std::fs::read(&path).map_err(|e| {
        crate::error::CompileError::new(
            ErrorKind::Io,
            format!(
                "tensor '{name}': reading external data {}: {e}",
                path.display()
            ),
        )
    })?;
    let start = offset as usize;
    let end = match length {
        Some(l) => offset.checked_add(l).map(|e| e as usize),
        None => Some(bytes.len()),
    };
    match end {
        Some(end) if start <= end && end <= bytes.len() => Ok(bytes[start..end].to_vec()),
        _ => err(
            ErrorKind::Io,
            format!(
                "tensor '{name}': external data range {offset}+{length:?} is outside {} ({} bytes)",
                path.display(),
                bytes.len()
            ),
        ),
    }
}

/// Decodes an ONNX `TensorProto` file image (the `.pb` files of the node tests).
pub fn decode_tensor_pb(bytes: &[u8]) -> Result<(String, HostTensor)> {
    let t = TensorProto::decode(bytes).map_err(|e| {
        crate::error::CompileError::new(ErrorKind::Decode, format!("not a TensorProto: {e}"))
    })?;
    let h = HostTensor::from_proto(&t, None)?;
    Ok((t.name, h))
}

/// Encodes a tensor as an ONNX `TensorProto` file image.
pub fn encode_tensor_pb(name: &str, t: &HostTensor) -> Vec<u8> {
    t.to_proto(name).encode_to_vec()
}

/// Reads an ONNX `TensorProto` `.pb` file: its name (may be empty) and tensor.
pub fn read_tensor_pb(path: &Path) -> Result<(String, HostTensor)> {
    let bytes = std::fs::read(path).map_err(|e| {
        crate::error::CompileError::new(ErrorKind::Io, format!("reading {}: {e}", path.display()))
    })?;
    decode_tensor_pb(&bytes).map_err(|mut e| {
        e.message = format!("{}: {}", path.display(), e.message);
        e
    })
}

/// Writes an ONNX `TensorProto` `.pb` file.
pub fn write_tensor_pb(path: &Path, name: &str, t: &HostTensor) -> Result<()> {
    write_tensor_pb_raw(path, name, t.dtype, &t.shape, &t.to_bytes())
}

/// Writes an ONNX `TensorProto` `.pb` file of a `dtype` tensor of `shape` whose elements are
/// `raw` — little-endian, in the element layout the device and ONNX's `raw_data` share —
/// without a host copy of them: the small fields are encoded, then the `raw_data` field
/// (number 9) is written straight from `raw`: the bytes of [`encode_tensor_pb`] for the same
/// tensor (protobuf writes fields in number order; `raw_data` is the last one set).
pub fn write_tensor_pb_raw(
    path: &Path,
    name: &str,
    dtype: DType,
    shape: &[usize],
    raw: &[u8],
) -> Result<()> {
    use std::io::Write;
    let expected = shape
        .iter()
        .try_fold(dtype.size(), |n, &d| n.checked_mul(d));
    if expected != Some(raw.len()) {
        return err(
            ErrorKind::ShapeMismatch,
            format!(
                "{} bytes of data for a {dtype} tensor of shape {shape:?}",
                raw.len()
            ),
        );
    }
    let mut head = TensorProto {
        dims: shape.iter().map(|&d| d as i64).collect(),
        data_type: dtype_to_onnx(dtype),
        name: name.to_owned(),
        ..Default::default()
    }
    .encode_to_vec();
    if !raw.is_empty() {
        prost::encoding::encode_key(9, prost::encoding::WireType::LengthDelimited, &mut head);
        prost::encoding::encode_varint(raw.len() as u64, &mut head);
    }
    let io = |e: std::io::Error| {
        crate::error::CompileError::new(ErrorKind::Io, format!("writing {}: {e}", path.display()))
    };
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).map_err(io)?);
    f.write_all(&head).map_err(io)?;
    f.write_all(raw).map_err(io)?;
    f.flush().map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raw_pb_is_the_encoded_tensor() {
        let dir = std::env::temp_dir().join(format!("nrt-raw-pb-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("t.pb");
        let cases = [
            HostTensor::f32(vec![2, 3], vec![1.0, -2.5, 3.0, f32::MAX, 0.0, -0.0]),
            HostTensor::ints(DType::I64, vec![3], vec![-1, 1 << 40, 7]),
            HostTensor::ints(DType::U8, vec![0], vec![]),
            HostTensor::f32(vec![], vec![4.5]),
        ];
        for t in cases {
            let raw = t.to_bytes();
            write_tensor_pb_raw(&f, "out", t.dtype, &t.shape, &raw).unwrap();
            assert_eq!(
                std::fs::read(&f).unwrap(),
                encode_tensor_pb("out", &t),
                "{t:?}"
            );
            assert_eq!(read_tensor_pb(&f).unwrap(), ("out".to_owned(), t));
        }
        // A size that does not match the shape is refused, naming both.
        let e = write_tensor_pb_raw(&f, "x", DType::F32, &[2, 2], &[0; 12]).unwrap_err();
        assert!(
            e.message.contains("12 bytes") && e.message.contains("[2, 2]"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn half_round_trips() {
        for x in [0.0f32, 1.0, -2.5, 65504.0, 1e-5, 0.333] {
            let y = f16_to_f32(f32_to_f16(x));
            assert!((x - y).abs() <= x.abs() * 1e-3 + 1e-7, "{x} {y}");
        }
        assert!(f16_to_f32(f32_to_f16(1e6)).is_infinite());
    }

    #[test]
    fn pb_round_trip() {
        let t = HostTensor::f32(vec![2, 2], vec![1.0, 2.0, 3.0, 4.0]);
        let (n, u) = decode_tensor_pb(&encode_tensor_pb("x", &t)).unwrap();
        assert_eq!(n, "x");
        assert_eq!(u, t);
        let t = HostTensor::ints(DType::I8, vec![3], vec![-1, 2, 300]);
        assert_eq!(t.to_i64s(), vec![-1, 2, 44]);
        let (_, u) = decode_tensor_pb(&encode_tensor_pb("", &t)).unwrap();
        assert_eq!(u, t);
    }
}
