"""Hostile use of the Python package (issue 54, S15-S18, S20, S21 and the smaller items):
arrays of types the device does not have, models dropped without unload(), fork, absurd
timeouts, Ctrl-C during a hung execution. Anything that could hang runs in a subprocess
with a timeout."""

from __future__ import annotations

import datetime
import gc
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np
import pytest

import nrt
from conftest import RUNTIME_DIRS, run_py

#===----------------------------------------------------------------------------------===#
# S15: dtypes
#===----------------------------------------------------------------------------------===#

# One array of every numpy dtype kind the device has no element type for.
REFUSED = {
    "object": np.array([object(), "x", 3], dtype=object),
    "unicode": np.array(["ab", "cd"]),
    "bytes": np.array([b"ab", b"cd"]),
    "void": np.zeros(3, dtype="V4"),
    "structured": np.zeros(3, dtype=[("a", "<i4"), ("b", "<f4")]),
    "datetime": np.array(["2024-01-01", "2024-01-02"], dtype="datetime64[D]"),
    "timedelta": np.array([1, 2], dtype="timedelta64[s]"),
    "complex64": np.zeros(3, np.complex64),
    "complex128": np.zeros(3, np.complex128),
    "big-endian float32": np.zeros(3, ">f4"),
    "big-endian int64": np.zeros(3, ">i8"),
}
if hasattr(np, "longdouble") and np.dtype(np.longdouble).itemsize > 8:
    REFUSED["longdouble"] = np.zeros(3, np.longdouble)

SUPPORTED = [
    np.float32, np.float16, np.float64, np.int8, np.uint8, np.int16, np.uint16,
    np.int32, np.uint32, np.int64, np.uint64, np.bool_,
]


@pytest.mark.parametrize("kind", sorted(REFUSED))
def test_from_numpy_refuses_dtypes_the_device_lacks(kind):
    a = REFUSED[kind]
    with pytest.raises(nrt.NrtError) as e:
        nrt.Tensor.from_numpy(a)
    assert e.value.status_name == "NRT_INVALID"
    assert str(a.dtype) in str(e.value) or repr(a.dtype) in str(e.value), str(e.value)
    assert "not an element type of the device" in str(e.value)


@pytest.mark.parametrize("dt", SUPPORTED, ids=lambda d: np.dtype(d).name)
def test_from_numpy_round_trips_every_device_dtype(dt):
    a = (np.arange(6) % 2).astype(dt).reshape(2, 3)
    t = nrt.Tensor.from_numpy(a)
    back = t.numpy()
    assert back.dtype == np.dtype(dt) and back.shape == (2, 3)
    np.testing.assert_array_equal(back, a)
    t.write(a[::-1].copy())
    np.testing.assert_array_equal(t.numpy(), a[::-1])


def test_bfloat16_round_trips():
    a = np.arange(4, dtype=np.float32).astype(nrt.bfloat16)
    np.testing.assert_array_equal(nrt.Tensor.from_numpy(a).numpy(), a)


def test_object_array_never_reaches_the_device():
    """The S15 reproduction: object pointers copied as bytes and handed back without
    references freed live objects (a refcount of ~1.4e14, then SIGSEGV)."""
    live = [object() for _ in range(4)]
    before = [sys.getrefcount(o) for o in live]
    for _ in range(3):
        with pytest.raises(nrt.NrtError, match="object"):
            nrt.Tensor.from_numpy(np.array(live, dtype=object))
    assert [sys.getrefcount(o) for o in live] == before


@pytest.mark.parametrize("kind", ["object", "unicode", "void", "datetime", "complex64"])
def test_write_refuses_dtypes_the_device_lacks(kind):
    t = nrt.Tensor.from_numpy(np.zeros(3, np.float32))
    with pytest.raises(nrt.NrtError) as e:
        t.write(REFUSED[kind])
    assert "not an element type of the device" in str(e.value), str(e.value)
    np.testing.assert_array_equal(t.numpy(), np.zeros(3, np.float32))


