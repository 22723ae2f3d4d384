//! The headers against the Rust side: a C probe (`tests/c/abi_probe.c`), compiled with gcc
//! and with g++ against `include/` and linked with `-lnrt`, prints every struct size and
//! field offset and the enum values; they must equal the `#[repr(C)]` mirrors, the runtime's
//! status codes, and the hardware dtype encoding.

mod common;
use common::*;
use nrt::types::*;
use nrt_runtime::{DType, NrtStatus};
use std::collections::BTreeMap;
use std::mem::{offset_of, size_of};
use std::path::Path;
use std::process::Command;

fn expected() -> BTreeMap<String, i128> {
    let mut m = BTreeMap::new();
    let mut put = |k: &str, v: i128| {
        m.insert(k.to_string(), v);
    };
    macro_rules! sz {
        ($c:literal, $t:ty) => {
            put(concat!("sizeof ", $c), size_of::<$t>() as i128)
        };
    }
    macro_rules! off {
        ($c:literal, $t:ty, $f:ident) => {
            put(
                concat!("offsetof ", $c, ".", stringify!($f)),
                offset_of!($t, $f) as i128,
            )
        };
    }
    sz!("nrt_tensor_info_t", NrtTensorInfo);
    off!("nrt_tensor_info_t", NrtTensorInfo, name);
    off!("nrt_tensor_info_t", NrtTensorInfo, usage);
    off!("nrt_tensor_info_t", NrtTensorInfo, size);
    off!("nrt_tensor_info_t", NrtTensorInfo, dtype);
    off!("nrt_tensor_info_t", NrtTensorInfo, shape);
    off!("nrt_tensor_info_t", NrtTensorInfo, ndim);
    sz!("nrt_tensor_info_array_t", NrtTensorInfoArray);
    off!("nrt_tensor_info_array_t", NrtTensorInfoArray, tensor_count);
    off!("nrt_tensor_info_array_t", NrtTensorInfoArray, tensor_array);
    sz!("nrt_version_t", NrtVersion);
    off!("nrt_version_t", NrtVersion, rt_major);
    off!("nrt_version_t", NrtVersion, rt_minor);
    off!("nrt_version_t", NrtVersion, rt_patch);
    off!("nrt_version_t", NrtVersion, rt_maintenance);
    off!("nrt_version_t", NrtVersion, rt_detail);
    off!("nrt_version_t", NrtVersion, git_hash);
    sz!("nrt_instance_info_t", NrtInstanceInfo);
    off!("nrt_instance_info_t", NrtInstanceInfo, family);
    off!("nrt_instance_info_t", NrtInstanceInfo, size);
    off!("nrt_instance_info_t", NrtInstanceInfo, arch_name);
    off!("nrt_instance_info_t", NrtInstanceInfo, device_revision);
    sz!("nrt_vnc_memory_stats_t", NrtVncMemoryStats);
    off!("nrt_vnc_memory_stats_t", NrtVncMemoryStats, bytes_used);
    off!("nrt_vnc_memory_stats_t", NrtVncMemoryStats, bytes_limit);
    sz!("nrt_model_info_t", NrtModelInfo);
    off!("nrt_model_info_t", NrtModelInfo, vnc);
    sz!("nrt_tensor_batch_op_t", NrtTensorBatchOp);
    off!("nrt_tensor_batch_op_t", NrtTensorBatchOp, offset);
    off!("nrt_tensor_batch_op_t", NrtTensorBatchOp, size);
    off!("nrt_tensor_batch_op_t", NrtTensorBatchOp, buffer);
    sz!("nrt_tensor_batch_t", NrtTensorBatch);
    off!("nrt_tensor_batch_t", NrtTensorBatch, tensor);
    off!("nrt_tensor_batch_t", NrtTensorBatch, ops);
    off!("nrt_tensor_batch_t", NrtTensorBatch, num_ops);
    sz!(
        "nrt_tensor_device_allocation_info_t",
        NrtTensorDeviceAllocationInfo
    );
    off!(
        "nrt_tensor_device_allocation_info_t",
        NrtTensorDeviceAllocationInfo,
        physical_address
    );
    off!(
        "nrt_tensor_device_allocation_info_t",
        NrtTensorDeviceAllocationInfo,
        size
    );
    off!(
        "nrt_tensor_device_allocation_info_t",
        NrtTensorDeviceAllocationInfo,
        hbm_index
    );
    // Enums cross the ABI as 32-bit ints (the extern "C" functions take u32/i32).
    sz!("NRT_STATUS", NrtStatusC);
    sz!("nrt_dtype_t", u32);
    sz!("nrta_xu_t", u32);
    sz!("nrta_seq_t", u64);
    sz!("nrta_xu_id_t", u16);

    for s in NrtStatus::ALL {
        put(s.as_str(), s.as_i32() as i128);
    }
    let dtypes: [(&str, Option<DType>, i128); 18] = [
        ("NRT_DTYPE_UNKNOWN", None, 0),
        ("NRT_DTYPE_INVALID", None, 0),
        ("NRT_DTYPE_UINT64", Some(DType::U64), 0x1),
        ("NRT_DTYPE_INT8", Some(DType::I8), 0x2),
        ("NRT_DTYPE_UINT8", Some(DType::U8), 0x3),
        ("NRT_DTYPE_INT16", Some(DType::I16), 0x4),
        ("NRT_DTYPE_UINT16", Some(DType::U16), 0x5),
        ("NRT_DTYPE_BFLOAT16", Some(DType::Bf16), 0x6),
        ("NRT_DTYPE_FLOAT16", Some(DType::F16), 0x7),
        ("NRT_DTYPE_INT32", Some(DType::I32), 0x8),
        ("NRT_DTYPE_UINT32", Some(DType::U32), 0x9),
        ("NRT_DTYPE_FLOAT32", Some(DType::F32), 0xA),
        ("NRT_DTYPE_FP32R", None, 0xB),
        ("NRT_DTYPE_INT64", Some(DType::I64), 0xC),
        ("NRT_DTYPE_FP8_E3", None, 0xD),
        ("NRT_DTYPE_FP8_E4", None, 0xE),
        ("NRT_DTYPE_FP8_E5", None, 0xF),
        ("NRT_DTYPE_FLOAT64", Some(DType::F64), 0x11),
    ];
    for (name, d, v) in dtypes {
        if let Some(d) = d {
            assert_eq!(d.nrt_code() as i128, v, "{name}: the runtime's encoding");
        }
        put(name, v);
    }
    assert_eq!(DType::Bool.nrt_code(), DType::U8.nrt_code());
    for (k, v) in [
        ("NRT_TENSOR_PLACEMENT_DEVICE", placement::DEVICE),
        ("NRT_TENSOR_PLACEMENT_HOST", placement::HOST),
        ("NRT_TENSOR_PLACEMENT_VIRTUAL", placement::VIRTUAL),
        ("NRT_FRAMEWORK_TYPE_INVALID", framework::INVALID),
        ("NRT_FRAMEWORK_TYPE_NO_FW", framework::NO_FW),
        ("NRT_FRAMEWORK_TYPE_TENSORFLOW", framework::TENSORFLOW),
        ("NRT_FRAMEWORK_TYPE_PYTORCH", framework::PYTORCH),
        ("NRT_FRAMEWORK_TYPE_MXNET", framework::MXNET),
        ("NRT_FRAMEWORK_TYPE_PRECHECK", framework::PRECHECK),
        ("NRT_TENSOR_USAGE_INPUT", usage::INPUT),
        ("NRT_TENSOR_USAGE_OUTPUT", usage::OUTPUT),
        ("NRT_INSTANCE_UNKNOWN", family::UNKNOWN),
        ("NRT_INSTANCE_TRN3PDS98", 15),
        ("NRT_INSTANCE_SIZE_3XL", 8),
        ("NRT_INSTANCE_SIZE_UNKNOWN", instance_size::UNKNOWN),
        ("NRT_INSTANCE_SIZE_NUM", instance_size::UNKNOWN),
        ("NRT_OP_ADD", 0),
        ("NRT_OP_INVALID", 0xF),
        ("NRT_CC_REDUCESCATTER", 2),
        ("NRT_TENSOR_NAME_MAX", NRT_TENSOR_NAME_MAX as u32),
        ("NRT_MAJOR_VERSION", NRT_MAJOR_VERSION),
        ("NRT_MINOR_VERSION", NRT_MINOR_VERSION),
        ("NRTA_XU_TENSOR_OP", xu::TENSOR_OP),
        ("NRTA_XU_COMPUTE", xu::COMPUTE),
        ("NRTA_XU_COLLECTIVES", xu::COLLECTIVES),
        ("NRTA_XU_TYPE_NUM", xu::TYPE_NUM),
    ] {
        put(k, v as i128);
    }
    // The runtime's XU kinds are the header's values.
    assert_eq!(nrt_runtime::XuKind::TensorOp as u32, xu::TENSOR_OP);
    assert_eq!(nrt_runtime::XuKind::Compute as u32, xu::COMPUTE);
    assert_eq!(nrt_runtime::XuKind::Collectives as u32, xu::COLLECTIVES);
    put("NRTA_SEQ_NUM_MAX", (1i128 << 48) - 1);
    let s = nrt_runtime::SeqId(0x0203_0000_0000_1234);
    put(
        "NRTA_SEQ_GET_SEQ_NUM(0x0203000000001234ull)",
        s.seq_num() as i128,
    );
    put(
        "NRTA_SEQ_GET_XU_ID(0x0203000000001234ull)",
        s.xu_id() as i128,
    );
    m
}

