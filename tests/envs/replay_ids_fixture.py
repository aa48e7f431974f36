"""What the replayed env ids did, pinned (as v0): ``TraceReplay-v0``, ``TraceReplayDepth-v0``, ``ServeReplay-v0``.

An id keeps its version only while its episodes stay the same for the same seed and actions
(``docs/architecture.md``: a version goes up when the reward or the spaces change). This module
plays fixed action sequences (3 seeds x 2 episodes per case, seeded action draws) on model-free
traces and recordings built here, and writes every observation, reward, termination, ``info``
entry and ``lookahead_action()`` to ``data/replay_ids_v0.json.gz`` (gzipped JSON). The file was written by the
envs as they were before issue 42 moved the round walk into a replay engine
(``draftrl.replay.round_engine``); ``test_replay_ids_fixture.py`` replays the cases on the code of
today and requires every number to be bit-identical.

Issue 45 bumped ``TraceReplay-v0`` / ``TraceReplayDepth-v0`` to ``-v1``: their observation gained the
request's sampling and the target's signals (``draftrl.signals.features.REQUEST_FEATURES``,
``TARGET_FEATURES``) and nothing else changed. The cases now play the ``-v1`` ids; :func:`play` keeps an
observation's v0 entries under ``obs`` (compared with the v0 file bit for bit) and the new ones under
``new_obs`` (checked by the test against the config's sampling and the rounds' ``target_features``), so
the pinned file was not regenerated.

Regenerate (only when an id's version is bumped on purpose)::

    python tests/envs/replay_ids_fixture.py --out tests/envs/data/replay_ids_v0.json.gz --overwrite
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

import draftrl.envs  # noqa: F401  registers the ids

FIXTURE = Path(__file__).resolve().parent / "data" / "replay_ids_v0.json.gz"
SEEDS = (0, 1, 2)
EPISODES = 2


# ---------------------------------------------------------------------- inputs (no model runs)
def traces(width: int):
    """Recorded-looking trees over fixed continuations: each position drafts a path that follows the
    continuation for a random number of levels, then strays (width 2: a wrong sibling per level);
    every draft feature varies; prompt 1's budget is below its recording, prompt 2 ended at EOS."""
    from draftrl.prompts import Prompt
    from draftrl.replay.traces import Traces

    rng = np.random.default_rng(100 + width)
    lengths, budgets = (9, 12, 6), (9, 12, 6)
    prompts, cont, cu_pos, prompt_tokens, cu_prompt = [], [], [0], [], [0]
    for p, length in enumerate(lengths):
        prompts.append(Prompt(f"en-chat-{p:03d}", "en", "chat", "tune", "hi", budgets[p] - (3 if p == 1 else 0)))
        cont += rng.integers(10, 30, length).tolist()
        cu_pos.append(len(cont))
        prompt_tokens += rng.integers(1, 9, 3 + p).tolist()
        cu_prompt.append(len(prompt_tokens))
    tokens, parents, depths, scores, cu_nodes = [], [], [], [], [0]
    for p in range(len(lengths)):
        for i in range(cu_pos[p], cu_pos[p + 1]):
            follow, size = int(rng.integers(0, 5)), int(rng.integers(0, 5))
            parent = -1
            for level in range(1, size + 1):
                right = i + level - 1 < cu_pos[p + 1] and level <= follow
                here = len(tokens) - cu_nodes[-1]
                tokens.append(cont[i + level - 1] if right else 99)
                parents.append(parent), depths.append(level), scores.append(float(np.log(rng.uniform(0.2, 1)) * level))
                if width > 1:
                    tokens.append(98), parents.append(parent), depths.append(level)
                    scores.append(float(np.log(rng.uniform(0.01, 0.2)) * level))
                parent = here
                if not right:
                    break
            cu_nodes.append(len(tokens))
    n = len(cont)
    features = np.column_stack([rng.uniform(0, 1, n), rng.uniform(0, 3, n), rng.integers(0, 5, n),
                                rng.integers(0, 7, n)]).astype(np.float64)
    return Traces(
        prompts=prompts, budgets=list(budgets), stop_reasons=["length", "length", "eos"],
        prompt_tokens=np.array(prompt_tokens), cu_num_prompt_tokens=np.array(cu_prompt),
        continuation=np.array(cont), cu_num_positions=np.array(cu_pos), draft_features=features,
        cu_num_nodes=np.array(cu_nodes), node_tokens=np.array(tokens), node_parents=np.array(parents),
        node_depths=np.array(depths), node_scores=np.array(scores), max_depth=4, width=width,
        meta={"config": {}, "target": "smollm2-135m", "drafter": "ngram"},
    )


