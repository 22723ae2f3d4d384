"""Every error path raises nrt.NrtError with its status and a message naming the culprit."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

import nrt
from conftest import run_py, tiny_model

INVALID = 2


def check(e: pytest.ExceptionInfo, status: int, *words: str) -> None:
    assert isinstance(e.value, nrt.NrtError) and isinstance(e.value, RuntimeError)
    assert e.value.status == status
    assert e.value.status_name == next(k for k, v in nrt.STATUS.items() if v == status)
    assert str(e.value).startswith(e.value.status_name + ": ")
    assert e.value.message in str(e.value)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


@pytest.fixture(scope="module")
def two(models):
    return nrt.Model.load(models["two"])


def good():
    return {
        "A": np.zeros((2, 3), np.int32),
        "B": np.zeros((2, 3), np.int32),
        "F": np.zeros(3, np.float32),
    }


def test_wrong_input_name(two):
    feeds = good()
    feeds["C"] = feeds.pop("B")
    with pytest.raises(nrt.NrtError) as e:
        two(feeds)
    check(e, INVALID, "'C'", "'two'", "'A', 'B', 'F'")


def test_extra_input_name(two):
    feeds = good()
    feeds["extra"] = np.zeros(1, np.float32)
    with pytest.raises(nrt.NrtError) as e:
        two(feeds)
    check(e, INVALID, "'extra'", "'two'")


def test_missing_input(two):
    feeds = good()
    del feeds["F"]
    with pytest.raises(nrt.NrtError) as e:
        two(feeds)
    check(e, INVALID, "'F'", "missing", "'two'")


def test_wrong_shape(two):
    feeds = good()
    feeds["A"] = np.zeros((3, 2), np.int32)
    with pytest.raises(nrt.NrtError) as e:
        two(feeds)
    check(e, INVALID, "'A'", "(3, 2)", "(2, 3)", "'two'")


def test_wrong_dtype(two):
    feeds = good()
    feeds["F"] = np.zeros(3, np.float64)
    with pytest.raises(nrt.NrtError) as e:
        two(feeds)
    check(e, INVALID, "'F'", "float64", "float32", "'two'")


def test_unconvertible_value(two):
    feeds = good()
    feeds["F"] = object()
    with pytest.raises(nrt.NrtError) as e:
        two(feeds)
    check(e, INVALID, "'F'")


def test_not_a_dict(two):
    with pytest.raises(TypeError):
        two([np.zeros(3)])


def test_unloaded_model(models):
    m = nrt.Model.load(models["tiny"])
    m.unload()
    assert not m.loaded
    with pytest.raises(nrt.NrtError) as e:
        m({"X": np.zeros((2, 4), np.float32)})
    check(e, INVALID, "unloaded", f"'{m.name}'")
    with pytest.raises(nrt.NrtError) as e:
        m.unload()
    check(e, INVALID, "already unloaded")


def test_load_errors(tmp_path, models):
    with pytest.raises(nrt.NrtError) as e:
        nrt.Model.load(tmp_path / "absent.ncm")
    check(e, INVALID, "absent.ncm")
    junk = tmp_path / "junk.ncm"
    junk.write_bytes(b"not a model")
    with pytest.raises(nrt.NrtError) as e:
        nrt.Model.load(junk)
    check(e, INVALID, "junk.ncm")
    blob = nrt.compile(models["tiny"])
    with pytest.raises(nrt.NrtError) as e:
        nrt.Model.load(blob, cores=2)
    check(e, INVALID, "compiled for 1 core", "cores=2")
    with pytest.raises(nrt.NrtError) as e:
        nrt.Model.load(models["tiny"], core=7)
    check(e, nrt.STATUS["NRT_LOAD_NOT_ENOUGH_NC"], "7")
    with pytest.raises(nrt.NrtError) as e:
        nrt.Model.load(models["tiny"], timeout=-1)
    check(e, INVALID, "timeout")


def test_compile_errors(tmp_path, models):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x01\x02garbage")
    with pytest.raises(nrt.NrtError) as e:
        nrt.compile(bad)
    check(e, INVALID, "bad.onnx")
    with pytest.raises(nrt.NrtError) as e:
        nrt.compile(models["tiny"], cores=3)
    check(e, INVALID, "cores")


def test_configure_after_start_is_refused():
    nrt.visible_cores()  # the runtime is running
    with pytest.raises(nrt.NrtError) as e:
        nrt.configure(visible_cores="0")
    check(e, INVALID, "already running")
    with pytest.raises(nrt.NrtError) as e:
        nrt.configure(log_level="LOUD")
    check(e, INVALID, "LOUD")
    nrt.configure(log_level="ERROR")  # allowed at any time


def test_bad_fault_spec():
    with pytest.raises(nrt.NrtError) as e:
        nrt.inject_faults("meltdown")
    check(e, INVALID, "meltdown")
    with pytest.raises(nrt.NrtError) as e:
        nrt.inject_faults("fatal@core=5")
    check(e, INVALID, "logical core 5")


def test_device_tensor_errors():
    with pytest.raises(nrt.NrtError) as e:
        nrt.Tensor.from_numpy(np.zeros(4, np.float32), core=9)
    check(e, INVALID, "9")
    t = nrt.Tensor.from_numpy(np.zeros(4, np.float32))
    with pytest.raises(nrt.NrtError) as e:
        t.write(np.zeros(5, np.float32))
    check(e, INVALID, "(4,)", "(5,)")


def test_closed_runtime(tmp_path):
    # A fresh process: closing the process-global runtime here would close every model of
    # this test session.
    path = tiny_model(tmp_path / "tiny.onnx", batch=2)
    code = textwrap.dedent(
        f"""
        import numpy as np, nrt
        m = nrt.Model.load({str(path)!r})
        t = nrt.Tensor.from_numpy(np.zeros((2, 4), np.float32))
        x = {{"X": np.zeros((2, 4), np.float32)}}
        m(x)
        nrt.close()
        assert not m.loaded
        for call in (lambda: m(x), lambda: t.numpy(), lambda: m({{"X": t}})):
            try:
                call()
                raise SystemExit("no error")
            except nrt.NrtError as e:
                assert e.status == nrt.STATUS["NRT_CLOSED"] == 14, e
                assert e.status_name == "NRT_CLOSED"
                print("OK", e)
        # The next use starts a new runtime.
        m2 = nrt.Model.load({str(path)!r})
        print("RESTARTED", m2(x)["Y"].shape)
        """
    )
    r = run_py(code)
    assert r.returncode == 0, r.stderr + r.stdout
    assert r.stdout.count("OK NRT_CLOSED") == 3, r.stdout
    assert "'tiny'" in r.stdout.splitlines()[0]
    assert "RESTARTED (2, 4)" in r.stdout


def test_configure_overrides_environment(tmp_path):
    code = textwrap.dedent(
        """
        import nrt
        nrt.configure(visible_cores="1", log_level="WARN")
        print(nrt.visible_cores())
        """
    )
    r = run_py(code, env={"NEURON_RT_VISIBLE_CORES": "0"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[[1]]"
    r = run_py("import nrt; print(nrt.visible_cores())", env={"NEURON_RT_VISIBLE_CORES": "1"})
    assert r.stdout.strip() == "[[1]]", r.stderr
    r = run_py("import nrt; nrt.visible_cores()", env={"NEURON_RT_VISIBLE_CORES": "5"})
    assert r.returncode != 0 and "NrtError" in r.stderr and "NRT_RESOURCE" in r.stderr


def test_two_core_model(tmp_path):
    path = tiny_model(tmp_path / "tiny.onnx", batch=2)
    code = textwrap.dedent(
        f"""
        import json, numpy as np, nrt
        nrt.configure(logical_nc_config=2)
        m = nrt.Model.load({str(path)!r}, cores=2)
        x = np.ones((2, 4), np.float32)
        one = nrt.compile({str(path)!r}, cores=1)
        try:
            nrt.Model.load(one, cores=2)
        except nrt.NrtError as e:
            print("MISMATCH", e.status)
        print(m.cores, nrt.visible_cores())
        print(json.dumps(m({{"X": x}})["Y"].tolist()))
        """
    )
    r = run_py(code)
    assert r.returncode == 0, r.stderr
    from conftest import ort_run

    ref = ort_run(path, {"X": np.ones((2, 4), np.float32)})[0]
    lines = r.stdout.splitlines()
    assert lines[0] == "MISMATCH 2"
    assert lines[1] == "2 [[0, 1]]"
    np.testing.assert_allclose(np.array(json.loads(lines[2])), ref, rtol=1e-5, atol=1e-6)


def test_first_use_from_many_threads_at_once(tmp_path):
    # The lazily started runtime: 8 threads racing to start it get the same one.
    path = tiny_model(tmp_path / "tiny.onnx", batch=2)
    code = textwrap.dedent(
        f"""
        import threading, numpy as np, nrt
        barrier = threading.Barrier(8)
        out = []
        def work():
            barrier.wait(timeout=30)
            m = nrt.Model.load({str(path)!r})
            out.append(m({{"X": np.ones((2, 4), np.float32)}})["Y"].sum())
        ts = [threading.Thread(target=work) for _ in range(8)]
        [t.start() for t in ts]
        [t.join(timeout=60) for t in ts]
        print(len(out), len(set(out)), nrt.visible_cores())
        """
    )
    r = run_py(code, timeout=90)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[0] == "8 1 [[0], [1]]"


@pytest.mark.parametrize(
    "load",
    [nrt.Model.load, nrt.compile, nrt.InferenceSession],
    ids=["Model.load", "compile", "InferenceSession"],
)
@pytest.mark.parametrize("name", ["missing.onnx", "missing.ncm"])
def test_a_missing_model_file_is_a_file_not_found_error(tmp_path, load, name):
    import errno

    path = str(tmp_path / name)
    with pytest.raises(FileNotFoundError) as e:
        load(path)
    # Also an NrtError, as every other failure of these calls.
    assert isinstance(e.value, nrt.ModelNotFoundError) and isinstance(e.value, nrt.NrtError)
    assert e.value.status == INVALID and e.value.status_name == "NRT_INVALID"
    assert e.value.errno == errno.ENOENT and e.value.filename == path


def test_a_shape_hint_names_the_keyword_not_cli_flags(models):
    with pytest.raises(nrt.NrtError) as e:
        nrt.Model.load(models["tiny_dyn"])
    assert "input_shapes={'X': [d0, d1, ...]}" in str(e.value), str(e.value)
    assert "--input" not in str(e.value) and "nrt run" not in str(e.value), str(e.value)
