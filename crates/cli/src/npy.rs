//! `.npy` (NumPy) tensors for `nrt run`, through the `npyz` crate: inputs are read as the
//! file's element type and converted to the model input's; outputs are written as float32
//! (float16/bfloat16 outputs widened), int64 … uint8 as themselves, bool as uint8.

use crate::session::Res;
use npyz::WriterBuilder;
use nrt_compiler::HostTensor;
use nrt_hal::DType;
use std::io::{BufReader, BufWriter};
use std::path::Path;

/// Reads a C-order `.npy` file.
pub fn read(path: &Path) -> Res<HostTensor> {
    let what = path.display();
    let f = std::fs::File::open(path).map_err(|e| format!("{what}: {e}"))?;
    let npy = npyz::NpyFile::new(BufReader::new(f)).map_err(|e| format!("{what}: {e}"))?;
    if npy.order() != npyz::Order::C {
        return Err(format!("{what}: Fortran-order arrays are not supported"));
    }
    let shape = npy
        .shape()
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| format!("{what}: dimension {d} is too large")))
        .collect::<Res<Vec<usize>>>()?;
    let npyz::DType::Plain(ts) = npy.dtype() else {
        return Err(format!("{what}: structured arrays are not supported"));
    };
    let code = ts.to_string();
    let bad = |e: std::io::Error| format!("{what}: {e}");
    let floats = |v: Vec<f64>, shape| Ok(HostTensor::from_f64s(DType::F32, shape, v.into_iter()));
    macro_rules! ints {
        ($t:ty, $d:expr) => {{
            let v: Vec<$t> = npy.into_vec().map_err(bad)?;
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            HostTensor::from_bytes($d, shape, &bytes).map_err(|e| format!("{what}: {e}"))
        }};
    }
    match &code[1..] {
        "f4" => {
            let v: Vec<f32> = npy.into_vec().map_err(bad)?;
            floats(v.into_iter().map(f64::from).collect(), shape)
        }
        "f8" => floats(npy.into_vec::<f64>().map_err(bad)?, shape),
        "i1" => ints!(i8, DType::I8),
        "u1" | "b1" => ints!(u8, DType::U8),
        "i2" => ints!(i16, DType::I16),
        "u2" => ints!(u16, DType::U16),
        "i4" => ints!(i32, DType::I32),
        "u4" => ints!(u32, DType::U32),
        "i8" => ints!(i64, DType::I64),
        "u8" => ints!(u64, DType::U64),
        _ => Err(format!(
            "{what}: element type {code} is not supported (float32/64, int8..64, uint8..64, bool)"
        )),
    }
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
