"""``draftrl generate`` end to end on the real default model."""

from __future__ import annotations

import json

import pytest

from draftrl.cli import main

PROMPT = "Rewrite with type hints: def add(a, b): return a + b"


def run_json(capsys, *extra: str) -> dict:
    code = main(["generate", "--chat", "--prompt", PROMPT, "--max-new-tokens", "16", "--json", *extra])
    assert code == 0
    return json.loads(capsys.readouterr().out)


def test_json_output_has_the_documented_keys(smollm2, capsys):
    out = run_json(capsys, "--depth", "4")
    assert {"text", "token_ids", "tokens_per_second", "rounds", "mean_tokens_per_round",
            "mean_verified_per_round", "exactness"} <= set(out)
    assert len(out["token_ids"]) == 16 and out["rounds"] <= 16
    assert out["mean_tokens_per_round"] == pytest.approx(16 / out["rounds"])


def test_speculative_greedy_equals_plain_greedy(smollm2, capsys):
    plain = run_json(capsys, "--depth", "0")
    tree = run_json(capsys, "--depth", "3", "--width", "2", "--verify-size", "4")
    assert tree["token_ids"] == plain["token_ids"]
    assert plain["mean_tokens_per_round"] == 1.0


def test_bad_depth_is_one_clear_line(smollm2, capsys):
    assert main(["generate", "--prompt", "hi", "--depth", "99"]) == 2
    err = capsys.readouterr().err.strip()
    assert "depth=99" in err and "max_depth" in err and "\n" not in err


def test_bad_drafter_spec_is_one_clear_line(capsys):
    assert main(["generate", "--prompt", "hi", "--drafter", "layerskip:x"]) == 2
    assert "layerskip:N" in capsys.readouterr().err


def test_unknown_drafter_is_one_line_listing_the_known_kinds(capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a typo is not looked up on the hub
    assert main(["generate", "--prompt", "hi", "--drafter", "ngramm"]) == 2
    err = capsys.readouterr().err.strip()
    assert "'ngramm' is unknown" in err and "ngram[:MIN:MAX" in err and "layerskip:N" in err and "\n" not in err


@pytest.fixture(scope="module")
def multi_eos_model(tmp_path_factory):
    """A tiny random Llama whose config lists several EOS ids (as Llama 3.x configs do), SmolLM2's tokenizer."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from draftrl.models import fetch_model

    tokenizer = AutoTokenizer.from_pretrained(fetch_model("smollm2-135m"))
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                         eos_token_id=[tokenizer.eos_token_id, 7], bos_token_id=1, tie_word_embeddings=True)
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("multi_eos")
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture
def tmp_kernel_cache(multi_eos_model, tmp_path, monkeypatch):
    """``DRAFTRL_CACHE`` in ``tmp_path`` for the test (after the module's model fixture fetched SmolLM2's
    tokenizer from the real cache): the kernel plan probed for a temporary model is keyed by its temporary
    directory's name, so written to the user's ``~/.cache/draftrl/kernels`` it would stay there forever."""
    monkeypatch.setenv("DRAFTRL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _generate(capsys, model_dir, *extra: str) -> dict:
    code = main(["generate", "--target", str(model_dir), "--prompt", PROMPT, "--max-new-tokens", "12",
                 "--depth", "2", "--json", *extra])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


def test_generate_with_several_eos_ids_in_the_model_config(multi_eos_model, tmp_kernel_cache, capsys):
    """A list-valued ``eos_token_id`` (Llama 3.x) is read, and decoding stops at any of the ids."""
    import json as jsonlib

    from draftrl.models import load_model
    from draftrl.models.kernels import plan_key, plan_path

    loaded = load_model(str(multi_eos_model))
    # its kernel plan (probed, or skipped on a busy machine) is cached under tmp, not in the user's cache
    assert plan_path(plan_key(loaded.model, loaded.name)).is_relative_to(tmp_kernel_cache)
    assert loaded.eos_token_ids == sorted({loaded.tokenizer.eos_token_id, 7})
    first = _generate(capsys, multi_eos_model)
    assert len(first["token_ids"]) == 12  # the random model emits neither EOS in 12 greedy tokens
    stop = first["token_ids"][3]
    config_file = multi_eos_model / "config.json"
    config = jsonlib.loads(config_file.read_text())
    config["eos_token_id"] = [7, stop]  # the fourth greedy token becomes an end of sequence
    config_file.write_text(jsonlib.dumps(config))
    second = _generate(capsys, multi_eos_model)
    cut = first["token_ids"].index(stop) + 1
    assert second["token_ids"] == first["token_ids"][:cut]
def test_ignore_eos_runs_a_sampled_negative_control_to_length(smollm2, capsys):
    """Finding 10: at temperature 1 the 135M model ends within a few tokens and the monitor then
    read ``passed`` on almost nothing. --ignore-eos decodes to length; the verdict names the
    evidence it still lacks instead of passing."""
    common = ["generate", "--chat", "--prompt", "Say hi.", "--temperature", "1", "--depth", "2", "--json",
              "--sampler", "resample-from-p", "--seed", "3"]
    assert main([*common, "--max-new-tokens", "48"]) == 0
    short = json.loads(capsys.readouterr().out)
    assert short["exactness"]["verdict"] == "inconclusive"
    assert main([*common, "--max-new-tokens", "48", "--ignore-eos"]) == 0
    full = json.loads(capsys.readouterr().out)
    assert len(full["token_ids"]) == 48 and full["stop_reason"] == "length"
    assert full["exactness"]["verdict"] in ("inconclusive", "failed")  # 48 tokens < the 200 the first check needs
