#!/usr/bin/env bash
# Writes the committed seed corpus of the fuzz targets (fuzz/seeds/, < 1 MiB):
#   fuzz/seeds/ncm  valid NCM models (model_decode, model_exec): the built-in near-null model on
#                   1 and 2 cores, a tiny Relu, the `cnn` sample and the small fusion/layout
#                   models of crates/compiler/tests/numerics (conv, pooling, softmax, norms,
#                   gather, pad, resize, ...), each compiled
#   fuzz/seeds/isa  their instruction blocks, each prefixed with its engine byte (isa_decode)
#   fuzz/seeds/onnx the numerics' ONNX models of up to 8 KiB (compile_onnx)
# Needs the .venv of scripts/test.sh (the onnx package).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${NRT_PYTHON:-.venv/bin/python}
cargo build --quiet -p nrt-cli -p nrt-runtime --example near_null
nrt=target/debug/nrt
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rm -rf fuzz/seeds && mkdir -p fuzz/seeds/ncm fuzz/seeds/isa fuzz/seeds/onnx
target/debug/examples/near_null fuzz/seeds/ncm/near_null_1c.ncm 1
target/debug/examples/near_null fuzz/seeds/ncm/near_null_2c.ncm 2
"$py" - "$tmp/relu.onnx" <<'PY'
import sys, onnx
from onnx import TensorProto, helper
g = helper.make_graph([helper.make_node("Relu", ["X"], ["Y"])], "relu",
                      [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
                      [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3])])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
m.ir_version = 8
onnx.save(m, sys.argv[1])
PY
"$nrt" compile "$tmp/relu.onnx" -o fuzz/seeds/ncm/relu.ncm > /dev/null
"$nrt" samples --out "$tmp/samples" > /dev/null
"$nrt" compile "$tmp/samples/cnn/model.onnx" -o fuzz/seeds/ncm/cnn.ncm > /dev/null
"$py" crates/compiler/tests/numerics/make_models.py "$tmp/numerics" > /dev/null
# One small model per pattern family, while the corpus stays well under 1 MiB.
for d in "$tmp"/numerics/*/; do
  name=$(basename "$d")
  "$nrt" compile "$d/model.onnx" -o "$tmp/$name.ncm" > /dev/null 2>&1 || continue
  if [ "$(stat -c %s "$tmp/$name.ncm")" -le 16384 ]; then
    cp "$tmp/$name.ncm" "fuzz/seeds/ncm/$name.ncm"
  fi
  [ "$(du -sb fuzz/seeds/ncm | cut -f1)" -lt 600000 ] || break
done
# The compiler's own input: the small numerics models as ONNX.
for d in "$tmp"/numerics/*/; do
  if [ "$(stat -c %s "$d/model.onnx")" -le 8192 ]; then
    cp "$d/model.onnx" "fuzz/seeds/onnx/$(basename "$d").onnx"
  fi
  [ "$(du -sb fuzz/seeds/onnx | cut -f1)" -lt 200000 ] || break
done
"$py" - <<'PY'
import glob, struct, os
# Extract each instruction block of each seed model: the BLOCKS section layout is in
# docs/ncm-format.md.
for path in sorted(glob.glob("fuzz/seeds/ncm/*.ncm")):
    b = open(path, "rb").read()
    count = struct.unpack_from("<I", b, 24)[0]
    for i in range(count):
        kind, _, off, size = struct.unpack_from("<IIQQ", b, 64 + 24 * i)
        if kind != 4:
            continue
        n = struct.unpack_from("<I", b, off)[0]
        p = off + 8
        for k in range(n):
            core, eng, _, code, relocs, _ = struct.unpack_from("<BBHIII", b, p)
            p += 16
            blk = b[p:p + code]
            p += code + 16 * relocs
            if code > 16:  # skip blocks that are only End
                out = f"fuzz/seeds/isa/{os.path.basename(path)[:-4]}-{k}"
                open(out, "wb").write(bytes([eng]) + blk)
PY
echo "seeds: $(ls fuzz/seeds/ncm | wc -l) models, $(ls fuzz/seeds/isa | wc -l) blocks, $(du -sb fuzz/seeds | cut -f1) bytes"
