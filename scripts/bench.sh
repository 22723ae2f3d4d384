#!/usr/bin/env bash
# The benchmark harness: nrt-rs rows and the peers' rows, measured in the same run, printed as
# one table. Run it on an otherwise idle machine (2 vCPUs: any background job shows up).
#
#   PEERS_DIR      the bench-peers folder (default ../shared/bench-peers); without it only our
#                  rows and the ORT GEMM rows run
#   PEERS_WORKDIR  writable work folder for the peers' venv, models and builds (default
#                  target/peers)
#   SECONDS_PER    timed seconds per row (default 2)
#   PEERS          peers for bench_peers.py (default ort-t1,ort-t2,tract-native)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
peers_dir=${PEERS_DIR:-$root/../shared/bench-peers}
export PEERS_WORKDIR=${PEERS_WORKDIR:-$root/target/peers}
secs=${SECONDS_PER:-2}
peers=${PEERS:-ort-t1,ort-t2,tract-native}
mkdir -p "$PEERS_WORKDIR"
out="$PEERS_WORKDIR/run"
rm -rf "$out" && mkdir -p "$out"

cargo build --quiet --release -p nrt-cli
nrt="$root/target/release/nrt"

venv="$PEERS_WORKDIR/venv"
if [ -d "$peers_dir" ]; then
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet -r "$peers_dir/requirements.txt"
  fi
  "$venv/bin/python" "$peers_dir/make_models.py" --out "$PEERS_WORKDIR/models" > /dev/null
  if [[ "$peers" == *tract-native* ]] && [ ! -x "$PEERS_WORKDIR/tract_native-target/release/tract_native" ]; then
    echo "building the native tract peer (first time only, ~4 min)..." >&2
    cargo build --quiet --release --manifest-path "$peers_dir/tract_native/Cargo.toml" \
      --target-dir "$PEERS_WORKDIR/tract_native-target"
  fi
else
  echo "no bench-peers folder at $peers_dir: peers skipped" >&2
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet onnx==1.22.0 onnxruntime==1.32.0 numpy
  fi
fi
py="$venv/bin/python"

echo "== nrt: runtime overhead rows (with a co-tenant process, the sample models on 1 and 2 cores, 2 processes)" >&2
"$nrt" bench --json --seconds "$secs" > "$out/nrt.jsonl"
echo "== nrt: GEMM through the device; ONNX Runtime single-thread GEMM" >&2
"$nrt" bench --gemm --json --seconds "$secs" >> "$out/nrt.jsonl"
"$py" scripts/ort_gemm.py "$secs" > "$out/ort_gemm.jsonl"
echo "== nrt: compute models" >&2
"$nrt" samples --out "$out/samples" > /dev/null
models=()
if [ -d "$PEERS_WORKDIR/models" ]; then
  for m in tiny mlp mlp_b64 encoder; do models+=("$PEERS_WORKDIR/models/$m.onnx"); done
fi
models+=("$out/samples/cnn/model.onnx" "$out/samples/int8_gemm/model.onnx" "$out/samples/lstm_step/model.onnx")
for m in "${models[@]}"; do
  name=$(basename "$m" .onnx); [ "$name" = model ] && name=$(basename "$(dirname "$m")")
  "$nrt" bench "$m" --json --seconds "$secs" | sed "s/\"model\":\"[^\"]*\"/\"model\":\"$name\"/" >> "$out/nrt.jsonl"
  # The same model with bf16 weights (`--auto-cast matmult`), beside the f32 peers (not for
  # the int8 row, whose product is not an f32 MatMul; the LSTM's weights are cast too).
  case "$name" in
    int8_gemm) ;;
    *)
      "$nrt" bench "$m" --json --seconds "$secs" --auto-cast matmult \
        | sed "s/\"model\":\"[^\"]*\"/\"model\":\"${name}_bf16\"/" >> "$out/nrt.jsonl"
      ;;
  esac
  case "$name" in
    mlp_b64|encoder)
      # Split across two cores (each computing on its own device thread), beside ORT's 2-thread row.
      "$nrt" bench "$m" --cores 2 --json --seconds "$secs" | sed "s/\"model\":\"[^\"]*\"/\"model\":\"$name\"/" >> "$out/nrt.jsonl"
      ;;
  esac
  if [ "$name" = mlp_b64 ]; then
    # Two processes, one core each, at the same time: the table sums their throughput.
    for c in 0 1; do
      NEURON_RT_VISIBLE_CORES=$c NRT_RUNTIME_DIR="$out/procs-run" "$nrt" bench "$m" --json --seconds "$secs" \
        | sed "s/\"model\":\"[^\"]*\"/\"model\":\"$name\"/; s/\"surface\":\"sync\"/\"surface\":\"process-of-2\"/" \
        > "$out/proc$c.jsonl" &
    done
    wait
    cat "$out/proc0.jsonl" "$out/proc1.jsonl" >> "$out/nrt.jsonl"
  fi
done
# The bf16 rows' error: each model with seeded inputs and ONNX Runtime's f32 outputs
# (scripts/ort_oracle.py), checked by `nrt conformance --auto-cast matmult` with tolerances
# loose enough to pass, so that it prints each model's max error / max |reference|.
echo "== nrt: bf16 auto-cast error against ONNX Runtime f32" >&2
errdir="$out/bf16_err"
mkdir -p "$errdir"
for m in "${models[@]}"; do
  name=$(basename "$m" .onnx); [ "$name" = model ] && name=$(basename "$(dirname "$m")")
  case "$name" in int8_gemm) continue ;; esac
  mkdir -p "$errdir/$name" && cp "$m" "$errdir/$name/model.onnx"
done
"$py" scripts/ort_oracle.py "$errdir"/* > /dev/null || true
"$nrt" conformance "$errdir" --auto-cast matmult --auto-cast-type bf16 --rtol 1 --atol 1 \
  > "$out/bf16_err.txt" || true
if [ -d "$peers_dir" ]; then
  echo "== peers: $peers" >&2
  "$py" "$peers_dir/bench_peers.py" --seconds "$secs" --models tiny,mlp,mlp_b64,encoder --peers "$peers" \
    2> "$out/peers.log" > /dev/null || true
fi
# The project's own samples the shared peers script does not know (cnn; int8_gemm, a
# dynamically quantized 64x512x512 layer: DynamicQuantizeLinear + MatMulInteger; lstm_step,
# one streaming LSTM step with its state): ONNX Runtime 1 and 2 threads, timed the same way,
# in the same log.
for m in cnn int8_gemm lstm_step; do
  "$py" scripts/ort_model.py "$out/samples/$m/model.onnx" "$m" "$secs" >> "$out/peers.log" || true
done
"$py" scripts/bench_table.py "$out"
