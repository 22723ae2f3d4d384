#!/usr/bin/env python3
"""smoke.py -- drive libnrt.so.1 (nrt-rs, the software NeuronCore) from Python with ctypes.

Standard library only. Loads the library, initializes the runtime, loads a compiled model,
allocates one device tensor per input and output, fills the inputs (from files named after
the tensors in --inputs, zeros otherwise), executes, and writes each output to
`<name>.out` in --out. With --expect DIR, every output must equal DIR/<name>.out byte for
byte. Also checks a few error paths (unknown tensor name, calls after nrt_close).

    python3 examples/python/smoke.py MODEL.ncm [--lib target/release/libnrt.so.1]
        [--inputs DIR] [--out DIR] [--expect DIR]

Exit status 0 and a last line "smoke: ok" when everything checked out.
"""
import argparse
import ctypes
import os
import struct
import sys

NRT_SUCCESS = 0
NRT_FAILURE = 1
NRT_INVALID = 2
NRT_CLOSED = 14
NRT_FRAMEWORK_TYPE_NO_FW = 1
NRT_TENSOR_PLACEMENT_DEVICE = 0
NRT_TENSOR_USAGE_INPUT = 0
NRT_DTYPE_FLOAT32 = 0xA
NRT_TENSOR_NAME_MAX = 256


class TensorInfo(ctypes.Structure):
    """nrt_tensor_info_t"""

    _fields_ = [
        ("name", ctypes.c_char * NRT_TENSOR_NAME_MAX),
        ("usage", ctypes.c_int),
        ("size", ctypes.c_size_t),
        ("dtype", ctypes.c_int),
        ("shape", ctypes.POINTER(ctypes.c_uint32)),
        ("ndim", ctypes.c_uint32),
    ]


class TensorInfoArrayHead(ctypes.Structure):
    """nrt_tensor_info_array_t without its flexible array member"""

    _fields_ = [("tensor_count", ctypes.c_uint64)]


def load_library(path):
    lib = ctypes.CDLL(path)
    vp, cp, sz = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
    pvp = ctypes.POINTER(ctypes.c_void_p)
    sigs = {
        "nrt_get_status_as_str": (cp, [ctypes.c_int]),
        "nrt_get_total_vnc_count": (ctypes.c_int, [ctypes.POINTER(ctypes.c_uint32)]),
        "nrt_init": (ctypes.c_int, [ctypes.c_int, cp, cp]),
        "nrt_close": (None, []),
        "nrt_load": (ctypes.c_int, [vp, sz, ctypes.c_int32, ctypes.c_int32, pvp]),
        "nrt_unload": (ctypes.c_int, [vp]),
        "nrt_get_model_tensor_info": (ctypes.c_int, [vp, ctypes.POINTER(ctypes.POINTER(TensorInfoArrayHead))]),
        "nrt_free_model_tensor_info": (ctypes.c_int, [ctypes.POINTER(TensorInfoArrayHead)]),
        "nrt_tensor_allocate": (ctypes.c_int, [ctypes.c_int, ctypes.c_int, sz, cp, pvp]),
        "nrt_tensor_free": (None, [pvp]),
        "nrt_tensor_read": (ctypes.c_int, [vp, vp, sz, sz]),
        "nrt_tensor_write": (ctypes.c_int, [vp, vp, sz, sz]),
        "nrt_tensor_get_size": (sz, [vp]),
        "nrt_allocate_tensor_set": (ctypes.c_int, [pvp]),
        "nrt_destroy_tensor_set": (None, [pvp]),
        "nrt_add_tensor_to_tensor_set": (ctypes.c_int, [vp, cp, vp]),
        "nrt_get_tensor_from_tensor_set": (ctypes.c_int, [vp, cp, pvp]),
        "nrt_execute": (ctypes.c_int, [vp, vp, vp]),
    }
    for name, (res, args) in sigs.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args
    return lib


