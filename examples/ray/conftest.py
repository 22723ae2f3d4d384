"""Shared by the Ray tests: fresh `NRT_RUNTIME_DIR`s, all under one directory that is removed
when the test session ends (Ray's workers are gone by then: each test shuts Ray down)."""

from __future__ import annotations

import atexit
import shutil
import signal
import tempfile

import pytest

_RUNTIME_DIRS = tempfile.mkdtemp(prefix="nrt-ray-tests-")
atexit.register(shutil.rmtree, _RUNTIME_DIRS, ignore_errors=True)


@pytest.fixture
def runtime_dir():
    """Makes a fresh NRT_RUNTIME_DIR: ownership of cores is per directory, so each Ray node and
    each `nrt ls` run a test starts gets its own (`runtime_dir("node0-")`)."""
    return lambda prefix="rt-": tempfile.mkdtemp(prefix=prefix, dir=_RUNTIME_DIRS)


@pytest.fixture(autouse=True)
def bounded(request):
    """Fails a test that outlives its module's `TEST_BUDGET_S` (default 150 s: Ray start and
    deploy on 2 vCPUs take ~15-30 s each) instead of hanging the suite."""
    budget = getattr(request.module, "TEST_BUDGET_S", 150)

    def expired(*_):
        raise TimeoutError(f"test exceeded {budget} s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(budget)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)
