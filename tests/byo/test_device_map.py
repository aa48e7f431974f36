"""A target larger than one GPU (issue 47, item 1), on CPU stand-ins: ``env.device_map`` (an explicit
per-layer map through transformers' ``from_pretrained(device_map=...)`` and accelerate's dispatch),
``env.draft_device``, and accelerate's hooks inside every forward, each decoding in float32 with
greedy output identical to plain decoding; and the one-line refusals (devices this machine lacks,
a model over devices of different kinds, disk offload, ``compile`` with a map, a ``draft_device``
for a drafter without weights).

Every device here is ``cpu`` (no GPU on this machine): the maps exercise the loading and the
dispatch, not a transfer between GPUs; ``benchmarks/gpu_check.sh`` is where two GPUs would.
"""

from __future__ import annotations

import json

import pytest
import torch

from draftrl.cli import main
from draftrl.config.env import EnvConfig
from draftrl.decoding.build import build_engine, check_draft_device
from draftrl.decoding.generate import fixed_schedule, generate
from draftrl.decoding.workload import encode
from draftrl.models import load_model
from draftrl.models.placement import check_device_map, check_kinds, check_main_device, model_devices

PROMPT = "Write a Python function that reverses a list."
TOKENS = 24


def layer_map(target) -> dict[str, str]:
    """Every module of the stand-in (8 layers) to ``cpu``, one entry per layer."""
    layers = json.loads((target / "config.json").read_text())["num_hidden_layers"]
    return {"model.embed_tokens": "cpu", **{f"model.layers.{i}": "cpu" for i in range(layers)},
            "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}


def generated(capsys, target, drafter: str, *sets: str, depth: int = 3) -> list[int]:
    argv = ["generate", "--target", str(target), "--drafter", drafter, "--prompt", PROMPT, "--chat",
            "--max-new-tokens", str(TOKENS), "--ignore-eos", "--json", "--depth", str(depth)]
    for item in sets:
        argv += ["--set", item]
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out.strip().splitlines()[-1])["token_ids"]


@pytest.fixture(scope="module")
def plain(my_target):
    """Plain greedy decoding of the target, float32 (the reference)."""
    engine, tokenizer = build_engine(EnvConfig(target=str(my_target), drafter="none", monitor=False),
                                     max_new_tokens=TOKENS)
    engine.eos_token_ids = set()
    ids = encode(tokenizer, PROMPT, True)
    return generate(engine, list(ids), fixed_schedule(0)).token_ids


def test_explicit_per_layer_map_loads(my_target):
    """transformers places each module's weights by the map; it dispatches (accelerate's hooks) only a
    map over two or more devices, which the next-but-one test forces on one."""
    loaded = load_model(str(my_target), device_map=layer_map(my_target), kernels="stock")
    assert model_devices(loaded.model) == ["cpu"] and not loaded.model.training


@pytest.mark.parametrize("drafter", ["my_draft", "my_eagle_head_safetensors"])
def test_split_target_and_draft_device_keep_greedy_output(request, capsys, my_target, plain, drafter):
    folder = request.getfixturevalue(drafter)
    spec = str(folder) if drafter == "my_draft" else f"eagle3:{folder}"
    control = generated(capsys, my_target, "none", depth=0)
    assert control == plain and len(plain) == TOKENS  # the CLI's plain decoding is the reference's
    mapping = f"env.device_map={json.dumps(layer_map(my_target))}"
    assert generated(capsys, my_target, spec, mapping) == plain
    assert generated(capsys, my_target, spec, mapping, "env.draft_device=cpu") == plain
    assert generated(capsys, my_target, spec, "env.draft_device=cpu") == plain


