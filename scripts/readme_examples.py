#!/usr/bin/env python3
"""The README's examples, run as written: every ```sh / ```bash block marked cheap with
`<!-- examples: run -->` on the line before it (builds, the test command and LLM builds are
left unmarked).

Each marked block runs with bash (`set -euo pipefail`) in a fresh scratch directory that
links the checkout's top-level entries (`target`, `conformance`, `.venv`, ...), so paths read
as from the repository root while whatever the block writes lands in the scratch directory;
`nrt` on PATH is the binary given with --nrt; the runtime directory is the scratch's own. Each
block has a time limit. Prints one line per block and a summary; exits 1 if one failed.

    scripts/readme_examples.py --nrt target/release/nrt [--readme README.md] [--timeout 60]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MARK = "<!-- examples: run -->"
FENCE = re.compile(r"^```(sh|bash)\s*$")


def marked_blocks(text: str) -> list[tuple[int, str]]:
    """(line number, code) of each shell block whose previous non-blank line is MARK."""
    lines = text.splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        if FENCE.match(lines[i]):
            start = i
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            k = start - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            if k >= 0 and lines[k].strip() == MARK:
                blocks.append((start + 1, "\n".join(lines[start + 1 : j])))
            i = j + 1
        else:
            i += 1
    return blocks


def linked_entries(root: Path) -> list[str]:
    """The checkout's tracked top-level entries, and `target` and `.venv`: not the outputs a
    reader's own run of the examples may have left in the checkout (`models/`, ...), so a
    block writes into the scratch directory, never through a link into the checkout."""
    try:
        names = subprocess.run(
            ["git", "ls-tree", "--name-only", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        names = [e.name for e in root.iterdir() if e.name != ".git"]
    return sorted({n for n in [*names, "target", ".venv"] if (root / n).exists()})


def main() -> int:
    root = Path(__file__).resolve().parents[1]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nrt", required=True, type=Path, help="the nrt binary (e.g. target/release/nrt)")
    ap.add_argument("--readme", type=Path, default=root / "README.md")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per block")
    a = ap.parse_args()
    nrt = a.nrt.resolve()
    if not nrt.is_file():
        print(f"readme examples: {nrt} is missing (cargo build --release -p nrt-cli)", file=sys.stderr)
        return 1
    blocks = marked_blocks(a.readme.read_text())
    if not blocks:
        print(f"readme examples: no block of {a.readme} is marked {MARK!r}", file=sys.stderr)
        return 1
    failed = 0
    t_all = time.monotonic()
    for line, code in blocks:
        with tempfile.TemporaryDirectory(prefix="nrt-readme-") as scratch:
            work = Path(scratch) / "repo"
            work.mkdir()
            for name in linked_entries(root):
                (work / name).symlink_to(root / name)
            bin_dir = Path(scratch) / "bin"
            bin_dir.mkdir()
            (bin_dir / "nrt").symlink_to(nrt)
            env = {
                **os.environ,
                "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
                "NRT_RUNTIME_DIR": str(Path(scratch) / "run"),
            }
            t0 = time.monotonic()
            try:
                r = subprocess.run(
                    ["bash", "-c", "set -euo pipefail\n" + code],
                    cwd=work,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=a.timeout,
                )
                ok, why = r.returncode == 0, f"exit {r.returncode}"
                out, err = r.stdout, r.stderr
            except subprocess.TimeoutExpired as e:
                ok, why = False, f"over {a.timeout:.0f} s"
                out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
                err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
            dt = time.monotonic() - t0
        print(f"{'PASS' if ok else 'FAIL'} README.md:{line} ({dt:.1f} s){'' if ok else ': ' + why}")
        if not ok:
            failed += 1
            print(f"--- block\n{code}\n--- stdout\n{out[-4000:]}\n--- stderr\n{err[-4000:]}", file=sys.stderr)
    print(
        f"readme examples: {len(blocks) - failed} passed, {failed} failed "
        f"({time.monotonic() - t_all:.1f} s)"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
