"""Ray's own Neuron detection on `nrt ls --json-output`.

Ray finds a node's Neuron cores in `NeuronAcceleratorManager.get_current_node_num_accelerators`
(ray/_private/accelerators/neuron.py): it runs `/opt/aws/neuron/bin/neuron-ls --json-output`
and sums `nc_count`. Nothing is installed at that system path: the test makes the tools'
links with `nrt install-tools DIR` and redirects only that one command to `DIR/neuron-ls` (the
`nrt` binary answering to its name), letting Ray's code do its own parsing. Run by
scripts/test.sh beside the Ray Serve test (skipped with NRT_SKIP_RAY=1).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")
from ray._private.accelerators import neuron as ray_neuron  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
NRT = os.environ.get("NRT_CLI", str(ROOT / "target" / "release" / "nrt"))
NEURON_LS = "/opt/aws/neuron/bin/neuron-ls"


@pytest.fixture
def nrt_as_neuron_ls(monkeypatch, tmp_path):
    """Makes Ray's call of neuron-ls run the `neuron-ls` link of `nrt install-tools` with the
    given environment."""
    if not Path(NRT).exists():
        pytest.fail(f"{NRT} is missing: cargo build --release -p nrt-cli (or set NRT_CLI)")
    subprocess.run([NRT, "install-tools", str(tmp_path)], check=True, capture_output=True)
    link = tmp_path / "neuron-ls"
    assert link.is_symlink()
    env = {}
    real_run = subprocess.run
    real_isdir = os.path.isdir
    calls = []

    def run(args, *a, **kw):
        if isinstance(args, (list, tuple)) and args and args[0] == NEURON_LS:
            calls.append(list(args))
            return real_run([str(link), *args[1:]], *a, env={**os.environ, **env}, **kw)
        return real_run(args, *a, **kw)

    def isdir(p):
        return p.rstrip("/") == os.path.dirname(NEURON_LS) or real_isdir(p)

    monkeypatch.setattr(ray_neuron.subprocess, "run", run)
    monkeypatch.setattr(ray_neuron.os.path, "isdir", isdir)
    monkeypatch.setattr(sys, "platform", "linux")
    return env, calls


@pytest.mark.parametrize(
    "instance, cores",
    [("sim", 2), ("inf2.xlarge", 2), ("inf2.48xlarge", 24), ("trn1.32xlarge", 32), ("trn2.48xlarge", 128)],
)
def test_ray_counts_the_cores_of_each_instance(nrt_as_neuron_ls, runtime_dir, instance, cores):
    env, calls = nrt_as_neuron_ls
    env["NRT_SIM_INSTANCE"] = instance
    env["NRT_RUNTIME_DIR"] = runtime_dir("ls-")
    assert ray_neuron.NeuronAcceleratorManager.get_current_node_num_accelerators() == cores
    # Ray ran its own command line, which we only redirected.
    assert calls == [[NEURON_LS, "--json-output"]]
    # Where Ray knows the instance type, its own table agrees.
    if instance in ray_neuron.AWS_NEURON_INSTANCE_MAP:
        assert ray_neuron.AWS_NEURON_INSTANCE_MAP[instance] == cores


def test_ray_parses_the_output_while_a_process_holds_cores(nrt_as_neuron_ls, runtime_dir):
    env, _ = nrt_as_neuron_ls
    run_dir = runtime_dir("ls-")
    env["NRT_RUNTIME_DIR"] = run_dir
    holder = subprocess.Popen(
        [NRT, "idle", "--seconds", "60"],
        env={**os.environ, "NRT_RUNTIME_DIR": run_dir, "NEURON_RT_VISIBLE_CORES": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            out = subprocess.run([NRT, "ls", "--json-output"], env={**os.environ, **env},
                                 capture_output=True, check=True)
            devices = json.loads(out.stdout)
            if devices[0]["neuron_processes"]:
                break
            assert holder.poll() is None, "the holder exited"
            assert time.monotonic() < deadline, "the holder never showed up"
            time.sleep(0.05)
        assert devices[0]["neuron_processes"][0]["pid"] == holder.pid
        # Ray still counts every core of the node (held ones included, as with neuron-ls).
        assert ray_neuron.NeuronAcceleratorManager.get_current_node_num_accelerators() == 2
    finally:
        holder.kill()
        holder.wait(timeout=30)
