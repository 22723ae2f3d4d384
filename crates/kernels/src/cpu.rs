//! What the kernels may use of the CPU: the instruction sets detected at run time
//! (`is_x86_feature_detected!`, a cached load), capped for the whole process by
//! `NRT_SIM_ISA`.
//!
//! The binaries are built for x86-64-v3 (AVX2 + FMA) and pick their AVX-512 (F, BW, VL,
//! BF16, VNNI) and AMX kernels where the CPU has them. `NRT_SIM_ISA=avx2` keeps every one of
//! those off, so the software NeuronCore computes as on a CPU without them: to reproduce an
//! AVX2-only host's results and speed on this one, and to run the test suites over the AVX2
//! kernels (`scripts/test.sh` runs this crate's tests and the conformance suites once so).
//! Every dispatch in this crate asks here, never the CPU directly, except the tests of an
//! AVX-512 kernel itself.

use std::sync::OnceLock;

/// The environment variable that caps the kernels' instruction sets.
pub const ISA_VAR: &str = "NRT_SIM_ISA";

/// A cap on the kernels' instruction sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IsaCap {
    /// Everything the CPU has (the default).
    Native,
    /// AVX2 and FMA at most: no AVX-512 of any kind, no AMX.
    Avx2,
}

impl IsaCap {
    /// The values [`ISA_VAR`] takes, for error messages.
    pub const VALUES: &'static str = "native, avx2";

    /// Parses a value of [`ISA_VAR`] (case-insensitive; surrounding blanks ignored).
    pub fn parse(v: &str) -> Option<IsaCap> {
        match v.trim().to_ascii_lowercase().as_str() {
            "native" => Some(IsaCap::Native),
            "avx2" => Some(IsaCap::Avx2),
            _ => None,
        }
    }

    /// This process's cap: [`ISA_VAR`], read once. Unset, or a value that does not parse, is
    /// [`IsaCap::Native`] here; the software device's configuration refuses a bad value with
    /// an error that names the variable, before any kernel runs.
    #[inline]
    pub fn current() -> IsaCap {
        static CAP: OnceLock<IsaCap> = OnceLock::new();
        *CAP.get_or_init(|| {
            std::env::var(ISA_VAR)
                .ok()
                .and_then(|v| IsaCap::parse(&v))
                .unwrap_or(IsaCap::Native)
        })
    }
}

/// Whether AVX-512 kernels may run at all (the cap allows them).
#[inline]
fn avx512_allowed() -> bool {
    IsaCap::current() == IsaCap::Native
}

/// Whether the kernels may use AVX-512F.
#[inline]
pub fn avx512f() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        avx512_allowed() && std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the kernels may use AVX-512F, BW and VL.
#[inline]
pub fn avx512_bw_vl() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        avx512f()
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the kernels may use AVX-512 BF16 (with F, BW and VL).
#[inline]
pub fn avx512bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        avx512_bw_vl() && std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the kernels may use AVX-512 VNNI (with F, BW and VL).
#[inline]
pub fn avx512vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        avx512_bw_vl() && std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the kernels may use AVX2 and FMA (never capped: the binaries' baseline).
#[inline]
pub fn avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_parses_its_two_values_and_nothing_else() {
        assert_eq!(IsaCap::parse("native"), Some(IsaCap::Native));
        assert_eq!(IsaCap::parse(" AVX2\n"), Some(IsaCap::Avx2));
        for bad in ["", "avx512", "avx", "sse2", "avx2,fma"] {
            assert_eq!(IsaCap::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn each_feature_implies_the_ones_it_builds_on() {
        assert!(!avx512_bw_vl() || avx512f());
        assert!(!avx512bf16() || avx512_bw_vl());
        assert!(!avx512vnni() || avx512_bw_vl());
        if IsaCap::current() == IsaCap::Avx2 {
            assert!(!avx512f());
        }
    }
}
