"""The hostile suite's second pass (issue 54): the host side through the real command line.

Called by scripts/hostile.py with its `run` and `verdict` (each case ends cleanly: no signal,
panic or hang; a refusal names the culprit). Cases:

1. The runtime directory against another local user (as two unprivileged uids made with
   `setpriv`, where this runs as root; skipped with the reason otherwise): a planted default
   directory or symlink to it is refused; a link planted at a lock file in a shared group
   directory is refused and its target untouched; a FIFO named like a record does not hang
   `nrt ls`; a shared directory used under umask 077 does not lock the other user out.
2. Records: a FIFO, a link to /dev/zero and a record claiming 0xffffffff cores through
   `nrt ls` / `nrt monitor` under a 2 GiB address-space limit.
3. The Prometheus endpoint: 20 idle connections and a client sending a byte a second do not
   delay a scrape.
4. `nrt monitor -c`: fields of the wrong type named, a 50 MiB file refused at once with a
   short error.
5. The environment: core lists and counts past every host, the trn2.48xlarge preset.
6. `.npy` inputs: a 128-byte file of nested brackets, a 13-byte file declaring a 4 GiB header,
   a bool input, an object array.
"""
import fcntl
import os
import shutil
import socket
import struct
import subprocess
import time

import numpy as np
import onnx
from onnx import TensorProto, helper

NOBODY = 65534  # the victim
OTHER = 65533  # the attacker
GROUP = 65530  # a group both are in


def as_user(uid, cmd, groups=(), umask=None):
    """The command run as `uid` (and gid `uid`) with supplementary `groups`."""
    pre = ["setpriv", f"--reuid={uid}", f"--regid={uid}"]
    pre += [f"--groups={','.join(map(str, groups))}"] if groups else ["--clear-groups"]
    if umask is not None:
        return pre + ["sh", "-c", f"umask {umask:03o}; exec \"$@\"", "sh"] + cmd
    return pre + cmd


def clean_env():
    return {"NRT_RUNTIME_DIR": "", "XDG_RUNTIME_DIR": "", "HOME": "/"}