class Checker:
    def __init__(self, lib):
        self.lib = lib
        self.failures = 0

    def name(self, status):
        return self.lib.nrt_get_status_as_str(status).decode()

    def status(self, what, got, want=NRT_SUCCESS):
        if got != want:
            self.failures += 1
            print(f"FAIL {what}: {self.name(got)} ({got}), expected {self.name(want)}", file=sys.stderr)
        return got == want

    def true(self, what, cond):
        if not cond:
            self.failures += 1
            print(f"FAIL {what}", file=sys.stderr)
        return cond


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--lib", default=os.environ.get("NRT_LIB", "libnrt.so.1"))
    ap.add_argument("--inputs", default=".")
    ap.add_argument("--out", default=".")
    ap.add_argument("--expect")
    a = ap.parse_args()

    lib = load_library(a.lib)
    c = Checker(lib)
    count = ctypes.c_uint32(0)
    c.status("nrt_get_total_vnc_count (before nrt_init)", lib.nrt_get_total_vnc_count(ctypes.byref(count)))
    c.true("at least one NeuronCore", count.value >= 1)
    if not c.status("nrt_init", lib.nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, b"", b"")):
        return 1

    with open(a.model, "rb") as f:
        neff = f.read()
    model = ctypes.c_void_p()
    if not c.status("nrt_load", lib.nrt_load(neff, len(neff), -1, -1, ctypes.byref(model))):
        return 1

    info = ctypes.POINTER(TensorInfoArrayHead)()
    c.status("nrt_get_model_tensor_info", lib.nrt_get_model_tensor_info(model, ctypes.byref(info)))
    n = info.contents.tensor_count
    entries = (TensorInfo * n).from_address(ctypes.addressof(info.contents) + ctypes.sizeof(TensorInfoArrayHead))
    print(f"model {a.model}: {n} tensors")

    sets = {NRT_TENSOR_USAGE_INPUT: ctypes.c_void_p(), 1: ctypes.c_void_p()}
    for s in sets.values():
        c.status("nrt_allocate_tensor_set", lib.nrt_allocate_tensor_set(ctypes.byref(s)))
    tensors = []
    for e in entries:
        name = e.name.decode()
        shape = [e.shape[i] for i in range(e.ndim)]
        t = ctypes.c_void_p()
        c.status(f"nrt_tensor_allocate({name})",
                 lib.nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, e.size, e.name, ctypes.byref(t)))
        c.true(f"nrt_tensor_get_size({name})", lib.nrt_tensor_get_size(t) == e.size)
        if e.usage == NRT_TENSOR_USAGE_INPUT:
            path = os.path.join(a.inputs, name)
            data = open(path, "rb").read()[: e.size] if os.path.exists(path) else b""
            data = data + bytes(e.size - len(data))
            c.status(f"nrt_tensor_write({name})", lib.nrt_tensor_write(t, data, 0, e.size))
        c.status(f"nrt_add_tensor_to_tensor_set({name})",
                 lib.nrt_add_tensor_to_tensor_set(sets[e.usage], e.name, t))
        tensors.append((e, name, shape, t))
        kind = "input " if e.usage == NRT_TENSOR_USAGE_INPUT else "output"
        print(f"{kind} {name} shape={shape} dtype={e.dtype:#x} size={e.size}")

    # An unknown name: NRT_FAILURE, and the out-pointer is left alone.
    probe = ctypes.c_void_p(0x1234)
    c.status("nrt_get_tensor_from_tensor_set(unknown)",
             lib.nrt_get_tensor_from_tensor_set(sets[0], b"no-such-tensor", ctypes.byref(probe)), NRT_FAILURE)
    c.true("out-pointer untouched", probe.value == 0x1234)

    c.status("nrt_execute", lib.nrt_execute(model, sets[0], sets[1]))

    for e, name, shape, t in tensors:
        if e.usage == NRT_TENSOR_USAGE_INPUT:
            continue
        buf = ctypes.create_string_buffer(e.size)
        c.status(f"nrt_tensor_read({name})", lib.nrt_tensor_read(t, buf, 0, e.size))
        data = buf.raw
        with open(os.path.join(a.out, name + ".out"), "wb") as f:
            f.write(data)
        if e.dtype == NRT_DTYPE_FLOAT32:
            vals = struct.unpack(f"<{e.size // 4}f", data)
            print(f"output {name} = {[round(v, 4) for v in vals[:8]]}{' ...' if len(vals) > 8 else ''}")
        if a.expect:
            want = open(os.path.join(a.expect, name + ".out"), "rb").read()
            c.true(f"output {name} equals {a.expect}/{name}.out", data == want)

    # Cleanup; then a call after nrt_close.
    for _, _, _, t in tensors:
        lib.nrt_tensor_free(ctypes.byref(t))
        c.true("nrt_tensor_free nulls the pointer", t.value is None)
    for s in sets.values():
        lib.nrt_destroy_tensor_set(ctypes.byref(s))
    c.status("nrt_free_model_tensor_info", lib.nrt_free_model_tensor_info(info))
    c.status("nrt_unload", lib.nrt_unload(model))
    lib.nrt_close()
    c.status("nrt_load after nrt_close", lib.nrt_load(neff, len(neff), -1, -1, ctypes.byref(model)), NRT_CLOSED)

    if c.failures:
        print(f"smoke: {c.failures} check(s) failed", file=sys.stderr)
        return 1
    print("smoke: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
