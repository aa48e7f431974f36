"""The serve track's rollout: one episode of a serving env (many requests under load, one engine
step per env step), the record of ``draftrl eval --engine vllm``."""

from __future__ import annotations

from typing import Any


def run_episode(env, policy: Any, prompt_ids: list[str], seed: int = 0,
                check: Any = None) -> tuple[list, list[dict]]:
    """One episode of a serving env (``draftrl/ServeVLLM-v1``, ``ServeReplay-v1``) over ``prompt_ids``,
    ``policy`` (a ``draftrl.policies.Policy`` built for ``env``) choosing every step
    (:func:`draftrl.policies.evaluate.evaluate_policy` with one episode); returns the request
    timelines and per-step records. ``check`` (a ``SampledStreamCheck``) observes every step's requests."""
    from draftrl.policies.evaluate import evaluate_policy

    steps: list[dict] = []
    last: dict = {}

    def record(info: dict) -> None:
        if check is not None and getattr(check, "routes_by_class", False):  # a temperature mix: each to its class
            by_id = getattr(env.unwrapped, "_by_id", {})
            check.observe(info["request_steps"], {r.request_id: by_id[r.request_id].sampling
                                                  for r in info["request_steps"] if r.request_id in by_id})
        elif check is not None:
            check.observe(info["request_steps"])
        steps.append({"seconds": info["seconds"], "cpu_seconds": info.get("cpu_seconds"),
                      "num_emitted": info["num_emitted"],
                      "num_verified": info["num_verified"],
                      "num_accepted": info["num_accepted"], "depth": info["depth"], "budget": info["budget"],
                      "decoding": info["decoding"]})
        last["info"] = info

    evaluate_policy(policy, env, episodes=1, seed=seed, options={"prompt_ids": prompt_ids}, on_round=record)
    return last["info"]["requests"], steps


def episode_throughput(env, policy: Any, prompt_ids: list[str], seed: int = 0) -> float:
    """Tokens per engine second of one :func:`run_episode` (``policy`` choosing each action)."""
    requests, steps = run_episode(env, policy, prompt_ids, seed=seed)
    return sum(len(r.token_ids) for r in requests) / sum(st["seconds"] for st in steps)