def relu_model(path):
    g = helper.make_graph(
        [helper.make_node("Relu", ["X"], ["Y"])],
        "relu",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4])],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def bool_model(path):
    g = helper.make_graph(
        [helper.make_node("Not", ["B"], ["Y"])],
        "not",
        [helper.make_tensor_value_info("B", TensorProto.BOOL, [4])],
        [helper.make_tensor_value_info("Y", TensorProto.BOOL, [4])],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def cross_user(nrt, run, verdict, work, ncm):
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        print("   cross-user runtime-directory cases skipped: they need root and setpriv to act as two users")
        return
    shared_root = f"/tmp/nrt-hostile-xuser-{os.getpid()}"
    default = f"/dev/shm/nrt-rs-{NOBODY}"
    shutil.rmtree(shared_root, ignore_errors=True)
    subprocess.run(["rm", "-rf", default])
    os.makedirs(shared_root)
    os.chmod(shared_root, 0o755)
    try:
        model = os.path.join(shared_root, "relu.ncm")
        shutil.copy(ncm, model)
        os.chmod(model, 0o644)
        # The victim's own file, which the attacker wants destroyed.
        mine = os.path.join(shared_root, "victims")
        os.makedirs(mine)
        os.chown(mine, NOBODY, NOBODY)
        os.chmod(mine, 0o700)
        precious = os.path.join(mine, "precious.txt")
        with open(precious, "w") as f:
            f.write("precious")
        os.chown(precious, NOBODY, NOBODY)

        def unchanged(case):
            with open(precious) as f:
                ok = f.read() == "precious"
            verdict(case, 0 if ok else 1, "", "" if ok else "the victim's file was changed", must_fail=False)

        # a. The attacker pre-creates the victim's default directory, writable by all.
        rc, _, err = run(as_user(OTHER, ["sh", "-c", f"mkdir -m 777 {default} && ln -s {precious} {default}/core-0.lock"]))
        assert rc == 0, err
        rc, out, err = run(as_user(NOBODY, [nrt, "run", model]), env_extra=clean_env())
        verdict("xuser/planted default directory", rc, out, err, must_fail=True, expect=f"owned by uid {OTHER}")
        unchanged("xuser/planted default directory: victim file")
        # b. ... or a link to a directory of the victim's.
        subprocess.run(["rm", "-rf", default])
        rc, _, err = run(as_user(OTHER, ["ln", "-s", mine, default]))
        assert rc == 0, err
        rc, out, err = run(as_user(NOBODY, [nrt, "run", model]), env_extra=clean_env())
        verdict("xuser/planted default symlink", rc, out, err, must_fail=True, expect="symbolic link owned by uid")
        unchanged("xuser/planted default symlink: victim file")
        subprocess.run(["rm", "-rf", default])
        # c. A deliberately shared directory: root's, group GROUP, 3770.
        shared = os.path.join(shared_root, "shared")
        os.makedirs(shared)
        os.chown(shared, 0, GROUP)
        os.chmod(shared, 0o3770)
        env = {"NRT_RUNTIME_DIR": shared, "NEURON_RT_VISIBLE_CORES": "0"}
        rc, _, err = run(as_user(OTHER, ["ln", "-s", precious, f"{shared}/core-0.lock"], groups=[GROUP]))
        assert rc == 0, err
        rc, out, err = run(as_user(NOBODY, [nrt, "run", model], groups=[GROUP]), env_extra=env)
        verdict("xuser/planted lock link in a shared directory", rc, out, err, must_fail=True, expect="core-0.lock")
        unchanged("xuser/planted lock link: victim file")
        os.unlink(f"{shared}/core-0.lock")
        rc, _, err = run(as_user(OTHER, ["mkfifo", f"{shared}/proc-1-0.rec"], groups=[GROUP]))
        assert rc == 0, err
        rc, out, err = run(as_user(NOBODY, [nrt, "ls"], groups=[GROUP]), env_extra=env, timeout=10)
        verdict("xuser/FIFO named like a record (nrt ls)", rc, out, err, must_fail=False)
        if rc is not None and "skipping" not in err:
            verdict("xuser/FIFO named in nrt ls", 1, out, "the FIFO was not named", must_fail=False)
        # d. One user under umask 077, then the other: the lock files stay usable.
        rc, out, err = run(as_user(NOBODY, [nrt, "run", model], groups=[GROUP], umask=0o077), env_extra=env)
        verdict("xuser/shared directory, first user under umask 077", rc, out, err, must_fail=False)
        if rc != 0:
            verdict("xuser/first user ran", 1, out, err, must_fail=False)
        rc, out, err = run(as_user(OTHER, [nrt, "run", model], groups=[GROUP]), env_extra=env)
        verdict("xuser/shared directory, second user after it", rc, out, err, must_fail=False)
        if rc != 0:
            verdict("xuser/second user locked out", 1, out, err, must_fail=False)
        # e. A group-writable directory without the sticky bit is refused.
        os.chmod(shared, 0o2770)
        rc, out, err = run(as_user(NOBODY, [nrt, "run", model], groups=[GROUP]), env_extra=env)
        verdict("xuser/group directory without the sticky bit", rc, out, err, must_fail=True, expect="sticky bit")
    finally:
        subprocess.run(["rm", "-rf", default])
        shutil.rmtree(shared_root, ignore_errors=True)


def records(nrt, run, verdict, work):
    d = os.path.join(work, "records")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d, mode=0o700)
    os.mkfifo(os.path.join(d, "proc-1-0.rec"))
    os.symlink("/dev/zero", os.path.join(d, "proc-2-0.rec"))
    env = {"NRT_RUNTIME_DIR": d}
    for cmd in (["ls"], ["ls", "--json-output"], ["monitor", "--count", "1", "--period", "0.05"]):
        rc, out, err = run([nrt] + cmd, env_extra=env, address_space=2 << 30, timeout=15)
        verdict(f"records/FIFO and /dev/zero link (nrt {' '.join(cmd)})", rc, out, err, must_fail=False)
        if rc == 0 and ("proc-1-0.rec" not in err or "proc-2-0.rec" not in err):
            verdict(f"records/named (nrt {cmd[0]})", 1, out, "the skipped files are not named", must_fail=False)
    # A live record (its lock held) claiming 0xffffffff cores for its first logical core.
    header_words = 7 + 4 + 1 + 64 + 1 + 8 + 8
    vcore_words = 2 + 6 + 6 + 1 + 1 + 6 + 160 + 160 + 1
    words = [0] * (header_words + 128 * vcore_words + 64 * 16)
    words[0] = struct.unpack("<Q", b"NRTHOST1")[0]
    words[1], words[2], words[3], words[5], words[6] = 3, 1, os.getpid(), 1, 1
    words[header_words + 1] = 0xFFFFFFFF
    rec = os.path.join(d, f"proc-{os.getpid()}-99.rec")
    with open(rec, "wb") as f:
        f.write(struct.pack(f"<{len(words)}Q", *words))
    held = open(rec, "rb")
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        for cmd in (["monitor", "--count", "1", "--period", "0.05"], ["ls"]):
            rc, out, err = run([nrt] + cmd, env_extra=env, address_space=2 << 30, timeout=15)
            verdict(f"records/0xffffffff cores (nrt {cmd[0]})", rc, out, err, must_fail=False)
            if rc == 0 and "spans 4294967295 cores" not in err:
                verdict(f"records/0xffffffff cores named (nrt {cmd[0]})", 1, out, "not named: " + err[-200:], must_fail=False)
    finally:
        held.close()