def test_accelerate_hooks_in_every_forward_keep_greedy_output(my_target, my_draft, plain):
    """The map above puts every module on one device, so accelerate attaches no hooks; forcing them
    runs its per-module device alignment (what a split over GPUs runs) inside each forward."""
    from accelerate import dispatch_model
    from accelerate.hooks import AlignDevicesHook

    loaded = load_model(str(my_target), kernels="stock")
    dispatch_model(loaded.model, device_map=layer_map(my_target), main_device="cpu", force_hooks=True)
    assert any(isinstance(getattr(m, "_hf_hook", None), AlignDevicesHook) for m in loaded.model.modules())
    assert loaded.model.hf_device_map == layer_map(my_target) and model_devices(loaded.model) == ["cpu"]
    env = EnvConfig(target=str(my_target), drafter=str(my_draft), monitor=False)
    engine, tokenizer = build_engine(env, loaded, max_new_tokens=TOKENS)
    engine.eos_token_ids = set()
    ids = encode(tokenizer, PROMPT, True)
    result = generate(engine, list(ids), fixed_schedule(3))
    assert result.token_ids == plain and sum(r.num_accepted for r in result.rounds) > 0


# ----------------------------------------------------------------------------- refusals, one line each
def test_refusals_name_the_value_and_the_fix(monkeypatch):
    with pytest.raises(ValueError, match="sees 0 CUDA GPU"):
        check_device_map({"model": "cuda:3"})
    with pytest.raises(ValueError, match="sees 0 CUDA GPU"):
        check_device_map("auto", {0: "70GiB"})
    with pytest.raises(ValueError, match="not a torch device"):
        check_device_map({"model": "gpu7"})
    with pytest.raises(ValueError, match="disk"):
        check_device_map({"model": "cpu", "lm_head": "disk"})
    with pytest.raises(ValueError, match="not a preset"):
        check_device_map("everywhere")
    with pytest.raises(ValueError, match="max_memory is read with env.device_map only"):
        check_device_map(None, {0: "70GiB"})
    check_device_map(None)
    check_device_map("auto")  # control: all of this machine (its CPU here)
    check_device_map({"model": "cpu", "lm_head": "cpu"})
    # a GPU machine's map over GPUs and the CPU: refused for timing unless asked for
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ValueError, match="on cpu and cuda.*mixed_devices=true"):
        check_device_map({"model.layers.0": 0, "model.layers.1": 1, "lm_head": "cpu"})
    with pytest.raises(ValueError, match="on cpu and cuda"):
        check_device_map("auto", {0: "70GiB", "cpu": "200GiB"})
    check_device_map({"model.layers.0": 0, "model.layers.1": "cuda:1"})  # control: two GPUs, one kind
    check_device_map({"model.layers.0": 0, "lm_head": "cpu"}, mixed_devices=True)
    check_kinds(["cuda:0", "cuda:1"], mixed_devices=False)
    with pytest.raises(ValueError, match="env.device='cpu' holds no part of the target.*set env.device to the first"):
        check_main_device("cpu", [0, "cuda:1"])
    check_main_device("cuda", [0, 1])  # control: cuda is cuda:0


def test_config_refusals(my_target):
    with pytest.raises(ValueError, match="compile.*device_map"):
        EnvConfig(device_map="auto", compile="default")
    with pytest.raises(ValueError, match="drafter 'ngram' has none of its own"):
        check_draft_device(EnvConfig(drafter="ngram", draft_device="cpu"))
    with pytest.raises(ValueError, match="draft_device='cuda:1' but this machine sees 0"):
        check_draft_device(EnvConfig(drafter="eagle3", draft_device="cuda:1"))
    check_draft_device(EnvConfig(drafter="eagle3", draft_device="cpu"))  # control


def test_generate_refuses_in_one_line_before_loading(capsys, my_target):
    code = main(["generate", "--target", str(my_target), "--drafter", "none", "--prompt", "x", "--set",
                 'env.device_map={"model": "cuda:0", "lm_head": "cpu"}'])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "CUDA GPU" in lines[0], lines


def test_calibration_times_the_split_engine(my_target, my_draft):
    """The cost calibration loads the target and the drafter as decoding does (its map, its draft
    device) and times them with the engine's clock: a table comes back, nothing else changes."""
    from draftrl.config.commands import CalibrationConfig
    from draftrl.replay.calibrate import calibrate

    env = EnvConfig(target=str(my_target), drafter=str(my_draft), device_map=layer_map(my_target), draft_device="cpu")
    table = calibrate(CalibrationConfig(num_tokens=(1, 4), contexts=(32,), widths=(1,), levels=2, repeats=1), env)
    assert table.verify_seconds.shape == (1, 2) and (table.verify_seconds > 0).all()
    assert table.meta["device"] == "cpu"
