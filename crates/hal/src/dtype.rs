//! Element types, in the hardware encoding of the current public `nrt.h` (`nrt_dtype_t`).
//!
//! The public header moved the enum into `nrt.h` in SDK 2.28 and switched to the hardware
//! encoding (`FLOAT32 = 0xA`, `BFLOAT16 = 0x6`, …); older headers used sequential values.
//! We use the hardware encoding everywhere: in the compiled-model container, in tensor info,
//! and in the C ABI.
//!
//! Two extensions: [`DType::Bool`] (`0x10`), which ONNX needs for `Equal` and `Where`, stored
//! as one byte per element and reported through the C API as `NRT_DTYPE_UINT8`; and
//! [`DType::F64`] (`0x11`, `NRT_DTYPE_FLOAT64` in `nrt_experimental.h`), ONNX's `double`,
//! a storage type like the halves: the engines compute in f32.

use core::fmt;

/// An element type.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// `NRT_DTYPE_UINT64`.
    U64 = 0x1,
    /// `NRT_DTYPE_INT8`.
    I8 = 0x2,
    /// `NRT_DTYPE_UINT8`.
    U8 = 0x3,
    /// `NRT_DTYPE_INT16`.
    I16 = 0x4,
    /// `NRT_DTYPE_UINT16`.
    U16 = 0x5,
    /// `NRT_DTYPE_BFLOAT16` (storage only: the engines compute in fp32).
    Bf16 = 0x6,
    /// `NRT_DTYPE_FLOAT16` (storage only: the engines compute in fp32).
    F16 = 0x7,
    /// `NRT_DTYPE_INT32`.
    I32 = 0x8,
    /// `NRT_DTYPE_UINT32`.
    U32 = 0x9,
    /// `NRT_DTYPE_FLOAT32`.
    F32 = 0xA,
    /// `NRT_DTYPE_INT64`.
    I64 = 0xC,
    /// Boolean, one byte per element (our extension; `NRT_DTYPE_UINT8` in the C ABI).
    Bool = 0x10,
    /// IEEE double (our extension, `NRT_DTYPE_FLOAT64` = 0x11 in `nrt_experimental.h`;
    /// storage only: the engines compute in fp32).
    F64 = 0x11,
}

impl DType {
    /// Every type, in encoding order.
    pub const ALL: [DType; 13] = [
        Self::U64,
        Self::I8,
        Self::U8,
        Self::I16,
        Self::U16,
        Self::Bf16,
        Self::F16,
        Self::I32,
        Self::U32,
        Self::F32,
        Self::I64,
        Self::Bool,
        Self::F64,
    ];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            Self::I8 | Self::U8 | Self::Bool => 1,
            Self::I16 | Self::U16 | Self::Bf16 | Self::F16 => 2,
            Self::I32 | Self::U32 | Self::F32 => 4,
            Self::I64 | Self::U64 | Self::F64 => 8,
        }
    }

    /// The encoding (the value stored in files and passed through the C ABI).
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// The value of `nrt_dtype_t` a C caller sees (`Bool` shows as `UINT8`).
    pub const fn nrt_code(self) -> u32 {
        match self {
            Self::Bool => Self::U8 as u32,
            other => other as u32,
        }
    }

    /// Decodes an encoding; `None` for values that are not a [`DType`].
    pub const fn from_code(code: u8) -> Option<DType> {
        Some(match code {
            0x1 => Self::U64,
            0x2 => Self::I8,
            0x3 => Self::U8,
            0x4 => Self::I16,
            0x5 => Self::U16,
            0x6 => Self::Bf16,
            0x7 => Self::F16,
            0x8 => Self::I32,
            0x9 => Self::U32,
            0xA => Self::F32,
            0xC => Self::I64,
            0x10 => Self::Bool,
            0x11 => Self::F64,
            _ => return None,
        })
    }

    /// The lower-case name used in messages and by the CLI (`f32`, `i64`, …).
    pub const fn name(self) -> &'static str {
        match self {
            Self::U64 => "u64",
            Self::I8 => "i8",
            Self::U8 => "u8",
            Self::I16 => "i16",
            Self::U16 => "u16",
            Self::Bf16 => "bf16",
            Self::F16 => "f16",
            Self::I32 => "i32",
            Self::U32 => "u32",
            Self::F32 => "f32",
            Self::I64 => "i64",
            Self::Bool => "bool",
            Self::F64 => "f64",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hardware_encoding_of_the_public_header() {
        assert_eq!(DType::F32.code(), 0xA);
        assert_eq!(DType::Bf16.code(), 0x6);
        assert_eq!(DType::F16.code(), 0x7);
        assert_eq!(DType::I64.code(), 0xC);
        assert_eq!(DType::U64.code(), 0x1);
        assert_eq!(DType::Bool.nrt_code(), 0x3);
        for d in DType::ALL {
            assert_eq!(DType::from_code(d.code()), Some(d));
        }
        assert_eq!(DType::F64.nrt_code(), 0x11);
        for bad in [0u8, 0xB, 0xD, 0xE, 0xF, 0x12, 0xFF] {
            assert_eq!(DType::from_code(bad), None);
        }
    }
}