def prometheus(nrt, run, verdict, work):
    d = os.path.join(work, "prom-run")
    os.makedirs(d, mode=0o700, exist_ok=True)
    p = subprocess.Popen([nrt, "monitor", "--period", "0.1", "--prometheus", "127.0.0.1:0"],
                         env={**os.environ, "NRT_RUNTIME_DIR": d},
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    socks = []
    try:
        line = p.stderr.readline().decode()
        port = int(line.rsplit(":", 1)[1].split("/")[0])
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            socks.append(s)
        slow = socket.create_connection(("127.0.0.1", port), timeout=5)
        slow.sendall(b"G")
        socks.append(slow)
        time.sleep(0.3)
        t = time.time()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            body = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                body += chunk
        took = time.time() - t
        ok = body.startswith(b"HTTP/1.1 200") and took < 3.0
        verdict("prometheus/a scrape beside 20 idle and one slow client", 0 if ok else 1, "",
                "" if ok else f"took {took:.1f} s: {body[:80]!r}", must_fail=False)
    except Exception as e:  # noqa: BLE001 - any failure is the case's
        verdict("prometheus/a scrape beside 20 idle and one slow client", 1, "", repr(e), must_fail=False)
    finally:
        for s in socks:
            s.close()
        p.kill()
        p.wait()


def monitor_config(nrt, run, verdict, work):
    cases = [
        ('{"period": 5}', "period"),
        ('{"neuron_runtimes": {}}', "neuron_runtimes"),
        ('{"neuron_runtimes": [{"tag_filter": 3}]}', "tag_filter"),
        ('{"neuron_runtimes": [{"metrics": [{"type": 1}]}]}', "metrics[0]"),
        ('{"system_metrics": "all"}', "system_metrics"),
        ('[1]', "JSON object"),
    ]
    for i, (text, field) in enumerate(cases):
        path = os.path.join(work, f"monitor-{i}.json")
        with open(path, "w") as f:
            f.write(text)
        rc, out, err = run([nrt, "monitor", "-c", path, "--count", "1"])
        verdict(f"monitor-config/{text}", rc, out, err, must_fail=True, expect=field)
    big = os.path.join(work, "monitor-big.json")
    with open(big, "w") as f:
        f.write('{"neuron_runtimes": [{"tag_filter": "' + "a" * (50 << 20) + '"}]}')
    rc, out, err = run([nrt, "monitor", "-c", big, "--count", "1"], address_space=1 << 30, timeout=10)
    verdict("monitor-config/50 MiB file", rc, out, err, must_fail=True, expect="at most")
    if len(err) > 2000:
        verdict("monitor-config/50 MiB file: short error", 1, out, f"error of {len(err)} bytes", must_fail=False)
    os.unlink(big)


def environment(nrt, run, verdict, work, ncm):
    d = os.path.join(work, "env-run")
    os.makedirs(d, mode=0o700, exist_ok=True)
    for k, v, why in [
        ("NEURON_RT_VISIBLE_CORES", "0-4294967295", "past the largest host"),
        ("NEURON_RT_NUM_CORES", "4294967295", "more than the largest host"),
    ]:
        rc, out, err = run([nrt, "run", ncm], env_extra={k: v, "NRT_RUNTIME_DIR": d},
                           address_space=1 << 30, timeout=10)
        verdict(f"env/{k}={v}", rc, out, err, must_fail=True, expect=why)
    rc, out, err = run([nrt, "run", ncm], env_extra={"NRT_SIM_INSTANCE": "trn2.48xlarge", "NRT_RUNTIME_DIR": d})
    verdict("env/NRT_SIM_INSTANCE=trn2.48xlarge runs", rc, out, err, must_fail=False)
    if rc != 0:
        verdict("env/trn2.48xlarge", 1, out, err, must_fail=False)


def npy_files(nrt, run, verdict, work, relu_onnx, not_onnx):
    def raw_npy(path, header, data=b"", version=1):
        with open(path, "wb") as f:
            if version == 1:
                f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + data)
            else:
                f.write(b"\x93NUMPY\x02\x00" + struct.pack("<I", len(header)) + header + data)

    nested = os.path.join(work, "nested.npy")
    raw_npy(nested, b"{'descr': '<f4', 'fortran_order': False, 'shape': " + b"(" * 60 + b"}")
    big = os.path.join(work, "bighdr.npy")
    with open(big, "wb") as f:
        f.write(b"\x93NUMPY\x02\x00" + struct.pack("<I", 0xFFFFFFFF) + b"{")
    obj = os.path.join(work, "object.npy")
    np.save(obj, np.array([1, "a", None, 2.0], dtype=object), allow_pickle=True)
    for path, why in [(nested, "not a tuple"), (big, "numpy reads at most"), (obj, "not supported")]:
        rc, out, err = run([nrt, "run", relu_onnx, "--input", f"X={path}"], address_space=1 << 30, timeout=10)
        verdict(f"npy/{os.path.basename(path)}", rc, out, err, must_fail=True, expect=why)
    b = os.path.join(work, "bool.npy")
    np.save(b, np.array([True, False, True, False]))
    outdir = os.path.join(work, "bool-out")
    rc, out, err = run([nrt, "run", not_onnx, "--input", f"B={b}", "--output-dir", outdir, "--npy"])
    verdict("npy/bool input", rc, out, err, must_fail=False)
    try:
        y = np.load(os.path.join(outdir, "Y.npy"))
        ok = list(y.astype(bool)) == [False, True, False, True]
    except Exception as e:  # noqa: BLE001
        ok, err = False, repr(e)
    if not ok:
        verdict("npy/bool input computes Not", 1, out, err, must_fail=False)


def run_all(nrt, work, run, verdict):
    """Every case of the second pass."""
    work = os.path.join(work, "host")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    os.chmod(work, 0o755)
    relu_onnx = os.path.join(work, "relu.onnx")
    relu_model(relu_onnx)
    not_onnx = os.path.join(work, "not.onnx")
    bool_model(not_onnx)
    ncm = os.path.join(work, "relu.ncm")
    rc, _, err = run([nrt, "compile", relu_onnx, "-o", ncm])
    assert rc == 0, err
    os.chmod(ncm, 0o644)
    cross_user(nrt, run, verdict, work, ncm)
    records(nrt, run, verdict, work)
    prometheus(nrt, run, verdict, work)
    monitor_config(nrt, run, verdict, work)
    environment(nrt, run, verdict, work, ncm)
    npy_files(nrt, run, verdict, work, relu_onnx, not_onnx)
