"""The replayed ids keep their versions: today's envs replay ``data/replay_ids_v0.json.gz`` bit for bit.

``replay_ids_fixture.py`` pinned what ``TraceReplay-v0``, ``TraceReplayDepth-v0`` and
``ServeReplay-v1`` did for fixed seeds and actions before their round walk moved into the replay
engines (observations, rewards, flags, ``info``, ``lookahead_action()``). ``info`` may gain keys
(it is not part of an id's spaces or reward); every pinned key must stay equal, floats to the bit.

``TraceReplay-v1`` / ``TraceReplayDepth-v1`` (issue 45) replay v0's pinned episodes: rewards, flags,
``info``, lookahead and every v0 observation entry bit for bit; the entries v1 added are the greedy
request's sampling and the target signals the rounds reported (unknown: the traces are greedy).
"""

from __future__ import annotations

from typing import Any

import pytest
from replay_ids_fixture import cases, load, play

from draftrl.envs.ids import RETIRED
from draftrl.signals.features import request_values, target_values

PINNED = load()
CASES = cases()
#: ids whose observation grew since the fixture was pinned: pinned id -> (today's id, entries pinned)
GROWN = {"draftrl/ServeReplay-v0": ("draftrl/ServeReplay-v1", 20)}
#: the ids whose observation issue 45 extended (v0's pinned entries plus the new ones)
NEW_OBSERVATION = {new for old, (new, _) in RETIRED.items() if old not in GROWN}


def first_difference(want: Any, got: Any, path: str = "") -> str | None:
    """Where ``got`` departs from ``want`` (``info`` dicts may hold extra keys), or None."""
    if isinstance(want, dict):
        if not isinstance(got, dict):
            return f"{path}: {type(got).__name__} instead of a dict"
        extra_ok = path.endswith("info")
        if not extra_ok and set(got) != set(want):
            return f"{path}: keys {sorted(set(got) ^ set(want))} differ"
        for key in want:
            if key not in got:
                return f"{path}.{key}: missing"
            found = first_difference(want[key], got[key], f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return f"{path}: length {len(got) if isinstance(got, list) else type(got).__name__} != {len(want)}"
        for i, (w, g) in enumerate(zip(want, got)):
            found = first_difference(w, g, f"{path}[{i}]")
            if found:
                return found
        return None
    if type(want) is not type(got) or want != got:
        return f"{path}: {got!r} != pinned {want!r}"
    return None


def test_the_fixture_pins_every_case():
    assert set(PINNED) == set(CASES)


def new_entries(runs: list[list[dict[str, Any]]]) -> list[list[float]]:
    """Pop each step's ``new_obs`` (the v1 entries: request, then target features) out of ``runs``."""
    return [step.pop("new_obs") for run in runs for step in run if "new_obs" in step]


def expected_new_entries(runs: list[list[dict[str, Any]]]) -> list[list[float]]:
    """What the v1 entries must be: the greedy request, then the last verified round's target signals
    (unknown before the episode's first round)."""
    want = []
    for run in runs:
        target = {}
        for step in run:
            info = step["info"]
            if "num_emitted" in info:  # a verified round (a depth env's draft steps keep the last one's)
                target = info.get("target_features", {})
            want.append(request_values(None) + target_values(target))
    return want




def pinned_part(runs: list, entries: int) -> list:
    """``runs`` with each observation cut to its first ``entries`` (what v0 pinned); the entries v1 added
    (``greedy_share``, ``temperature_mean``, ``temperature_max``) must read a greedy batch."""
    out = []
    for run in runs:
        steps = []
        for step in run:
            obs = step["obs"]
            share, mean, top = obs[entries:]
            assert share in (0.0, 1.0) and mean == top == 0.0, obs[entries:]
            steps.append({**step, "obs": obs[:entries]})
        out.append(steps)
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_replayed_id_reproduces_its_pinned_episodes(name):
    env_id, kwargs = CASES[name]
    pinned_id, entries = PINNED[name]["id"], None
    if pinned_id in GROWN:
        pinned_id, entries = GROWN[pinned_id]
    assert pinned_id == env_id or RETIRED[pinned_id][0] == env_id  # v0's file pins the v1 ids' shared entries
    runs = play(env_id, kwargs)
    if entries is not None:
        runs = pinned_part(runs, entries)
    added = new_entries(runs)
    if env_id in NEW_OBSERVATION:
        assert added == expected_new_entries(runs)
        assert len(added) == sum(len(run) for run in runs)
    else:
        assert added == []
    difference = first_difference(PINNED[name]["runs"], runs, name)
    assert difference is None, f"{env_id} no longer replays its pinned episodes (bump its version): {difference}"


def test_a_changed_episode_is_reported():
    """Negative controls: another cost noise, and an info value off by one ulp, are caught."""
    env_id, kwargs = CASES["trace_replay_chain_ratio_noise"]
    noisier = {**kwargs, "config": {**kwargs["config"], "cost_noise": 0.06}}
    runs = play(env_id, noisier)
    new_entries(runs)
    assert "obs" in first_difference(PINNED["trace_replay_chain_ratio_noise"]["runs"], runs)
    runs = PINNED["trace_replay_depth_chain_shaping"]["runs"]
    i = next(i for i, step in enumerate(runs[0]) if "seconds" in step["info"])  # a verifying step
    step = runs[0][i]
    nudged = {**step, "info": {**step["info"], "seconds": step["info"]["seconds"] * (1 + 2 ** -52)}}
    assert nudged["info"]["seconds"] != step["info"]["seconds"]
    assert "info.seconds" in first_difference(runs, [[*runs[0][:i], nudged, *runs[0][i + 1:]], *runs[1:]])
    assert first_difference(step, {**step, "info": {**step["info"], "new_key": 1}}) is None  # info may grow
