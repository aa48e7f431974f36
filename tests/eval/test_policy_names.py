"""The one policy grammar of ``draftrl eval --policies`` on both engines (``draftrl.eval.policy_names``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftrl.cli import main
from draftrl.eval.policy_names import (DEFAULT_DSD, ENGINE_KINDS, FORMS, REFERENCE, accepted_names, parse_policies,
                                       split_policies)

#: Names that mean the same on both engines.
SHARED = "none,fixed:4,fixed:4:8,heuristic,ppo:runs/a"


def test_a_dsd_table_keeps_its_commas():
    """README's serving command: the CLI once split on every comma and saw '2-4:3' as a policy."""
    items = split_policies("none,fixed:4,heuristic,dsd:1-1:4,2-4:3,5-8:3,9-16:3,ppo:runs/x")
    assert items == ["none", "fixed:4", "heuristic", "dsd:1-1:4,2-4:3,5-8:3,9-16:3", "ppo:runs/x"]
    dsd = parse_policies(",".join(items), engine="vllm")[3]
    assert (dsd.kind, dsd.dsd) == ("dsd", ((1, 1, 4), (2, 4, 3), (5, 8, 3), (9, 16, 3)))
    assert parse_policies("dsd", engine="vllm")[1].dsd == DEFAULT_DSD


def test_the_cli_parses_the_documented_serving_command(monkeypatch, tmp_path):
    """``--policies`` goes through the same splitter: the dsd table reaches the parser whole."""
    seen = {}

    def fake_run(out, *, policies, **kwargs):
        seen["policies"] = [s.label for s in parse_policies(policies, engine="vllm")]
        (tmp_path / "out" / "report.md").parent.mkdir(exist_ok=True)
        (tmp_path / "out" / "report.md").write_text("report\n")
        return {}

    monkeypatch.setattr("draftrl.eval.serving.run_serving_eval", fake_run)
    code = main(["eval", "--engine", "vllm", "--policies", "none,fixed:4,heuristic,dsd:1-1:4,2-4:3,5-8:3,9-16:3",
                 "--out", str(tmp_path / "out"), "--quiet"])
    assert code == 0
    assert seen["policies"] == ["none", "fixed:4", "heuristic", "dsd:1-1:4,2-4:3,5-8:3,9-16:3"]


