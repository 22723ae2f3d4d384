//! Runtime life cycle and queries: `nrt_init`, `nrt_close`, `nrt_get_version`,
//! `nrt_get_status_as_str`, the core counts, `nrt_get_instance_info`,
//! `nrt_get_vnc_memory_stats`.

use crate::ffi::{
    Res, api, api_value, cstr_or_empty, invalid, nonnull, write_out, write_struct_prefix,
};
use crate::state;
use crate::types::{
    NrtInstanceInfo, NrtStatusC, NrtVersion, NrtVncMemoryStats, copy_cstr, family, instance_size,
};
use nrt_runtime::NrtStatus;
use std::ffi::c_char;

/// `NRT_STATUS nrt_init(nrt_framework_type_t framework, const char *fw_version, const char
/// *fal_version)`: reads the environment (`NEURON_RT_*`, `NRT_SIM_FAULTS`) and starts the
/// runtime on a new software NeuronCore. `NRT_FAILURE` if one is already running (it is
/// kept); a new runtime after `nrt_close`.
///
/// # Safety
/// The version strings must be NULL or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_init(
    framework: u32,
    fw_version: *const c_char,
    fal_version: *const c_char,
) -> NrtStatusC {
    api("nrt_init", || {
        // Levels come from the environment at init; configure first so API:IN shows.
        nrt_runtime::log::configure_from_env();
        // SAFETY: the caller's contract on both strings.
        let (fw, fal) = unsafe {
            (
                cstr_or_empty(fw_version, "fw_version")?,
                cstr_or_empty(fal_version, "fal_version")?,
            )
        };
        crate::api_in!(
            "nrt_init",
            "framework={framework}, fw_version={fw:?}, fal_version={fal:?}"
        );
        if framework > crate::types::framework::PRECHECK {
            return Err(invalid(format!(
                "invalid argument: framework {framework} is not an nrt_framework_type_t"
            )));
        }
        state::init()
    })
}

/// `void nrt_close()`: drains in-flight executions, unloads every model (their handles
/// become stale), releases the cores and the software device. Tensor and tensor-set handles
/// may still be freed afterwards. A no-op (logged) before `nrt_init` or when closed.
#[unsafe(no_mangle)]
pub extern "C" fn nrt_close() {
    api("nrt_close", || {
        crate::api_in!("nrt_close", "");
        state::close()
    });
}

/// Runtime version we report: the libnrt release whose API this library implements.
const RT_VERSION: (u64, u64, u64, u64) = (2, 32, 0, 0);

/// `NRT_STATUS nrt_get_version(nrt_version_t *ver, size_t size)`: callable any time;
/// writes the first `size` bytes of the structure.
///
/// # Safety
/// `ver` must be valid for writes of `size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_version(ver: *mut NrtVersion, size: usize) -> NrtStatusC {
    api("nrt_get_version", || {
        crate::api_in!("nrt_get_version", "ver={ver:p}, size={size}");
        nonnull(ver, "ver")?;
        if size == 0 {
            return Err(invalid("invalid argument: size is 0"));
        }
        let mut v = NrtVersion {
            rt_major: RT_VERSION.0,
            rt_minor: RT_VERSION.1,
            rt_patch: RT_VERSION.2,
            rt_maintenance: RT_VERSION.3,
            rt_detail: [0; 128],
            git_hash: [0; 64],
        };
        copy_cstr(
            &mut v.rt_detail,
            concat!(
                "nrt-rs ",
                env!("CARGO_PKG_VERSION"),
                " (libnrt 2.32 API, NRT 3.0 async; software NeuronCore)"
            ),
        );
        copy_cstr(
            &mut v.git_hash,
            concat!("nrt-rs-", env!("CARGO_PKG_VERSION")),
        );
        // SAFETY: `ver` is writable for `size` bytes (caller's contract).
        unsafe { write_struct_prefix(ver, &v, size) };
        Ok(())
    })
}

const NAME_LEN: usize = 48;

const fn status_names() -> [[u8; NAME_LEN]; NrtStatus::ALL.len()] {
    let mut out = [[0u8; NAME_LEN]; NrtStatus::ALL.len()];
    let mut i = 0;
    while i < NrtStatus::ALL.len() {
        let s = NrtStatus::ALL[i].as_str().as_bytes();
        assert!(s.len() < NAME_LEN);
        let mut j = 0;
        while j < s.len() {
            out[i][j] = s[j];
            j += 1;
        }
        i += 1;
    }
    out
}

/// NUL-terminated status names, in `NrtStatus::ALL` order.
static STATUS_NAMES: [[u8; NAME_LEN]; NrtStatus::ALL.len()] = status_names();
static UNKNOWN_STATUS: &[u8] = b"NRT_UNKNOWN_STATUS\0";

/// `const char *nrt_get_status_as_str(NRT_STATUS status)`: the status's name
/// (`"NRT_SUCCESS"`, …), or `"NRT_UNKNOWN_STATUS"`. The string is static.
#[unsafe(no_mangle)]
pub extern "C" fn nrt_get_status_as_str(status: NrtStatusC) -> *const c_char {
    let unknown = UNKNOWN_STATUS.as_ptr().cast();
    api_value("nrt_get_status_as_str", unknown, || {
        Ok(
            match NrtStatus::ALL.iter().position(|s| s.as_i32() == status) {
                Some(i) => STATUS_NAMES[i].as_ptr().cast(),
                None => unknown,
            },
        )
    })
}

