"""Device faults armed at run time (nrt.inject_faults, this process only): each raises its
status, and the next call succeeds — after a reset for the fatal one."""

from __future__ import annotations

import numpy as np
import pytest

import nrt
from conftest import ort_run

# kind -> the status its execution fails with (docs: README "Environment", NRT_SIM_FAULTS).
NON_FATAL = {
    "transient": "NRT_EXEC_COMPLETED_WITH_ERR",
    "nan": "NRT_EXEC_COMPLETED_WITH_NUM_ERR",
    "parity": "NRT_EXEC_HW_ERR_NC_UE",
    "dma-abort": "NRT_EXEC_HW_ERR_DMA_ABORT",
    "hbm-ue": "NRT_EXEC_HW_ERR_HBM_UE",
    "hang": "NRT_TIMEOUT",
    "drop": "NRT_EXEC_SW_NQ_OVERFLOW",
}


@pytest.fixture(scope="module")
def setup(models):
    nrt.configure(log_level="OFF")  # the device's fault reports would clutter the output
    m = nrt.Model.load(models["tiny"], timeout=0.3)
    x = {"X": np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)}
    ref = ort_run(models["tiny"], x)[0]
    yield m, x, ref
    nrt.clear_faults()
    nrt.configure(log_level="ERROR")


@pytest.mark.parametrize("kind", sorted(NON_FATAL))
def test_non_fatal_fault_raises_then_next_call_succeeds(setup, kind):
    m, x, ref = setup
    nrt.inject_faults(kind)
    with pytest.raises(nrt.NrtError) as e:
        m(x)
    assert e.value.status_name == NON_FATAL[kind]
    assert e.value.status == nrt.STATUS[NON_FATAL[kind]]
    assert f"'{m.name}'" in str(e.value)
    np.testing.assert_allclose(m(x)["Y"], ref, rtol=1e-5, atol=1e-6)


def test_fatal_fault_needs_reset(setup):
    m, x, ref = setup
    nrt.inject_faults("fatal")
    for _ in range(2):  # the core stays fatal until reset
        with pytest.raises(nrt.NrtError) as e:
            m(x)
        assert e.value.status == 101 and e.value.status_name == "NRT_EXEC_UNIT_UNRECOVERABLE"
    m.reset()
    np.testing.assert_allclose(m(x)["Y"], ref, rtol=1e-5, atol=1e-6)
    # nrt.reset(core) does the same.
    nrt.inject_faults("fatal")
    with pytest.raises(nrt.NrtError):
        m(x)
    nrt.reset(0)
    np.testing.assert_allclose(m(x)["Y"], ref, rtol=1e-5, atol=1e-6)


def test_fault_on_one_core_leaves_the_other_alone(models, setup):
    _, x, ref = setup
    m1 = nrt.Model.load(models["tiny"], core=1)
    m0 = nrt.Model.load(models["tiny"], core=0)
    nrt.inject_faults("parity@core=1")
    np.testing.assert_allclose(m0(x)["Y"], ref, rtol=1e-5, atol=1e-6)
    with pytest.raises(nrt.NrtError) as e:
        m1(x)
    assert e.value.status_name == "NRT_EXEC_HW_ERR_NC_UE"
    m1(x)


def test_fault_through_submit(setup):
    m, x, _ = setup
    nrt.inject_faults("transient")
    with pytest.raises(nrt.NrtError) as e:
        m.submit(x).result(timeout=10)
    assert e.value.status_name == "NRT_EXEC_COMPLETED_WITH_ERR"
    m.submit(x).result(timeout=10)


def test_fault_plan_from_environment(tmp_path):
    from conftest import run_py, tiny_model

    path = tiny_model(tmp_path / "tiny.onnx", batch=2)
    code = (
        "import numpy as np, nrt\n"
        f"m = nrt.Model.load({str(path)!r})\n"
        "x = {'X': np.zeros((2, 4), np.float32)}\n"
        "m(x)\n"
        "try:\n    m(x)\nexcept nrt.NrtError as e:\n    print(e.status_name)\n"
        "m(x)\nprint('OK')\n"
    )
    r = run_py(code, env={"NRT_SIM_FAULTS": "nan@exec=2", "NEURON_RT_LOG_LEVEL": "OFF"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["NRT_EXEC_COMPLETED_WITH_NUM_ERR", "OK"]