fn parse(out: &str) -> (BTreeMap<String, i128>, String) {
    let mut m = BTreeMap::new();
    let mut status = String::new();
    for line in out.lines() {
        let (k, v) = line.rsplit_once(' ').unwrap();
        if k == "status_str" {
            status = v.to_string();
        } else {
            m.insert(k.to_string(), v.parse::<i128>().unwrap());
        }
    }
    (m, status)
}

#[test]
fn headers_match_the_rust_side_in_c_and_cpp() {
    let dir = scratch("abi");
    let probe = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/abi_probe.c");
    let c = dir.join("abi_probe_c");
    gcc(std::slice::from_ref(&probe), &c);
    // The same probe as C++ (extern "C" guards; the names must link unmangled).
    let cpp = dir.join("abi_probe_cpp");
    let lib = lib_dir();
    let o = Command::new("g++")
        .args(["-std=c++17", "-Wall", "-Wextra", "-Werror", "-x", "c++"])
        .arg(format!("-I{}", root().join("include").display()))
        .arg(&probe)
        .args(["-x", "none"])
        .arg(format!("-L{}", lib.display()))
        .arg("-lnrt")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-o")
        .arg(&cpp)
        .output()
        .expect("g++ is installed");
    assert!(
        o.status.success(),
        "g++: {}",
        String::from_utf8_lossy(&o.stderr)
    );

    let want = expected();
    for exe in [&c, &cpp] {
        let o = run(&mut Command::new(exe), &dir);
        assert!(o.status.success());
        let (got, status) = parse(&String::from_utf8(o.stdout).unwrap());
        assert_eq!(status, "NRT_EXEC_OOB");
        for (k, v) in &want {
            assert_eq!(got.get(k), Some(v), "{k} ({})", exe.display());
        }
        for k in got.keys() {
            assert!(want.contains_key(k), "{k} is printed but not checked");
        }
    }
}

