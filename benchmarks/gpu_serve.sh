#!/usr/bin/env bash
# On a lent GPU machine, under 10 minutes: first the exactness checks on CUDA (one generator on the
# device, every tensor of a verification on it, the engine's law on tiny LMs; issue 14), then the
# serving comparison at concurrency 1 and 16, vLLM plain vs
# vLLM ngram K=4 vs draftrl's drafter (depth 4 and the heuristic) inside vLLM, bf16, SmolLM2-135M
# from draftrl's cache (carry ~/.cache/draftrl). Not run yet: no GPU was lent while building it.
#
#   bash benchmarks/gpu_serve.sh [WHEEL_DIR]    # WHEEL_DIR: carried wheels of vllm (CUDA) and its deps
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${1:-}" ]; then
  python -m pip install -q --no-index --find-links "$1" vllm -e .
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python -m pytest -q -p no:cacheprovider tests/decoding/test_cuda_device.py tests/decoding/test_verification_device.py
python benchmarks/serve_compare.py --concurrency 1,16 --ks 4 --depths 4 --dsd "" --hf-lookup 0 \
  --dtype bfloat16 --max-new-tokens 96 --out runs/gpu_serve