/// (physical cores per logical core, total logical cores, visible logical cores): from the
/// open runtime, or from the environment as `nrt_init` would see it.
fn core_counts() -> Res<(u32, u32)> {
    if let Ok(p) = state::runtime() {
        let lnc = p.rt.config().lnc();
        let total = p.rt.device().info().num_cores / lnc;
        return Ok((total, p.rt.vnc_count()));
    }
    let (cores, cfg) = state::device_cores_from_env()?;
    let selected = nrt_runtime::config::select_cores(&cfg, cores)?.len() as u32;
    Ok((cores / cfg.lnc(), selected / cfg.lnc()))
}

fn count_api(func: &'static str, out: *mut u32, visible: bool) -> NrtStatusC {
    api(func, || {
        crate::api_in!(func, "count={out:p}");
        nonnull(out, "vnc_count")?;
        let (total, vis) = core_counts()?;
        // SAFETY: non-null; the caller passes a valid `uint32_t *`.
        unsafe { write_out(out, if visible { vis } else { total }, "vnc_count") }
    })
}

/// `NRT_STATUS nrt_get_total_vnc_count(uint32_t *vnc_count)`: logical cores of the device;
/// callable before `nrt_init` (then from the environment).
///
/// # Safety
/// `vnc_count` must be valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_total_vnc_count(vnc_count: *mut u32) -> NrtStatusC {
    count_api("nrt_get_total_vnc_count", vnc_count, false)
}

/// Deprecated alias of [`nrt_get_total_vnc_count`].
///
/// # Safety
/// As [`nrt_get_total_vnc_count`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_total_nc_count(vnc_count: *mut u32) -> NrtStatusC {
    count_api("nrt_get_total_nc_count", vnc_count, false)
}

/// `NRT_STATUS nrt_get_visible_vnc_count(uint32_t *vnc_count)`: logical cores this process
/// owns (or would own: callable before `nrt_init`).
///
/// # Safety
/// `vnc_count` must be valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_visible_vnc_count(vnc_count: *mut u32) -> NrtStatusC {
    count_api("nrt_get_visible_vnc_count", vnc_count, true)
}

/// Deprecated alias of [`nrt_get_visible_vnc_count`].
///
/// # Safety
/// As [`nrt_get_visible_vnc_count`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_visible_nc_count(vnc_count: *mut u32) -> NrtStatusC {
    count_api("nrt_get_visible_nc_count", vnc_count, true)
}

/// `NRT_STATUS nrt_get_instance_info(nrt_instance_info_t *info, size_t instance_info_len)`:
/// family/size UNKNOWN, `arch_name` and `device_revision` of the software device. Writes the
/// first `instance_info_len` bytes.
///
/// # Safety
/// `info` must be valid for writes of `instance_info_len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_instance_info(
    info: *mut NrtInstanceInfo,
    instance_info_len: usize,
) -> NrtStatusC {
    api("nrt_get_instance_info", || {
        crate::api_in!(
            "nrt_get_instance_info",
            "info={info:p}, instance_info_len={instance_info_len}"
        );
        nonnull(info, "info")?;
        if instance_info_len == 0 {
            return Err(invalid("invalid argument: instance_info_len is 0"));
        }
        let rt = state::runtime()?;
        let d = rt.rt.device().info();
        let mut v = NrtInstanceInfo {
            family: family::UNKNOWN,
            size: instance_size::UNKNOWN,
            arch_name: [0; 16],
            device_revision: [0; 8],
        };
        copy_cstr(&mut v.arch_name, d.arch_name);
        copy_cstr(&mut v.device_revision, d.revision);
        // SAFETY: writable for `instance_info_len` bytes (caller's contract).
        unsafe { write_struct_prefix(info, &v, instance_info_len) };
        Ok(())
    })
}

/// `NRT_STATUS nrt_get_vnc_memory_stats(uint32_t vnc, nrt_vnc_memory_stats_t *stats, size_t
/// stats_size_in, size_t *stats_size_out)`: writes the first `stats_size_in` bytes;
/// `*stats_size_out` (optional, may be NULL) receives the bytes written.
///
/// # Safety
/// `stats` must be valid for writes of `stats_size_in` bytes; `stats_size_out` NULL or
/// valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_vnc_memory_stats(
    vnc: u32,
    stats: *mut NrtVncMemoryStats,
    stats_size_in: usize,
    stats_size_out: *mut usize,
) -> NrtStatusC {
    api("nrt_get_vnc_memory_stats", || {
        crate::api_in!(
            "nrt_get_vnc_memory_stats",
            "vnc={vnc}, stats={stats:p}, stats_size_in={stats_size_in}"
        );
        nonnull(stats, "stats")?;
        let rt = state::runtime()?;
        let m = rt.rt.memory_stats(vnc)?;
        let v = NrtVncMemoryStats {
            bytes_used: m.bytes_used as usize,
            bytes_limit: m.bytes_limit as usize,
        };
        // SAFETY: writable for `stats_size_in` bytes (caller's contract).
        let n = unsafe { write_struct_prefix(stats, &v, stats_size_in) };
        if !stats_size_out.is_null() {
            // SAFETY: non-null and valid by the caller's contract.
            unsafe { stats_size_out.write(n) };
        }
        Ok(())
    })
}

/// The name `nrt_get_status_as_str` gives a status, as a Rust string.
#[doc(hidden)]
pub fn status_name(status: NrtStatusC) -> &'static str {
    let p = nrt_get_status_as_str(status);
    // SAFETY: `p` is one of our static NUL-terminated ASCII strings.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_str()
        .unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_strings() {
        for s in NrtStatus::ALL {
            assert_eq!(status_name(s.as_i32()), s.as_str());
        }
        assert_eq!(status_name(8), "NRT_UNKNOWN_STATUS");
        assert_eq!(status_name(-1), "NRT_UNKNOWN_STATUS");
    }
}
