"""Greedy responses from vLLM, batched, in a process of its own.

    python -m draftrl.distill.generate_vllm MODEL DTYPE MAX_NEW_TOKENS IN.jsonl OUT.jsonl

A child process because vLLM pins the CPU threads and replaces ``torch.set_num_threads`` in the
process that loads it, which would slow the distillation's later phases. ``IN`` holds one prompt
record per line (any fields, with ``prompt_ids``); each record is appended to ``OUT`` with its
``response_ids``, a chunk at a time, and ``done N`` is printed after each chunk (the parent's
progress). About 6x Hugging Face ``generate``'s throughput on 2 CPU cores (144 vs 25 tokens/s,
SmolLM2-135M, float32).
"""

from __future__ import annotations

import json
import os
import sys

#: prompts per ``generate`` call: what an interruption can lose, and the progress step
CHUNK = 64


def main(argv: list[str] | None = None) -> int:
    model, dtype, max_new, source, out = argv if argv is not None else sys.argv[1:]
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    from vllm import LLM, SamplingParams

    with open(source) as f:
        records = [json.loads(line) for line in f]
    longest = max((len(r["prompt_ids"]) for r in records), default=0)
    llm = LLM(model=model, dtype=dtype, enforce_eager=True, max_model_len=longest + int(max_new) + 8, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=int(max_new))
    with open(out, "a") as f:
        for start in range(0, len(records), CHUNK):
            chunk = records[start : start + CHUNK]
            outputs = llm.generate([{"prompt_token_ids": r["prompt_ids"]} for r in chunk], params, use_tqdm=False)
            for record, output in zip(chunk, outputs):
                f.write(json.dumps({**record, "response_ids": list(output.outputs[0].token_ids)}) + "\n")
            f.flush()
            print(f"done {start + len(chunk)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
