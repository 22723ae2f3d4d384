//! numpy dtypes and arrays: the dtype of each device element type (bfloat16 through
//! `ml_dtypes` when registered), the check that refuses every dtype the device has none for,
//! new uninitialized arrays, raw buffers of C-contiguous arrays, and how shapes and dtypes
//! are named in messages.

use crate::error::invalid;
use crate::lock;
use nrt_hal::DType;
use numpy::npyffi::{NpyTypes, PY_ARRAY_API, npy_intp};
use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use std::sync::Mutex;

/// `ml_dtypes.bfloat16` when the package is installed (set by `nrt/__init__.py`).
static BF16: Mutex<Option<Py<PyArrayDescr>>> = Mutex::new(None);

/// Registers the numpy dtype used for bfloat16 tensors (ml_dtypes.bfloat16).
#[pyfunction]
pub(crate) fn _set_bf16_dtype(dtype: Bound<'_, PyArrayDescr>) {
    *lock(&BF16) = Some(dtype.unbind());
}

pub(crate) fn descr(py: Python<'_>, d: DType) -> PyResult<Bound<'_, PyArrayDescr>> {
    let name = match d {
        DType::F32 => "float32",
        DType::F16 => "float16",
        DType::Bf16 => {
            if let Some(b) = lock(&BF16).as_ref() {
                return Ok(b.bind(py).clone());
            }
            "uint16"
        }
        DType::I8 => "int8",
        DType::U8 => "uint8",
        DType::I16 => "int16",
        DType::U16 => "uint16",
        DType::I32 => "int32",
        DType::U32 => "uint32",
        DType::I64 => "int64",
        DType::U64 => "uint64",
        DType::Bool => "bool",
        DType::F64 => "float64",
    };
    PyArrayDescr::new(py, name)
}

/// Every element type the device has.
const DEVICE_DTYPES: [DType; 13] = [
    DType::F32,
    DType::F16,
    DType::Bf16,
    DType::F64,
    DType::I8,
    DType::U8,
    DType::I16,
    DType::U16,
    DType::I32,
    DType::U32,
    DType::I64,
    DType::U64,
    DType::Bool,
];

/// `d` if it is one of the device's element types (in native byte order); otherwise the
/// error naming it. Object arrays (pointers to Python objects, whose references a byte copy
/// would not carry), strings, bytes, void/structured, datetime, timedelta and complex
/// arrays — anything the device has no type for — are refused here, before a byte of them
/// is copied.
pub(crate) fn device_dtype<'py>(
    py: Python<'py>,
    d: &Bound<'py, PyArrayDescr>,
    what: &str,
) -> PyResult<Bound<'py, PyArrayDescr>> {
    if !d.has_object() {
        for t in DEVICE_DTYPES {
            let dev = descr(py, t)?;
            if d.is_equiv_to(&dev) {
                return Ok(dev);
            }
        }
    }
    let names = DEVICE_DTYPES
        .iter()
        .map(|&t| descr(py, t).map(|d| dtype_name(&d)))
        .collect::<PyResult<Vec<_>>>()?
        .join(", ");
    Err(invalid(format!(
        "{what}: dtype {} ({}, kind '{}') is not an element type of the device ({names}, \
         in native byte order)",
        dtype_name(d),
        dtype_repr(d),
        d.kind() as char
    )))
}

/// A dtype as numpy spells it in `repr` (`dtype('<U3')`), so that object, string and
/// structured dtypes are named unambiguously.
fn dtype_repr(d: &Bound<'_, PyArrayDescr>) -> String {
    d.repr()
        .map(|s| s.to_string())
        .unwrap_or_else(|_| dtype_name(d))
}

/// A new, uninitialized, C-ordered array.
pub(crate) fn new_array<'py>(
    py: Python<'py>,
    dtype: &Bound<'py, PyArrayDescr>,
    shape: &[usize],
) -> PyResult<Bound<'py, PyUntypedArray>> {
    let mut dims: Vec<npy_intp> = shape.iter().map(|&d| d as npy_intp).collect();
    // SAFETY: PyArray_NewFromDescr steals the descriptor reference that `into_dtype_ptr`
    // hands over; `dims` holds `dims.len()` extents; null strides/data/obj ask numpy to
    // allocate a C-contiguous buffer. The GIL is held (`py`).
    let ptr = unsafe {
        PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            PY_ARRAY_API.get_type_object(py, NpyTypes::PyArray_Type),
            dtype.clone().into_dtype_ptr(),
            dims.len() as std::os::raw::c_int,
            dims.as_mut_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut(),
        )
    };
    // SAFETY: `ptr` is a new reference or null with a Python error set.
    let obj = unsafe { Bound::from_owned_ptr_or_err(py, ptr)? };
    Ok(obj.downcast_into::<PyUntypedArray>()?)
}

/// The data pointer of an array.
pub(crate) fn data_ptr(a: &Bound<'_, PyUntypedArray>) -> *mut u8 {
    // SAFETY: `as_array_ptr` is a live PyArrayObject (we hold a reference); reading its
    // `data` field does not touch the bytes.
    unsafe { (*a.as_array_ptr()).data.cast::<u8>() }
}

pub(crate) fn nbytes(a: &Bound<'_, PyUntypedArray>) -> usize {
    a.len() * a.dtype().itemsize()
}

/// A shape as Python prints a tuple.
pub(crate) fn shape_str(s: &[usize]) -> String {
    match s {
        [d] => format!("({d},)"),
        _ => format!(
            "({})",
            s.iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

pub(crate) fn dtype_name(d: &Bound<'_, PyArrayDescr>) -> String {
    d.str()
        .map(|s| s.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// `array` as a C-contiguous ndarray (one copy when it is not one already).
pub(crate) fn contiguous<'py>(
    py: Python<'py>,
    array: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyUntypedArray>> {
    if let Ok(a) = array.downcast::<PyUntypedArray>()
        && a.is_c_contiguous()
    {
        return Ok(a.clone());
    }
    let np = py.import("numpy")?;
    Ok(np
        .call_method1("ascontiguousarray", (array,))?
        .downcast_into::<PyUntypedArray>()?)
}
