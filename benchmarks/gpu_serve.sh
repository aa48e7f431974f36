#!/usr/bin/env bash
# Serving comparison on a lent GPU machine, under 10 minutes: concurrency 1 and 16, vLLM plain vs
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
python benchmarks/serve_compare.py --concurrency 1,16 --ks 4 --depths 4 --dsd "" --hf-lookup 0 \
  --dtype bfloat16 --max-new-tokens 96 --out runs/gpu_serve
