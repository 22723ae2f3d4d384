//! # nrt-compiler — ONNX to NCM
//!
//! (Work in progress.)
