//! Helpers shared by the `reference_*` tests: the arena size, the proptest configuration,
//! random element bits, random matmul epilogues and the activation reference.

// Reference code indexes dimensions explicitly: clearer than iterator chains here.
#![allow(clippy::needless_range_loop)]

use super::{Arena, Rng, erf64};
use nrt_hal::DType;
use nrt_isa::{AccessPattern, ActFunc, Epilogue};
use nrt_kernels::elem::{f32_to_bf16, f32_to_f16};
use proptest::prelude::*;

pub const ARENA: usize = 4 << 20;

pub fn cfg(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Random element bits for a type: small and edge values, NaN and infinities for floats.
pub fn random_bits(rng: &mut Rng, d: DType) -> u64 {
    match d {
        DType::F32 | DType::F16 | DType::Bf16 => {
            let x = match rng.below(10) {
                0 => f32::NAN,
                1 => [f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0][rng.below(4) as usize],
                2 => rng.f32(-1e6, 1e6),
                3 => rng.f32(-70000.0, 70000.0),
                _ => rng.f32(-300.0, 300.0),
            };
            match d {
                DType::F32 => x.to_bits() as u64,
                DType::F16 => f32_to_f16(x) as u64,
                _ => f32_to_bf16(x) as u64,
            }
        }
        DType::Bool => rng.below(3),
        DType::F64 => match rng.below(10) {
            0 => f64::NAN,
            1 => [f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0][rng.below(4) as usize],
            _ => rng.f32(-1e6, 1e6) as f64 * (1.0 + 1e-9),
        }
        .to_bits(),
        _ => {
            let bits = rng.next();
            let w = d.size() * 8;
            if w == 64 { bits } else { bits & ((1 << w) - 1) }
        }
    }
}

/// A random epilogue for a `csh` output: a bias broadcast per column, per row, as a scalar
/// or full, a residual in a random layout, and an activation, each maybe absent.
pub fn random_epilogue(rng: &mut Rng, m: &mut Arena, csh: [u32; 4]) -> Epilogue {
    let n = csh[3];
    let mut e = Epilogue::NONE;
    e.bias = match rng.below(5) {
        0 => None,
        1 => Some(m.random(rng, DType::F32, csh, true)),
        2 => Some(AccessPattern {
            shape: csh,
            stride: [0, 0, 1, 0],
            ..m.dense(DType::F32, [1, 1, 1, csh[2]])
        }),
        3 => Some(AccessPattern {
            shape: csh,
            stride: [0; 4],
            ..m.dense(DType::F32, [1, 1, 1, 1])
        }),
        _ => Some(AccessPattern {
            shape: csh,
            stride: [0, 0, 0, 1],
            ..m.dense(DType::F32, [1, 1, 1, n])
        }),
    };
    if rng.chance(0.5) {
        e.residual = Some(m.random(rng, DType::F32, csh, true));
    }
    const FUNCS: [ActFunc; 8] = [
        ActFunc::Identity,
        ActFunc::Relu,
        ActFunc::LeakyRelu,
        ActFunc::Sigmoid,
        ActFunc::Tanh,
        ActFunc::GeluErf,
        ActFunc::GeluTanh,
        ActFunc::Clip,
    ];
    e.func = FUNCS[rng.below(FUNCS.len() as u64) as usize];
    (e.act_alpha, e.act_beta) = match e.func {
        ActFunc::LeakyRelu => (0.1, 0.0),
        ActFunc::Clip => (-0.5, 0.75),
        _ => (0.0, 0.0),
    };
    for x in [&e.bias, &e.residual].into_iter().flatten() {
        m.fill_f32(x, rng, -1.0, 1.0);
    }
    e
}

pub fn act_ref(f: ActFunc, x: f64, alpha: f64, beta: f64) -> f64 {
    use ActFunc::*;
    match f {
        Identity => x,
        Relu => {
            if x < 0.0 {
                0.0
            } else {
                x
            }
        }
        LeakyRelu => {
            if x < 0.0 {
                alpha * x
            } else {
                x
            }
        }
        Sigmoid => 1.0 / (1.0 + (-x).exp()),
        HardSigmoid => (alpha * x + beta).clamp(0.0, 1.0),
        Tanh => x.tanh(),
        GeluErf => 0.5 * x * (1.0 + erf64(x / 2f64.sqrt())),
        GeluTanh => {
            0.5 * x
                * (1.0 + ((2.0 / core::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
        }
        Erf => erf64(x),
        Exp => x.exp(),
        Log => x.ln(),
        Sqrt => x.sqrt(),
        Rsqrt => 1.0 / x.sqrt(),
        Reciprocal => 1.0 / x,
        Clip => {
            if x < alpha {
                alpha
            } else if x > beta {
                beta
            } else {
                x
            }
        }
        Abs => x.abs(),
        Neg => -x,
        Elu => {
            if x < 0.0 {
                alpha * x.exp_m1()
            } else {
                x
            }
        }
        Softplus => x.exp().ln_1p(),
        Floor => x.floor(),
        Ceil => x.ceil(),
        Square => x * x,
        Tan => x.tan(),
        Asin => x.asin(),
        Acos => x.acos(),
        Atan => x.atan(),
        Sinh => x.sinh(),
        Cosh => x.cosh(),
        Asinh => x.asinh(),
        Acosh => x.acosh(),
        Atanh => x.atanh(),
        Round => x.round_ties_even(),
    }
}
