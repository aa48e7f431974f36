"""``draftrl collect --engine vllm --ray`` (issue 47, item 2): two Ray workers on a local cluster bound
to 127.0.0.1, each with its own vLLM engine (SmolLM2-135M, float32, CPU, no speculation), record a
workload's requests dealt out between them; the merged ``recordings.json`` holds every request exactly
once, in workload order, with the one-process recording's tokens: greedy and sampled continuations
alike (each sampled one seeded from its prompt, class and number; vLLM's CPU sampler draws a seeded
request's Gumbel noise from its own generator, so the batch it shares does not move it: a request
recorded alone gets the same tokens too).

Four requests of 10 tokens (+ the lookahead), T0 and T0.7 with two continuations each. ``slow`` and
``vllm`` (a cluster start and three vLLM engine loads: about 1.5 minutes here): ``pytest -m slow
tests/replay/test_ray_record.py``. The merge's negative controls run without either.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from serve_recordings import synthetic_recordings

from draftrl.cli import main
from draftrl.replay.recordings import Recordings, merge_recordings, record_workload

SETS = ["--set", "env.split=heldout", "--set", "env.languages=[en,it]", "--set", "env.tasks=[code_edit,summarize]",
        "--set", "env.limit_per_group=1", "--set", "env.max_new_tokens=10",
        "--set", "env.temperature_mix={0: 1, 0.7: 1}", "--continuations", "2", "--threads", "1"]


def argv(out: Path, *extra: str) -> list[str]:
    return ["collect", "--engine", "vllm", *SETS, "--out", str(out), *extra]


@pytest.fixture(scope="module")
def cluster():
    """One local cluster for the module (the command joins it and leaves it running); Ray's presence is
    checked without importing it (draftrl's local cluster sets what Ray reads at import)."""
    from draftrl.decoding.vllm.engine import INSTALL_CPU, vllm_available

    if importlib.util.find_spec("ray") is None:
        pytest.skip('Ray is not installed; run pip install "draftrl[ray]"')
    if not vllm_available():
        pytest.skip(f"vllm is not installed ({INSTALL_CPU})")
    from draftrl.cluster import LOCAL, start

    ray = start(LOCAL, 2)
    yield ray
    ray.shutdown()


def tokens(recs: Recordings) -> list[tuple]:
    return [(r.prompt.id, r.prompt_ids, r.max_new_tokens, r.temperature, r.sample, r.seed, r.token_ids)
            for r in recs.requests]


@pytest.mark.slow
@pytest.mark.vllm
def test_two_workers_record_what_one_process_records(cluster, tmp_path, capsys):
    assert main(argv(tmp_path / "one")) == 0
    assert main(argv(tmp_path / "two", "--ray", "--ray-workers", "2")) == 0
    err = capsys.readouterr().err
    pids = {line.rsplit("worker ", 1)[1].rstrip(")") for line in err.splitlines() if "(worker " in line}
    assert len(pids) == 2, err  # both workers recorded a shard
    one, two = Recordings.load(tmp_path / "one"), Recordings.load(tmp_path / "two")
    assert len(one.prompts) == 4 and len(one) == 4 * 3  # T0 once, T0.7 twice per request
    greedy = [t for t in tokens(one) if t[3] == 0]
    assert [t for t in tokens(two) if t[3] == 0] == greedy and all(len(t[-1]) > 10 for t in greedy)
    assert tokens(two) == tokens(one)  # the sampled continuations too: seeded per request, batch-invariant on CPU
    assert len({tuple(t[-1]) for t in tokens(one) if t[3] > 0}) == 8  # and they are sampled: all differ
    timing = ("record_seconds", "record_steps", "ray_workers", "device_kinds")
    assert {k: v for k, v in two.meta.items() if k not in timing} | {"engine": None} \
        == {k: v for k, v in one.meta.items() if k not in timing} | {"engine": None}
    assert {k: v for k, v in two.meta["engine"].items() if k != "load_seconds"} \
        == {k: v for k, v in one.meta["engine"].items() if k != "load_seconds"}
    assert two.meta["ray_workers"] == 2 and len(two.meta["device_kinds"]) == 1

    # what holds it: a request recorded alone (a batch of 3, not 12) gets the same tokens, sampled ones too
    from draftrl.cli import build_parser
    from draftrl.cli.collect import serving_config

    alone = record_workload(serving_config(build_parser().parse_args(argv(tmp_path / "unused"))), continuations=2,
                            indices=[2])
    assert tokens(alone) == tokens(one)[6:9]


def shard(recs: Recordings, indices: list[int]) -> tuple[list[int], Recordings]:
    meta = {"config": {"target": "t"}, "sampling": [], "record_seconds": 1.0, "record_steps": 3}
    return indices, Recordings([recs.requests[i] for i in indices], meta)


def test_the_merge_keeps_workload_order_and_refuses_a_request_missing_or_twice():
    recs = synthetic_recordings(5)
    merged = merge_recordings([shard(recs, [1, 3]), shard(recs, [0, 2, 4])], 5)
    assert [r.prompt.id for r in merged.requests] == [r.prompt.id for r in recs.requests]
    assert merged.meta["record_steps"] == 6
    with pytest.raises(RuntimeError, match=r"exactly once \(missing: 4\)"):
        merge_recordings([shard(recs, [1, 3]), shard(recs, [0, 2])], 5)
    with pytest.raises(RuntimeError, match=r"exactly once \(recorded twice: 3\)"):
        merge_recordings([shard(recs, [1, 3]), shard(recs, [0, 2, 3, 4])], 5)
    with pytest.raises(RuntimeError, match="not a whole number per request"):
        merge_recordings([(shard(recs, [0, 1, 2])[0], shard(recs, [0, 1])[1])], 3)


@pytest.mark.slow
@pytest.mark.vllm
def test_a_lost_worker_stops_the_command_saving_nothing(cluster, tmp_path):
    """Workers whose engines cannot load (a missing target): Ray reports them dead, the command stops in one line."""
    from draftrl.config.serve import ServeConfig
    from draftrl.replay.ray_record import record_on_ray

    config = ServeConfig(split="heldout", languages=("en",), tasks=("code_edit", "summarize"), limit_per_group=1,
                         max_new_tokens=4, target=str(tmp_path / "no-such-model"))
    with pytest.raises(RuntimeError, match=r"^a Ray worker was lost \(ActorDiedError.*nothing was saved") as err:
        record_on_ray(config, continuations=1, workers=2)
    assert "\n" not in str(err.value)