@pytest.mark.parametrize("kind", ["object", "unicode", "bytes", "void", "datetime", "complex64"])
def test_model_inputs_refuse_dtypes_the_device_lacks(models, kind):
    m = nrt.Model.load(models["tiny"])
    bad = np.resize(REFUSED[kind], 8).reshape(2, 4)
    with pytest.raises(nrt.NrtError) as e:
        m({"X": bad})
    assert "'X'" in str(e.value) and str(bad.dtype) in str(e.value), str(e.value)
    with pytest.raises(nrt.NrtError):
        m.submit({"X": bad}).result(timeout=10)
    s = nrt.InferenceSession(models["tiny_dyn"])
    with pytest.raises(nrt.NrtError):
        s.run(None, {"X": bad})


#===----------------------------------------------------------------------------------===#
# S16: a model dropped without unload() is unloaded
#===----------------------------------------------------------------------------------===#


def rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def test_dropped_models_are_unloaded_flat_rss(samples_dir):
    """150 load-run-drop cycles of a model with ~3.7 MB of weights grew RSS by 554 MB."""
    path = str(samples_dir / "mlp" / "model.onnx")
    blob = nrt.compile(path, input_shapes={"X": [1, 512]})
    x = {"X": np.ones((1, 512), np.float32)}

    def cycle():
        m = nrt.Model.load(blob)
        m(x)
        # no unload(): the last reference goes here

    for _ in range(5):
        cycle()
    gc.collect()
    before = rss_kib()
    for _ in range(30):
        cycle()
    gc.collect()
    grown = rss_kib() - before
    # Without the fix: ~3.7 MB per cycle, over 100 MB here.
    assert grown < 24 * 1024, f"RSS grew {grown} KiB over 30 load-run-drop cycles"


def test_load_unload_does_not_grow(models):
    """~64 B per load+unload grew (the trace-file name list)."""
    blob = nrt.compile(models["tiny"])
    for _ in range(200):
        nrt.Model.load(blob).unload()
    gc.collect()
    before = rss_kib()
    for _ in range(3000):
        nrt.Model.load(blob).unload()
    gc.collect()
    assert rss_kib() - before < 1024


#===----------------------------------------------------------------------------------===#
# S17, S18: fork
#===----------------------------------------------------------------------------------===#

# The child prints one line: "ok", or "err <status_name>: <message>"; the parent reports
# every child's line and a child that does not finish in time as "hang".
FORK_PRELUDE = r"""
import os, sys, threading, time, numpy as np, nrt
nrt.configure(log_level="OFF")
def child(fn, timeout=20.0):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            out = fn()
            msg = "ok " + str(out)
        except nrt.NrtError as e:
            msg = "err %s: %s" % (e.status_name, e)
        except BaseException as e:
            msg = "exc %r" % (e,)
        os.write(w, (msg.replace("\n", " ") + "\n").encode())
        os._exit(0)
    os.close(w)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            with os.fdopen(r) as f:
                print(f.read().strip() or "died %d" % status, flush=True)
            return
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    os.close(r)
    print("hang", flush=True)
"""


def fork_script(body: str) -> str:
    return FORK_PRELUDE + textwrap.dedent(body)


def check_children(r: subprocess.CompletedProcess, n: int) -> list:
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [l for l in r.stdout.splitlines() if l.split()[0] in ("ok", "err", "exc", "hang", "died")]
    assert len(lines) == n, r.stdout + r.stderr
    bad = [l for l in lines if not (l.startswith("ok") or l.startswith("err"))]
    assert not bad, "children that hung or crashed: " + "; ".join(bad)
    return lines


