//! The tensor classes: `TensorInfo` (one input or output of a model) and `Tensor` (a tensor
//! in device memory, made from and read back into numpy arrays).

use crate::arrays::{
    contiguous, data_ptr, descr, device_dtype, dtype_name, nbytes, new_array, shape_str,
};
use crate::error::{from_rt, invalid, nrt_err};
use crate::runtime::global;
use nrt_hal::{DType, NrtStatus};
use nrt_runtime::{Placement, Tensor as RtTensor};
use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use std::mem::ManuallyDrop;

/// One input or output of a model: `name`, `shape` (tuple), `dtype` (numpy dtype), `size`
/// (bytes).
#[pyclass(frozen, module = "nrt", name = "TensorInfo")]
#[derive(Debug)]
pub(crate) struct TensorInfo {
    pub(crate) name: String,
    pub(crate) shape: Vec<usize>,
    pub(crate) dtype: Py<PyArrayDescr>,
    ndtype: DType,
    pub(crate) size: u64,
}

#[pymethods]
impl TensorInfo {
    /// The tensor's name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }
    /// The shape, as a tuple of ints.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.shape)
    }
    /// The element type, as a numpy dtype (bfloat16: ml_dtypes.bfloat16 if installed, else
    /// uint16).
    #[getter]
    fn dtype(&self, py: Python<'_>) -> Py<PyArrayDescr> {
        self.dtype.clone_ref(py)
    }
    /// Size in bytes.
    #[getter]
    fn size(&self) -> u64 {
        self.size
    }
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "TensorInfo(name={:?}, shape={}, dtype={}, size={})",
            self.name,
            shape_str(&self.shape),
            dtype_name(self.dtype.bind(py)),
            self.size
        )
    }
}

impl TensorInfo {
    pub(crate) fn from_rt(py: Python<'_>, i: &nrt_runtime::TensorInfo) -> PyResult<TensorInfo> {
        Ok(TensorInfo {
            name: i.name.clone(),
            shape: i.shape.iter().map(|&d| d as usize).collect(),
            dtype: descr(py, i.dtype)?.unbind(),
            ndtype: i.dtype,
            size: i.size,
        })
    }

    /// Whether `d` is acceptable for this tensor (bf16 also takes uint16).
    pub(crate) fn accepts(&self, py: Python<'_>, d: &Bound<'_, PyArrayDescr>) -> bool {
        d.is_equiv_to(self.dtype.bind(py))
            || (self.ndtype == DType::Bf16 && d.is_equiv_to(&numpy::dtype::<u16>(py)))
    }
}

/// A tensor in device memory of one logical core. Pass it in a model's input dict to skip
/// the host-to-device copy; read it back with `.numpy()`.
#[pyclass(frozen, module = "nrt", name = "Tensor")]
#[derive(Debug)]
pub(crate) struct Tensor {
    /// Dropped only in the process that made it (a fork child leaks it: freeing device
    /// memory takes the parent device's locks).
    pub(crate) t: ManuallyDrop<RtTensor>,
    /// The process whose runtime holds it.
    pid: u32,
    pub(crate) shape: Vec<usize>,
    pub(crate) dtype: Py<PyArrayDescr>,
    pub(crate) core: u32,
}

impl Drop for Tensor {
    fn drop(&mut self) {
        if self.pid == std::process::id() {
            // SAFETY: `t` is dropped once, here, and not used again.
            unsafe { ManuallyDrop::drop(&mut self.t) };
        }
    }
}

impl Tensor {
    /// `Ok` in the process that made it; in a fork child, the error saying so.
    pub(crate) fn check_owner(&self) -> PyResult<()> {
        if self.pid == std::process::id() {
            return Ok(());
        }
        Err(nrt_err(
            NrtStatus::InvalidHandle,
            format!(
                "nrt.Tensor '{}' belongs to the runtime of the parent process (pid {}); this \
                 process is a fork of it, where that runtime cannot run: make the tensor again \
                 in this process",
                self.t.name(),
                self.pid
            ),
        ))
    }
}

#[pymethods]
impl Tensor {
    /// Copies a numpy array into a new device tensor on logical core `core`.
    #[staticmethod]
    #[pyo3(signature = (array, core=0, name=None))]
    fn from_numpy(
        py: Python<'_>,
        array: &Bound<'_, PyAny>,
        core: u32,
        name: Option<&str>,
    ) -> PyResult<Tensor> {
        let name = name.unwrap_or("tensor");
        let a = contiguous(py, array)?;
        let dtype = device_dtype(py, &a.dtype(), &format!("Tensor.from_numpy('{name}')"))?;
        let g = global(py)?;
        let size = nbytes(&a) as u64;
        let t =
            g.rt.allocate_tensor(Placement::Device, core as i32, size, name)
                .map_err(from_rt)?;
        let p = data_ptr(&a) as usize;
        let n = size as usize;
        // SAFETY: `a` is a C-contiguous array of `n` bytes that we keep referenced (and so
        // alive) for the whole call; the slice is only read.
        let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, n) };
        py.allow_threads(|| t.write(bytes, 0)).map_err(from_rt)?;
        Ok(Tensor {
            t: ManuallyDrop::new(t),
            pid: g.pid,
            shape: a.shape().to_vec(),
            dtype: dtype.unbind(),
            core,
        })
    }

    /// Copies the tensor into a new numpy array.
    fn numpy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyUntypedArray>> {
        self.check_owner()?;
        let a = new_array(py, self.dtype.bind(py), &self.shape)?;
        let (p, n) = (data_ptr(&a) as usize, nbytes(&a));
        // SAFETY: `a` is a fresh C-contiguous array of `n` bytes that nobody else sees yet.
        let buf = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, n) };
        py.allow_threads(|| self.t.read(buf, 0)).map_err(from_rt)?;
        Ok(a)
    }

    /// Overwrites the tensor with `array` (same shape and dtype).
    fn write(&self, py: Python<'_>, array: &Bound<'_, PyAny>) -> PyResult<()> {
        self.check_owner()?;
        let a = contiguous(py, array)?;
        device_dtype(
            py,
            &a.dtype(),
            &format!("Tensor.write('{}')", self.t.name()),
        )?;
        if a.shape() != self.shape.as_slice() || !a.dtype().is_equiv_to(self.dtype.bind(py)) {
            return Err(invalid(format!(
                "tensor '{}' is {} {}; got {} {}",
                self.t.name(),
                shape_str(&self.shape),
                dtype_name(self.dtype.bind(py)),
                shape_str(a.shape()),
                dtype_name(&a.dtype())
            )));
        }
        let (p, n) = (data_ptr(&a) as usize, nbytes(&a));
        // SAFETY: as in `from_numpy`.
        let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, n) };
        py.allow_threads(|| self.t.write(bytes, 0)).map_err(from_rt)
    }

    /// The shape, as a tuple.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.shape)
    }
    /// The numpy dtype.
    #[getter]
    fn dtype(&self, py: Python<'_>) -> Py<PyArrayDescr> {
        self.dtype.clone_ref(py)
    }
    /// The logical core it lives on.
    #[getter]
    fn core(&self) -> u32 {
        self.core
    }
    /// Size in bytes.
    #[getter]
    fn size(&self) -> u64 {
        self.t.size()
    }
    /// The name given at creation.
    #[getter]
    fn name(&self) -> &str {
        self.t.name()
    }
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "Tensor(name={:?}, shape={}, dtype={}, core={})",
            self.t.name(),
            shape_str(&self.shape),
            dtype_name(self.dtype.bind(py)),
            self.core
        )
    }
}
