"""100k calls with flat memory: the Python layer leaks nothing per call."""

from __future__ import annotations

import numpy as np

import nrt


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def test_100k_calls_flat_rss(models):
    m = nrt.Model.load(models["tiny"])
    x = {"X": np.ones((2, 4), np.float32)}
    t = nrt.Tensor.from_numpy(x["X"])
    for _ in range(10_000):  # warm: pools, allocator arenas
        m(x)
    before = rss_kib()
    for i in range(100_000):
        y = m(x if i % 2 else {"X": t})
    after = rss_kib()
    assert y["Y"].shape == (2, 4)
    # 100k calls each allocating an output array and a dict: a leak of even 64 bytes per
    # call would be 6 MiB.
    assert after - before < 4096, f"RSS grew {after - before} KiB over 100k calls"
