//! Compiling and model bytes: `compile` (ONNX → NCM, from a path or bytes), what a model is
//! loaded from ([`Source`]), the ONNX graph signature `nrt` reads before compiling
//! (`_onnx_signature`), and the built-in near-null model (`_near_null`).

use crate::error::{from_rt, invalid};
use nrt_compiler::CompileOptions;
use nrt_runtime::NrtError as RtError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Where a model comes from: a path, or bytes (NCM).
#[derive(FromPyObject)]
pub(crate) enum Source {
    Bytes(Vec<u8>),
    Path(PathBuf),
}

pub(crate) fn shapes_opt(
    input_shapes: Option<BTreeMap<String, Vec<usize>>>,
) -> BTreeMap<String, Vec<usize>> {
    input_shapes.unwrap_or_default()
}

pub(crate) fn compile_path(
    path: &std::path::Path,
    input_shapes: BTreeMap<String, Vec<usize>>,
    cores: u32,
) -> Result<Vec<u8>, RtError> {
    let opts = CompileOptions {
        input_shapes,
        cores,
        ..CompileOptions::default()
    };
    let c = nrt_compiler::compile_file(path, &opts).map_err(|e| {
        RtError::invalid(format!(
            "compiling {}: {}",
            path.display(),
            compile_error(&e)
        ))
    })?;
    c.model
        .try_encode()
        .map_err(|e| RtError::invalid(format!("compiling {}: {e}", path.display())))
}

/// A compile error as Python says it: the compiler's text, then how to give what it asks for
/// in this API (keywords, not the CLI's flags).
fn compile_error(e: &nrt_compiler::CompileError) -> String {
    let mut s = e.to_string();
    if let Some(n) = &e.needs_shape_of {
        s.push_str(&format!(
            "; pass input_shapes={{'{n}': [d0, d1, ...]}} to nrt.Model.load or nrt.compile (nrt.InferenceSession takes it from the inputs)"
        ));
    }
    s
}

/// Compiles an ONNX model (a path, or the model's bytes) for the software NeuronCore and
/// returns the compiled model (NCM bytes). `input_shapes` binds symbolic dimensions.
#[pyfunction]
#[pyo3(signature = (path, input_shapes=None, cores=1))]
pub(crate) fn compile<'py>(
    py: Python<'py>,
    path: Source,
    input_shapes: Option<BTreeMap<String, Vec<usize>>>,
    cores: u32,
) -> PyResult<Bound<'py, PyBytes>> {
    let shapes = shapes_opt(input_shapes);
    let ncm = match path {
        Source::Path(p) => {
            crate::error::check_exists(&p)?;
            py.allow_threads(|| compile_path(&p, shapes, cores))
                .map_err(from_rt)?
        }
        Source::Bytes(b) => py
            .allow_threads(|| {
                let opts = CompileOptions {
                    input_shapes: shapes,
                    cores,
                    ..CompileOptions::default()
                };
                let c = nrt_compiler::compile(&b, None, &opts).map_err(|e| compile_error(&e))?;
                c.model.try_encode().map_err(|e| e.to_string())
            })
            .map_err(|e| invalid(format!("compiling <bytes>: {e}")))?,
    };
    Ok(PyBytes::new(py, &ncm))
}

type Sig = (String, Vec<Option<PyObject>>, i32);

/// The graph inputs (initializers excluded) and outputs of an ONNX file: (name, dims,
/// elem_type) with each dim an int, a str (symbolic) or None.
#[pyfunction]
#[allow(clippy::type_complexity)]
pub(crate) fn _onnx_signature(py: Python<'_>, path: PathBuf) -> PyResult<(Vec<Sig>, Vec<Sig>)> {
    crate::error::check_exists(&path)?;
    let bytes =
        std::fs::read(&path).map_err(|e| invalid(format!("reading {}: {e}", path.display())))?;
    let m = nrt_compiler::onnx::decode_model(&bytes)
        .map_err(|e| invalid(format!("{}: not a valid ONNX model: {e}", path.display())))?;
    let g = m
        .graph
        .ok_or_else(|| invalid(format!("{}: no graph", path.display())))?;
    let inits: std::collections::HashSet<&str> =
        g.initializer.iter().map(|t| t.name.as_str()).collect();
    let sig = |v: &nrt_compiler::onnx::ValueInfoProto| -> PyResult<Sig> {
        let t = v.r#type.as_ref().and_then(|t| t.tensor_type.as_ref());
        let elem = t.map(|t| t.elem_type).unwrap_or(0);
        let dims = t
            .and_then(|t| t.shape.as_ref())
            .map(|s| {
                s.dim
                    .iter()
                    .map(|d| -> PyResult<Option<PyObject>> {
                        Ok(match (d.dim_value, &d.dim_param) {
                            (Some(n), _) => Some(n.into_pyobject(py)?.into_any().unbind()),
                            (None, Some(p)) if !p.is_empty() => {
                                Some(p.into_pyobject(py)?.into_any().unbind())
                            }
                            _ => None,
                        })
                    })
                    .collect::<PyResult<Vec<_>>>()
            })
            .transpose()?
            .unwrap_or_default();
        Ok((v.name.clone(), dims, elem))
    };
    let ins = g
        .input
        .iter()
        .filter(|i| !inits.contains(i.name.as_str()))
        .map(sig)
        .collect::<PyResult<Vec<_>>>()?;
    let outs = g.output.iter().map(sig).collect::<PyResult<Vec<_>>>()?;
    Ok((ins, outs))
}

/// The built-in near-null model (NCM bytes): one tiny input and output, no compute; what
/// `nrt bench` times to measure the runtime's own overhead.
#[pyfunction]
#[pyo3(signature = (cores=1))]
pub(crate) fn _near_null<'py>(py: Python<'py>, cores: u32) -> Bound<'py, PyBytes> {
    PyBytes::new(py, &nrt_runtime::builtin::near_null(cores))
}