def cost_table():
    from draftrl.signals.costs import CostTable

    return CostTable(
        num_tokens=[1, 2, 4, 8, 16], context_lens=[4, 64],
        verify_seconds=[[0.02, 0.023, 0.03, 0.04, 0.06], [0.025, 0.028, 0.035, 0.05, 0.07]],
        draft_widths=[1, 2], draft_level_seconds=[1.1e-3, 1.6e-3], draft_base_seconds=3e-4,
        sample_base_seconds=1e-3, sample_token_seconds=2e-4,
    )


def recordings():
    """Requests whose continuations repeat pieces of their prompts (some n-gram matches), one ending early."""
    from draftrl.prompts import Prompt
    from draftrl.replay.recordings import Recording, Recordings

    rng = np.random.default_rng(7)
    recs = []
    for i in range(6):
        motif = rng.integers(0, 60, size=8).tolist()
        prompt = motif * 2 + rng.integers(0, 60, size=int(rng.integers(5, 20))).tolist()
        cont: list[int] = []
        while len(cont) < 30:
            cont += motif[: int(rng.integers(2, 8))] + rng.integers(60, 90, size=int(rng.integers(1, 4))).tolist()
        length = 30 if i % 3 else int(rng.integers(5, 20))
        recs.append(Recording(Prompt(f"p{i:02d}", "en", "qa", "tune", f"prompt {i}", 24), prompt, 24, cont[:length], 6))
    return Recordings(recs, {"config": {"target": "smollm2-135m", "chat_template": True}})


def step_cost():
    from draftrl.replay.serve_calibrate import StepCostModel

    return StepCostModel(base=0.03, per_seq=0.002, per_token=0.0005, residual_std=0.002, per_prefill_token=1e-5)