def test_the_cli_hands_head_to_eagle3_and_refuses_eagle3_without_one(monkeypatch, tmp_path, capsys):
    """``--head DIR`` sets ``env.head``; without it ``eagle3:K`` drafts with the shipped head, and
    fails in one line before --out exists for a target no head ships for."""
    from draftrl.drafters.eagle3 import CONFIG_FILE, WEIGHTS_FILE

    seen = {}

    def fake_run(out, *, config, **kwargs):
        seen["head"] = config.head
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "report.md").write_text("report\n")
        return {}

    monkeypatch.setattr("draftrl.eval.serving.run_serving_eval", fake_run)
    head = tmp_path / "head"
    head.mkdir()
    (head / CONFIG_FILE).write_text(json.dumps({"speculators_model_type": "eagle3", "transformer_layer_config": {"num_hidden_layers": 1},
                                                "draft_vocab_size": 8, "eagle_aux_hidden_state_layer_ids": [2, 15, 27],
                                                "speculators_config": {"verifier": {}}}))
    (head / WEIGHTS_FILE).write_bytes(b"")
    command = ["eval", "--engine", "vllm", "--policies", "none,eagle3:4", "--quiet"]
    assert main([*command, "--head", str(head), "--out", str(tmp_path / "a")]) == 0
    assert seen["head"] == str(head)
    assert main([*command, "--out", str(tmp_path / "shipped")]) == 0 and seen["head"] is None  # resolved per engine
    monkeypatch.setattr("draftrl.drafters.packaged.HEADS_DIR", tmp_path / "no-heads")
    capsys.readouterr()
    assert main([*command, "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "eagle3:4" in err and "--head DIR" in err
    assert not (tmp_path / "b").exists()
    assert main(["eval", "--head", str(head), "--out", str(tmp_path / "c"), "--quiet"]) == 2
    assert "--engine vllm only" in capsys.readouterr().err


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_both_engines_accept_the_same_shared_names(engine):
    specs = parse_policies(SHARED, engine=engine)
    assert [s.label for s in specs] == ["none", "fixed:4", "fixed:4:8", "heuristic", "ppo"]
    assert [(s.depth, s.verify_size) for s in specs[1:3]] == [(4, None), (4, 8)]
    assert specs[-1].path == "runs/a"
    assert [s.text for s in specs] == SHARED.split(",")


def test_the_engines_share_their_common_kinds_and_one_grammar():
    assert {"none", "fixed", "heuristic", "ppo"} <= set(ENGINE_KINDS["hf"]) & set(ENGINE_KINDS["vllm"])
    assert set(ENGINE_KINDS["hf"]) | set(ENGINE_KINDS["vllm"]) == set(FORMS)


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_ar_is_an_alias_of_none_and_the_reference_comes_first(engine):
    specs = parse_policies(["heuristic", "ar"], engine=engine)
    assert [s.label for s in specs] == [REFERENCE, "heuristic"]
    assert specs[0].text == REFERENCE
    assert parse_policies("heuristic", engine=engine)[0].label == REFERENCE  # added when missing


def test_hf_labels_and_ppo_directories():
    specs = parse_policies("heuristic, best-grid,fixed:4:0:2,ppo:runs/a,lookahead")
    assert [s.label for s in specs] == ["none", "heuristic", "best-grid", "fixed:4:0:2", "ppo", "lookahead"]
    assert specs[3].width == 2
    labels = [s.label for s in parse_policies("ppo:runs/size,ppo:runs/depth/policy.zip")]
    assert labels == ["none", "ppo[size]", "ppo[depth]"]


@pytest.mark.parametrize("engine, name", [("hf", "ngram:4"), ("hf", "dsd:1-1:4,2-16:1"), ("hf", "class:m.C:4"),
                                          ("vllm", "threshold"), ("vllm", "bandit"), ("vllm", "lookahead"),
                                          ("vllm", "best-grid"), ("vllm", "fixed:4:8:2")])
def test_a_name_the_engine_cannot_run_is_refused_naming_what_it_accepts(engine, name):
    with pytest.raises(ValueError) as err:
        parse_policies(name, engine=engine)
    message = str(err.value)
    assert "\n" not in message and name.split(",")[0] in message
    assert f"--engine {engine} accepts {accepted_names(engine)}" in message


@pytest.mark.parametrize("engine", ["hf", "vllm"])
@pytest.mark.parametrize("bad", ["foo", "ppo", "fixed:x", "heuristic:3", "none,ar", "fixed:4,fixed:4"])
def test_bad_policy_name_is_one_line_naming_the_valid_ones(engine, bad):
    with pytest.raises(ValueError) as err:
        parse_policies(bad, engine=engine)
    message = str(err.value)
    assert "\n" not in message
    if "," not in bad:
        assert bad in message and accepted_names(engine) in message


def test_vllm_own_methods_take_k_and_the_refusal_names_the_head_flag():
    specs = parse_policies("ngram:3,eagle3:5", engine="vllm")
    assert [(s.kind, s.label, s.depth) for s in specs[1:]] == [("ngram", "ngram:3", 3), ("eagle3", "eagle3:5", 5)]
    with pytest.raises(ValueError, match="eagle3:K with 1 <= K <= 16") as err:
        parse_policies("eagle3:0", engine="vllm")
    assert "eagle3:K|S-E:K,... (with --head DIR)" in str(err.value)
    with pytest.raises(ValueError, match="runs on --engine vllm only"):
        parse_policies("eagle3:4", engine="hf")


def test_stock_methods_take_vllms_dynamic_sd_table_as_route_a():
    """``eagle3:S-E:K,...`` is stock EAGLE-3 with K per running-batch-size range: its engine's
    ``speculative_config`` carries vLLM's table, K is the deepest row, and bad tables fail here."""
    from draftrl.config.serve import ServeConfig
    from draftrl.eval.serve_policies import engine_config_for

    items = split_policies("none,eagle3:1-1:3,2-16:1,ngram:1-2:4,3-16:0,fixed:4,eagle3:2")
    assert items == ["none", "eagle3:1-1:3,2-16:1", "ngram:1-2:4,3-16:0", "fixed:4", "eagle3:2"]
    eagle3, ngram = parse_policies(items, engine="vllm")[1:3]
    assert (eagle3.kind, eagle3.depth, eagle3.dsd) == ("eagle3", 3, ((1, 1, 3), (2, 16, 1)))
    assert (ngram.kind, ngram.depth, ngram.dsd) == ("ngram", 4, ((1, 2, 4), (3, 16, 0)))
    spec = engine_config_for(eagle3, ServeConfig()).speculative_config()
    assert spec["method"] == "eagle3" and spec["model"].endswith("smollm2-135m")
    assert spec["num_speculative_tokens"] == 3 and spec["num_speculative_tokens_per_batch_size"] == [[1, 1, 3], [2, 16, 1]]
    assert "num_speculative_tokens_per_batch_size" not in engine_config_for(parse_policies("eagle3:2", engine="vllm")[1],
                                                                            ServeConfig()).speculative_config()
    for bad, why in (("eagle3:1-1:0,2-16:0", "deepest K is 1..16"), ("eagle3:2-16:1", "batch size 1"),
                     ("ngram:1-4:2,3-16:1", "overlaps"), ("eagle3:1-1:3,9-4:1", "empty")):
        with pytest.raises(ValueError, match=why):
            parse_policies(bad, engine="vllm")
    from draftrl.decoding.vllm.engine import VLLMEngineConfig

    with pytest.raises(ValueError, match="use method='ngram' or 'eagle3'"):
        VLLMEngineConfig(method="draftrl", dsd=((1, 16, 2),))


def test_route_b_names_run_the_head_in_draftrls_proposer_at_depth_k():
    """``head:K`` and ``sam:N:K`` run draftrl's proposer with the head (``env.head``) at depth K."""
    from draftrl.config.serve import ServeConfig
    from draftrl.decoding.vllm.head_proposer import HEAD_CLASS_PATH
    from draftrl.eval.serve_policies import engine_config_for, proposer_rule

    head, sam = parse_policies("head:3,sam:2:4", engine="vllm")[1:]
    assert (head.kind, head.depth, head.min_match) == ("head", 3, None)
    assert (sam.kind, sam.depth, sam.min_match) == ("sam", 4, 2)
    config = engine_config_for(sam, ServeConfig())
    assert config.method == "draftrl" and config.drafter.startswith("sam:2:") and config.drafter.endswith("smollm2-135m")
    assert config.speculative_config()["model"] == HEAD_CLASS_PATH
    stopped = parse_policies("head:6:t0.4,sam:2:6:c0.25", engine="vllm")[1:]
    assert [(s.depth, s.stop) for s in stopped] == [(6, "confidence:0.4"), (6, "cumulative:0.25")]
    assert [proposer_rule(s) for s in stopped] == ["confidence:0.4", "cumulative:0.25"]
    loaded = parse_policies("sam:2:6:t0.6:b1,head:4:b2", engine="vllm")[1:]
    assert [(s.depth, s.stop, s.head_max_batch) for s in loaded] == [(6, "confidence:0.6", 1), (4, None, 2)]
    assert [proposer_rule(s) for s in loaded] == ["confidence:0.6|batch:1", "match|batch:2"]
    assert proposer_rule(parse_policies("sam:2:6", engine="vllm")[1]) == "match"
    for bad in ("head:9", "sam:3", "head:2:1", "sam:x:2", "head:4:t1.5", "sam:2:4:x0.3", "sam:2:4:b0", "head:4:b1:t0.6",
                "sam:2:4:t0.6:bx"):
        with pytest.raises(ValueError, match="must look like"):
            parse_policies(bad, engine="vllm")


def test_vllm_depths_stop_at_the_proposer_and_dsd_tables_start_at_one():
    with pytest.raises(ValueError, match="deeper than vLLM's proposer"):
        parse_policies("fixed:9", engine="vllm")
    with pytest.raises(ValueError, match="batch size 1"):
        parse_policies("dsd:2-4:3", engine="vllm")
    with pytest.raises(ValueError, match="START-END:K"):
        parse_policies("dsd:1:3", engine="vllm")


def test_cli_bad_policy_exits_2_with_one_line(tmp_path, capsys):
    code = main(["eval", "--policies", "none,warp-drive", "--out", str(tmp_path / "e"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1
    assert "warp-drive" in err and "heuristic" in err and "ppo:DIR" in err
    assert not (tmp_path / "e").exists()
