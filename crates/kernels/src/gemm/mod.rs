//! The matrix products under the instruction kernels ([`crate::matmul`] for `MatMul`,
//! [`crate::qmatmul`] for `MatMulInteger`, and the convolutions): f32 GEMM and GEMV, the
//! packed-B microkernels (f32 and bf16), the half-precision (bf16/f16) products, AMX and the
//! int8 tiles.
//!
//! # Layering
//!
//! A file only imports from files below it (no cycles):
//!
//! | layer | file | imports from `gemm` |
//! |---|---|---|
//! | 4 | [`packed`]: packed-B GEMM entry points (f32, bf16), portable loops | `types`, `tile`, `packed_x86`, `amx`, `half` |
//! | 3 | [`half`]: bf16/f16 weights, AVX-512 | `types`, `sgemm` |
//! | 2 | [`sgemm`]: f32 GEMM for any strides (`private-gemm-x86`) | `types`, `gemv` |
//! | 2 | `packed_x86`: x86-64 microkernels of the packed GEMM | `tile` |
//! | 1 | [`gemv`]: f32 GEMV kernels (AVX2, AVX-512) | — |
//! | 1 | `tile`: the packed GEMM's tile driver (`Job`, `Tile`, `drive`) | `types` |
//! | 1 | [`amx`]: bf16 GEMM and int8 products on AMX | `types` |
//! | 1 | `int8`: the int8 tile kernels of `MatMulInteger` | — |
//! | 0 | [`types`]: [`Mat`], [`Packed`], [`PackedBf16`], [`TileEpilogue`], bf16 row rounding | — |

pub mod amx;
pub mod gemv;
pub mod half;
pub(crate) mod int8;
pub mod packed;
#[cfg(target_arch = "x86_64")]
mod packed_x86;
pub mod sgemm;
mod tile;
pub mod types;

pub use half::{Half, HalfMat, gemm_half};
pub use sgemm::{gemm_auto, gemm_f32, prepare_thread};
pub use types::{Mat, Packed, PackedBf16, TileEpilogue};