/// Every function the headers declare is exported by `libnrt.so`, and the ones the headers
/// list as "Not provided" are not (issue 11, D12: the list named four exported functions).
#[test]
fn d12_declared_functions_are_exported_and_not_provided_ones_are_not() {
    let nm = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(lib_dir().join("libnrt.so"))
        .output()
        .expect("nm (binutils) is installed");
    assert!(nm.status.success());
    let exported: std::collections::BTreeSet<String> = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, kind, name) = (f.next()?, f.next()?, f.next()?);
            (kind == "T").then(|| name.to_owned())
        })
        .collect();
    let mut declared = Vec::new();
    let mut not_provided = Vec::new();
    for entry in std::fs::read_dir(root().join("include/nrt")).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        // Declarations: `NRT_STATUS name(` / `void name(` / `const char *name(` at a line start.
        for line in text.lines() {
            let l = line.trim_start();
            if l.starts_with("typedef") || l.starts_with("*") || l.starts_with("/*") {
                continue;
            }
            if let Some(open) = l.find('(') {
                let head = &l[..open];
                if let Some(name) = head.rsplit([' ', '*']).next()
                    && (name.starts_with("nrt_") || name.starts_with("nrta_"))
                    && head.contains(' ')
                {
                    declared.push(name.to_owned());
                }
            }
        }
        if let Some(i) = text.find("Not provided by this library") {
            let end = text[i..].find("*/").map_or(text.len(), |e| i + e);
            not_provided.extend(
                text[i..end]
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .filter(|w| w.starts_with("nrt_"))
                    .map(str::to_owned),
            );
        }
    }
    assert!(declared.len() > 50, "found only {declared:?}");
    let missing: Vec<_> = declared.iter().filter(|d| !exported.contains(*d)).collect();
    assert!(missing.is_empty(), "declared but not exported: {missing:?}");
    assert!(!not_provided.is_empty());
    let wrongly: Vec<_> = not_provided
        .iter()
        .filter(|n| exported.contains(*n))
        .collect();
    assert!(
        wrongly.is_empty(),
        "listed as not provided but exported: {wrongly:?}"
    );
}