def test_fork_after_submit(models):
    """S17: after the parent used submit(), submit() in a fork child never ran."""
    code = fork_script(f"""
        m = nrt.Model.load({str(models["tiny"])!r})
        x = {{"X": np.ones((2, 4), np.float32)}}
        m.submit(x).result(timeout=10)
        # The parent's model in the child: a clear error, through the future.
        child(lambda: m.submit(x).result(timeout=10)["Y"].shape)
        # A model of its own in the child: the parent's runtime keeps the cores, so loading
        # fails naming the parent, or (cores free) it runs.
        child(lambda: nrt.Model.load({str(models["tiny"])!r}).submit(x).result(timeout=10)["Y"].shape)
        # The parent still works.
        print("parent", m.submit(x).result(timeout=10)["Y"].shape)
    """)
    r = run_py(code, env={"NEURON_RT_VISIBLE_CORES": "0"}, timeout=90)
    lines = check_children(r, 2)
    assert lines[0].startswith("err NRT_INVALID_HANDLE"), lines[0]
    assert "parent process" in lines[0] and "load the model" in lines[0], lines[0]
    assert lines[1].startswith("err NRT_RESOURCE"), lines[1]
    assert "fork of pid" in lines[1] and "in use by pid" in lines[1], lines[1]
    assert "parent (2, 4)" in r.stdout


def test_fork_child_without_a_parent_runtime_gets_its_own(models):
    """A parent that never started (or closed) its runtime: the child gets a working one,
    submit pool included."""
    code = fork_script(f"""
        x = {{"X": np.ones((2, 4), np.float32)}}
        def run():
            m = nrt.Model.load({str(models["tiny"])!r})
            return m.submit(x).result(timeout=10)["Y"].shape, m(x)["Y"].shape
        child(run)
        m = nrt.Model.load({str(models["tiny"])!r})
        m.submit(x).result(timeout=10)
        m.unload()
        nrt.close()
        child(run)
    """)
    r = run_py(code, timeout=90)
    lines = check_children(r, 2)
    assert lines == ["ok ((2, 4), (2, 4))"] * 2, lines


def test_fork_while_threads_run_models(models):
    """S18: forking while other threads were inside model calls hung 30-50% of children on
    their first call. Every child must finish, with success or NrtError."""
    code = fork_script(f"""
        m = nrt.Model.load({str(models["tiny"])!r})
        s = nrt.InferenceSession({str(models["tiny_dyn"])!r})
        x = {{"X": np.ones((2, 4), np.float32)}}
        stop = threading.Event()
        def busy(k):
            while not stop.is_set():
                if k % 3 == 0:
                    m(x)
                elif k % 3 == 1:
                    m.submit(x).result(timeout=10)
                else:
                    s.run(None, x)
        threads = [threading.Thread(target=busy, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.05)
        for _ in range(10):
            child(lambda: m(x)["Y"].shape, timeout=15)
            child(lambda: s.run(None, x)[0].shape, timeout=15)
            time.sleep(0.005)
        stop.set()
        for t in threads:
            t.join()
        print("parent", m(x)["Y"].shape)
    """)
    r = run_py(code, env={"NEURON_RT_VISIBLE_CORES": "0"}, timeout=240)
    lines = check_children(r, 20)
    for l in lines:
        assert l.startswith("err NRT_INVALID_HANDLE") or l.startswith("err NRT_RESOURCE"), l
    assert "parent (2, 4)" in r.stdout


#===----------------------------------------------------------------------------------===#
# S20: timeouts that do not fit a Duration
#===----------------------------------------------------------------------------------===#


@pytest.mark.parametrize("t", [1e300, 1e20, float("inf"), float("nan"), 0.0, -1.0])
def test_absurd_timeouts_raise_nrt_error(models, t):
    with pytest.raises(nrt.NrtError) as e:
        nrt.Model.load(models["tiny"], timeout=t)
    assert e.value.status_name == "NRT_INVALID" and "timeout=" in str(e.value)


def test_large_timeout_that_fits_loads(models):
    m = nrt.Model.load(models["tiny"], timeout=1e9)
    assert m({"X": np.ones((2, 4), np.float32)})["Y"].shape == (2, 4)


#===----------------------------------------------------------------------------------===#
# S21: Ctrl-C during a hung execution
#===----------------------------------------------------------------------------------===#


