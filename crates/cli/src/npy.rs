//! `.npy` (NumPy) tensors for `nrt run`: inputs are read by the compiler's strict, bounded
//! reader ([`nrt_compiler::npy`]) as the file's element type and converted to the model
//! input's; outputs are written through the `npyz` crate as float32 (float16/bfloat16
//! outputs widened), int64 … uint8 as themselves, bool as uint8.

use crate::session::Res;
use npyz::WriterBuilder;
use nrt_compiler::HostTensor;
use nrt_hal::DType;
use std::io::BufWriter;
use std::path::Path;

/// Reads a C-order `.npy` file ([`nrt_compiler::npy::read`]).
pub fn read(path: &Path) -> Res<HostTensor> {
    nrt_compiler::npy::read(path)
}

/// Writes `t` as a C-order `.npy` file.
pub fn write(path: &Path, t: &HostTensor) -> Res<()> {
    let what = path.display();
    let shape: Vec<u64> = t.shape.iter().map(|&d| d as u64).collect();
    let f = std::fs::File::create(path).map_err(|e| format!("{what}: {e}"))?;
    let n = t.len();
    let bytes = t.to_bytes();
    let words = || {
        bytes
            .chunks_exact(8)
            .map(|c| <[u8; 8]>::try_from(c).unwrap_or([0; 8]))
    };
    macro_rules! write_iter {
        ($t:ty, $values:expr) => {{
            let mut w = npyz::WriteOptions::<$t>::new()
                .default_dtype()
                .shape(&shape)
                .writer(BufWriter::new(f))
                .begin_nd()
                .map_err(|e| format!("{what}: {e}"))?;
            w.extend($values).map_err(|e| format!("{what}: {e}"))?;
            w.finish().map_err(|e| format!("{what}: {e}"))
        }};
    }
    match t.dtype {
        DType::F32 | DType::F16 | DType::Bf16 => {
            write_iter!(f32, (0..n).map(|i| t.get_f64(i) as f32))
        }
        DType::F64 => write_iter!(f64, (0..n).map(|i| t.get_f64(i))),
        DType::I8 => write_iter!(i8, (0..n).map(|i| t.get_f64(i) as i8)),
        DType::U8 | DType::Bool => write_iter!(u8, (0..n).map(|i| t.get_f64(i) as u8)),
        DType::I16 => write_iter!(i16, (0..n).map(|i| t.get_f64(i) as i16)),
        DType::U16 => write_iter!(u16, (0..n).map(|i| t.get_f64(i) as u16)),
        DType::I32 => write_iter!(i32, (0..n).map(|i| t.get_f64(i) as i32)),
        DType::U32 => write_iter!(u32, (0..n).map(|i| t.get_f64(i) as u32)),
        // 64-bit integers exactly, through their bytes (not f64).
        DType::I64 => write_iter!(i64, words().map(i64::from_le_bytes)),
        DType::U64 => write_iter!(u64, words().map(u64::from_le_bytes)),
    }
}
