"""Kernels chosen by measurement: the probe's choices keep the logits, forced layouts are honoured,
and the cached probe is keyed by machine / model / dtype / threads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from draftrl.models import kernels as kmod
from draftrl.models.fast_linear import MAX_ROWS, fast_rows, has_fast_linear
from draftrl.models.kernels import PROBE_ROWS, apply_kernels, choose_fast_rows, kernel_plan, plan_key, plan_path
from draftrl.models.kv import cache_argument

#: Max |layout - stock| over SmolLM2 logits (|logit| <= ~30); float32 summation-order noise is ~1e-5.
LOGIT_ATOL = 5e-4


def tiny_model(hidden: int = 32) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=97, max_position_embeddings=512)
    return LlamaForCausalLM(config).eval().requires_grad_(False)


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DRAFTRL_CACHE", str(tmp_path))
    monkeypatch.delenv(kmod.KERNELS_ENV, raising=False)
    return tmp_path


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe's decisions below must not depend on how busy the test machine is."""
    monkeypatch.setattr(kmod, "_load_average", lambda: 0.5)


@pytest.fixture
def counted_probe(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Replace the timed probe by one that says fast_linear wins at 2 and 3 rows; counts calls."""
    calls: list[int] = []

    def fake(model, rows=PROBE_ROWS, **_):
        calls.append(1)
        return {"stock": {k: 1.0 for k in rows}, "fast_linear": {k: (0.5 if k in (2, 3) else 1.2) for k in rows}}

    monkeypatch.setattr(kmod, "probe", fake)
    return calls


def test_any_choice_of_the_probe_keeps_the_logits(smollm2) -> None:
    """Every layout the probe can pick (fast_linear on any subset of PROBE_ROWS) against stock,
    with a KV cache, at every probed row count: same logits to float rounding, same argmax."""
    model, plan = smollm2.model, kernel_plan(smollm2.model)
    ids = smollm2.tokenizer("The quick brown fox jumps over the lazy dog. " * 12, return_tensors="pt")["input_ids"]
    prefix = ids[:, :40]
    cache, cache_kw = DynamicCache(), cache_argument(model)
    try:
        with torch.inference_mode():
            model(input_ids=prefix, **{cache_kw: cache}, use_cache=True)
            for k in PROBE_ROWS:
                logits = {}
                for layout in ("stock", "fast_linear@all"):
                    kmod.remove_fast_linear(model)
                    if layout != "stock":
                        kmod.apply_fast_linear(model, PROBE_ROWS)
                    logits[layout] = model(input_ids=ids[:, 40:40 + k], **{cache_kw: cache}, use_cache=True).logits
                    cache.crop(-k)
                diff = (logits["stock"] - logits["fast_linear@all"]).abs().max().item()
                assert diff < LOGIT_ATOL, f"k={k}: max |fast_linear - stock| = {diff:.2e}"
                assert torch.equal(logits["stock"].argmax(-1), logits["fast_linear@all"].argmax(-1))
    finally:
        kmod.remove_fast_linear(model)
        kmod.apply_fast_linear(model, plan.fast_rows if plan else ())


def test_load_records_the_plan(smollm2) -> None:
    plan = smollm2.kernels
    assert plan is kernel_plan(smollm2.model) and plan.source in ("probe", "cache", "busy") and plan.kernels == "auto"
    assert fast_rows(smollm2.model) == frozenset(plan.fast_rows)
    assert set(plan.fast_rows) <= set(PROBE_ROWS)


@pytest.mark.parametrize("forced, rows", [("stock", ()), ("fast_linear", tuple(range(1, MAX_ROWS + 1)))])
def test_forced_layout_is_honoured(cache_dir: Path, counted_probe: list[int], forced: str, rows) -> None:
    model = tiny_model()
    plan = apply_kernels(model, "tiny", forced)
    assert plan.source == "forced" and plan.fast_rows == rows and not counted_probe
    assert fast_rows(model) == frozenset(rows) and has_fast_linear(model) == bool(rows)
    assert not (cache_dir / "kernels").exists()  # nothing measured, nothing cached


def test_environment_variable_and_argument_precedence(cache_dir, counted_probe, monkeypatch) -> None:
    model = tiny_model()
    monkeypatch.setenv(kmod.KERNELS_ENV, "stock")
    assert apply_kernels(model, "tiny").fast_rows == ()
    assert apply_kernels(model, "tiny", "fast_linear").source == "forced"  # the argument wins
    monkeypatch.setenv(kmod.KERNELS_ENV, "fastest")
    with pytest.raises(ValueError, match=r"DRAFTRL_KERNELS='fastest'.*auto, stock, fast_linear"):
        apply_kernels(model, "tiny")
    with pytest.raises(ValueError, match=r"kernels='gemv'"):
        apply_kernels(model, "tiny", "gemv")
    assert not counted_probe


def test_auto_probes_once_then_reuses_the_cache(cache_dir: Path, counted_probe: list[int]) -> None:
    model = tiny_model()
    first = apply_kernels(model, "tiny", "auto")
    assert first.source == "probe" and first.fast_rows == (2, 3) and len(counted_probe) == 1
    assert Path(first.path).is_file() and Path(first.path).parent == cache_dir / "kernels"
    again = apply_kernels(tiny_model(), "tiny", "auto")
    assert again.source == "cache" and again.fast_rows == (2, 3) and len(counted_probe) == 1
    assert not apply_kernels(model, "tiny", "auto", use_cache=False).path and len(counted_probe) == 2


def test_cache_key_separates_machine_model_dtype_threads(cache_dir, counted_probe, monkeypatch) -> None:
    model = tiny_model()
    threads = torch.get_num_threads()
    base = plan_key(model, "tiny")
    assert base["threads"] == threads and base["dtype"] == "float32" and base["model"] == "tiny"
    paths = {plan_path(base)}
    paths.add(plan_path(plan_key(model, "other-name")))
    paths.add(plan_path(plan_key(tiny_model(hidden=64), "tiny")))  # same name, other shape
    paths.add(plan_path(plan_key(model, "tiny", threads=threads + 1)))
    paths.add(plan_path(plan_key(tiny_model().to(torch.bfloat16), "tiny")))
    monkeypatch.setattr(kmod, "_cpu_name", lambda: "Some Other CPU")
    paths.add(plan_path(plan_key(model, "tiny")))
    assert len(paths) == 6


def test_a_plan_for_another_key_is_not_reused(cache_dir, counted_probe) -> None:
    model = tiny_model()
    path = Path(apply_kernels(model, "tiny").path)
    data = json.loads(path.read_text())
    data["key"]["threads"] += 1  # as if copied from a run with another thread count
    path.write_text(json.dumps(data))
    assert apply_kernels(model, "tiny").source == "probe" and len(counted_probe) == 2
    path.write_text("{not json")
    assert apply_kernels(model, "tiny").source == "probe" and len(counted_probe) == 3


def test_a_new_probe_removes_only_the_plans_it_supersedes(cache_dir, counted_probe) -> None:
    """A plan from an older probe version of the same key is deleted when the new one is written;
    plans for another key (another torch build here) stay."""
    model = tiny_model()
    key = plan_key(model, "tiny")
    folder = cache_dir / "kernels"
    folder.mkdir(parents=True)
    old = folder / "tiny-float32-old.json"
    old.write_text(json.dumps({"key": dict(key, probe_version=key["probe_version"] - 1, load_average=0.3)}))
    other = folder / "tiny-float32-other-torch.json"
    other.write_text(json.dumps({"key": dict(key, probe_version=key["probe_version"] - 1, torch="0.0")}))
    (folder / "notes.json").write_text("[1, 2]")
    plan = apply_kernels(model, "tiny", "auto")
    assert plan.source == "probe" and Path(plan.path).is_file()
    assert not old.exists() and other.exists() and (folder / "notes.json").exists()


def test_a_busy_machine_is_not_measured_on_the_wall_clock(cache_dir, counted_probe, monkeypatch) -> None:
    monkeypatch.setattr(kmod, "_load_average", lambda: 99.0)
    monkeypatch.setattr(kmod.torch, "get_num_threads", lambda: 2)  # the plan's key reads the thread count
    plan = apply_kernels(tiny_model(), "tiny")
    assert plan.source == "busy" and plan.fast_rows == () and not counted_probe
    assert not (cache_dir / "kernels").exists()  # the next load measures again
    monkeypatch.setattr(kmod.torch, "get_num_threads", lambda: 1)  # one thread: the probe reads CPU time
    assert apply_kernels(tiny_model(), "tiny").source == "probe" and len(counted_probe) == 1


def test_choose_needs_a_margin() -> None:
    seconds = {"stock": {1: 1.0, 2: 1.0, 3: 1.0}, "fast_linear": {1: 0.99, 2: 0.9, 3: 1.5}}
    assert choose_fast_rows(seconds) == (2,)  # 1% faster is a tie: stock kept
    assert choose_fast_rows(seconds, margin=0.0) == (1, 2)


def test_real_probe_times_every_cell_and_leaves_stock() -> None:
    model = tiny_model()
    seconds = kmod.probe(model, (1, 2, 3), context=16, repeats=1)
    assert set(seconds) == {"stock", "fast_linear"}
    assert all(set(per) == {1, 2, 3} and all(v > 0 for v in per.values()) for per in seconds.values())
    assert not has_fast_linear(model)


def test_env_config_key_is_checked() -> None:
    from draftrl.config.env import EnvConfig

    assert EnvConfig(kernels="stock").kernels == "stock" and EnvConfig().kernels is None
    with pytest.raises(ValueError, match=r"env.kernels='fastest'.*auto, stock, fast_linear"):
        EnvConfig(kernels="fastest")


def test_probe_clock_counts_this_threads_cpu_time_on_one_thread() -> None:
    """On one torch thread the probe reads the thread's CPU time, which time spent off the CPU
    (another process's time slice, here a sleep) does not advance; with a pool, wall time."""
    import time

    clock = kmod.probe_clock(torch.device("cpu"), threads=1)
    t0 = clock()
    time.sleep(0.2)
    assert clock() - t0 < 0.05
    assert kmod.probe_clock(torch.device("cpu"), threads=2) is time.perf_counter
    assert kmod.probe_clock(torch.device("meta"), threads=1) is time.perf_counter
