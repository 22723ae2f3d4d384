#!/usr/bin/env bash
# Writes seed inputs for the fuzz targets: compiled models of the project's samples (NCM) and
# their SP/PE/DVE blocks prefixed with an engine byte.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --quiet --release -p nrt-cli
nrt=target/release/nrt
tmp=$(mktemp -d)
"$nrt" samples --out "$tmp" > /dev/null
mkdir -p fuzz/corpus/model_decode fuzz/corpus/isa_decode
for d in "$tmp"/*; do
  name=$(basename "$d")
  "$nrt" compile "$d/model.onnx" -o "fuzz/corpus/model_decode/$name.ncm" > /dev/null
done
python3 - <<'PY'
import glob, struct, os
# Extract each instruction block of each seed model: the BLOCKS section layout is in
# docs/ncm-format.md.
for path in glob.glob("fuzz/corpus/model_decode/*.ncm"):
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
            out = f"fuzz/corpus/isa_decode/{os.path.basename(path)}-{k}"
            open(out, "wb").write(bytes([eng]) + blk)
PY
echo "seeds: $(ls fuzz/corpus/model_decode | wc -l) models, $(ls fuzz/corpus/isa_decode | wc -l) blocks"