# ---------------------------------------------------------------------- cases
def size_policy(obs, tree) -> int:
    """A size policy that reads both its inputs: verify at most the tree's first half, by the level feature."""
    return min(len(tree), 1 + int(obs[-3]) // 2)


def cases() -> dict[str, tuple[str, dict[str, Any]]]:
    """name -> (id, make kwargs)."""
    w1, w2 = traces(1), traces(2)
    table = cost_table()
    round_env = dict(temperature=0.0, depths=(0, 1, 2, 4), max_new_tokens=None, max_new_tokens_cap=10)
    recs, cost = recordings(), step_cost()
    return {
        "trace_replay_chain_ratio_noise": ("draftrl/TraceReplay-v1", dict(
            traces=w1, cost_table=table, config=dict(round_env, width=1, cost_noise=0.05, cost_jitter=0.1))),
        "trace_replay_tree_throughput": ("draftrl/TraceReplay-v1", dict(
            traces=w2, cost_table=table, config=dict(round_env, width=2, verify_sizes=(0, 1, 3), reward="throughput",
                                                     cost_noise=0.05))),
        "trace_replay_no_drafter": ("draftrl/TraceReplay-v1", dict(
            traces=w1, cost_table=table, config=dict(round_env, width=1, drafter="none", depths=(0,), rho=20.0))),
        "trace_replay_depth_chain_shaping": ("draftrl/TraceReplayDepth-v1", dict(
            traces=w1, cost_table=table, config=dict(round_env, width=1, depth_shaping=True, cost_noise=0.05,
                                                     cost_jitter=0.1))),
        "trace_replay_depth_tree_size_policy": ("draftrl/TraceReplayDepth-v1", dict(
            traces=w2, cost_table=table, size_policy=size_policy, config=dict(round_env, width=2, cost_noise=0.05))),
        "trace_replay_depth_tree_fixed_size": ("draftrl/TraceReplayDepth-v1", dict(
            traces=w2, cost_table=table, verify_size=2, config=dict(round_env, width=2, reward="throughput"))),
        "serve_replay_loads_jitter": ("draftrl/ServeReplay-v1", dict(
            recordings=recs, calibration=cost, cost_jitter=0.1, max_new_tokens=16, num_requests=4, depths=(0, 1, 2, 4),
            budgets=(0, 2, 8, 64), loads=[{"concurrency": 2}, {"arrival": "poisson", "rate": 40.0}])),
        "serve_replay_heuristic_quiet": ("draftrl/ServeReplay-v1", dict(
            recordings=recs, calibration=cost, cost_noise=False, rule="heuristic", max_new_tokens=16, num_requests=4,
            depths=(0, 2, 4), budgets=(0, 4, 64), concurrency=3)),
    }


# ---------------------------------------------------------------------- playing them
def plain(value: Any) -> Any:
    """JSON-ready: numpy to lists and Python numbers; floats keep every bit (``repr`` round-trips)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return plain(value.tolist())
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if value is None or isinstance(value, str):
        return value
    if hasattr(value, "token") and hasattr(value, "agree_expected"):  # TokenStats
        return {k: plain(getattr(value, k)) for k in ("token", "p_token", "mass_before", "entropy", "drafted",
                                                      "agree", "agree_expected")}
    if hasattr(value, "request_id") and hasattr(value, "num_verified"):  # RequestStep
        return {k: plain(getattr(value, k)) for k in ("request_id", "token_ids", "num_verified", "num_accepted",
                                                      "finished")}
    if hasattr(value, "token_times"):  # RequestTimeline
        return {k: plain(getattr(value, k)) for k in ("request_id", "prompt_id", "arrival", "admitted",
                                                      "token_times", "token_ids", "finished")}
    raise TypeError(f"cannot pin a {type(value).__name__}")


def action(env, rng: np.random.Generator) -> Any:
    space = env.action_space
    if isinstance(space, gym.spaces.Discrete):
        return int(rng.random() < 0.7)  # CONTINUE more often than STOP: deep rounds too
    return rng.integers(space.nvec)


def play(env_id: str, kwargs: dict[str, Any]) -> list[dict[str, Any]]:
    """Every step of 3 seeds x 2 episodes: observation, reward, flags, info, lookahead before the step."""
    from draftrl.signals.features import REQUEST_FEATURES, TARGET_FEATURES

    env = gym.make(env_id, **kwargs).unwrapped
    names = getattr(env, "feature_names", ())
    new = [i for i, name in enumerate(names) if name in REQUEST_FEATURES + TARGET_FEATURES]
    old = [i for i in range(len(names)) if i not in new]

    def split(step: dict[str, Any]) -> dict[str, Any]:
        """The v0 entries of the observation under ``obs``, the issue-45 ones under ``new_obs``."""
        if new:
            obs = np.asarray(step["obs"])
            step = {**step, "obs": obs[old], "new_obs": obs[new]}
        return step

    runs = []
    for seed in SEEDS:
        rng = np.random.default_rng(1000 + seed)
        for episode in range(EPISODES):
            obs, info = env.reset(seed=seed if episode == 0 else None)
            steps = [{"obs": obs, "info": info}]
            done = False
            while not done:
                lookahead = getattr(env, "lookahead_action", None)
                ahead = lookahead() if callable(lookahead) and len(steps) < 4 else None
                obs, reward, terminated, truncated, info = env.step(action(env, rng))
                steps.append({"lookahead": ahead, "obs": obs, "reward": reward, "terminated": terminated,
                              "truncated": truncated, "info": info})
                done = terminated or truncated or len(steps) > 400
            runs.append(plain([split(step) for step in steps]))
    return runs


def record() -> dict[str, Any]:
    return {name: {"id": env_id, "runs": play(env_id, kwargs)} for name, (env_id, kwargs) in cases().items()}


def load(path: Path = FIXTURE) -> dict[str, Any]:
    return json.loads(gzip.decompress(path.read_bytes()))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=FIXTURE)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing fixture")
    args = parser.parse_args(argv)
    if args.out.exists() and not args.overwrite:
        sys.exit(f"{args.out} exists; pass --overwrite to replace the pinned episodes (and bump the ids' versions).")
    from draftrl.io import atomic_write_bytes

    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(record(), separators=(",", ":")) + "\n"
    atomic_write_bytes(args.out, gzip.compress(text.encode(), mtime=0))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