def test_ctrl_c_interrupts_a_hung_call(models):
    """S21: SIGINT during a hung execution raised only when the execution timed out (30 s
    by default). The hung execution is still drained: the model runs again afterwards."""
    code = textwrap.dedent(f"""
        import time, numpy as np, nrt
        nrt.configure(log_level="OFF")
        m = nrt.Model.load({str(models["tiny"])!r}, timeout=3)
        x = {{"X": np.ones((2, 4), np.float32)}}
        ref = m(x)["Y"]
        print("ready", flush=True)
        nrt.inject_faults("hang")
        t0 = time.monotonic()
        try:
            m(x)
            print("returned")
        except KeyboardInterrupt:
            print("interrupted %.2f" % (time.monotonic() - t0), flush=True)
        # The abandoned execution times out in the background; the next calls work.
        for _ in range(3):
            assert np.array_equal(m(x)["Y"], ref)
        print("again ok", flush=True)
    """)
    env = dict(os.environ)
    env["NRT_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="sub-", dir=RUNTIME_DIRS)
    p = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout.readline().strip() == "ready"
        time.sleep(0.3)
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    lines = out.split()
    assert "interrupted" in lines, out + err
    took = float(lines[lines.index("interrupted") + 1])
    assert took < 1.5, f"KeyboardInterrupt after {took} s (the exec timeout is 3 s)"
    assert "again" in lines, out + err


#===----------------------------------------------------------------------------------===#
# The smaller items
#===----------------------------------------------------------------------------------===#


def test_submit_copies_its_inputs(models):
    m = nrt.Model.load(models["tiny"])
    x = np.ones((2, 4), np.float32)
    ref = m({"X": x})["Y"]
    futs = []
    for _ in range(20):
        futs.append(m.submit({"X": x}))
        x[...] = 100.0  # changed after submit: the results must not see it
        x[...] = 1.0
        x[0, 0] = -50.0
        x[...] = 1.0
    lst = m.submit({"X": [[1.0] * 4] * 2})
    x[...] = 7.0
    for f in futs + [lst]:
        np.testing.assert_array_equal(f.result(timeout=10)["Y"], ref)


def test_reset_after_unload_raises(models):
    m = nrt.Model.load(models["tiny"])
    m.reset()
    m.unload()
    with pytest.raises(nrt.NrtError) as e:
        m.reset()
    assert e.value.status_name == "NRT_INVALID" and "unloaded" in str(e.value)


def test_tensor_input_shape_is_checked(models):
    m = nrt.Model.load(models["tiny"])
    t = nrt.Tensor.from_numpy(np.ones(8, np.float32))  # same bytes, shape (8,)
    with pytest.raises(nrt.NrtError) as e:
        m({"X": t})
    assert "(8,)" in str(e.value) and "(2, 4)" in str(e.value), str(e.value)
    t24 = nrt.Tensor.from_numpy(np.ones((2, 4), np.float32))
    assert m({"X": t24})["Y"].shape == (2, 4)


def test_inference_session_bounds_its_compiled_models(models):
    s = nrt.InferenceSession(models["tiny_dyn"], max_compiled_shapes=3)
    for n in range(1, 7):
        assert s.run(None, {"X": np.ones((n, 4), np.float32)})[0].shape == (n, 4)
    assert s.compiled_shapes == [((4, 4),), ((5, 4),), ((6, 4),)]
    # The most recently used stays.
    s.run(None, {"X": np.ones((4, 4), np.float32)})
    s.run(None, {"X": np.ones((1, 4), np.float32)})
    assert s.compiled_shapes == [((6, 4),), ((4, 4),), ((1, 4),)]
    with pytest.raises(nrt.NrtError):
        nrt.InferenceSession(models["tiny_dyn"], max_compiled_shapes=0)


def test_interruptible_can_be_turned_off(models):
    m = nrt.Model.load(models["tiny"])
    x = {"X": np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)}
    ref = m(x)["Y"]
    t = nrt.Tensor.from_numpy(x["X"])
    try:
        nrt.configure(interruptible=False)
        np.testing.assert_array_equal(m(x)["Y"], ref)
        np.testing.assert_array_equal(m({"X": t})["Y"], ref)
    finally:
        nrt.configure(interruptible=True)
    np.testing.assert_array_equal(m({"X": t})["Y"], ref)
