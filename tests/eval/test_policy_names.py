"""The one policy grammar of ``draftrl eval --policies`` on both engines (``draftrl.eval.policy_names``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from draftrl.cli import main
from draftrl.eval.policy_names import (
    DEFAULT_DSD,
    ENGINE_KINDS,
    FORMS,
    REFERENCE,
    accepted_names,
    parse_policies,
    split_policies,
)

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
    monkeypatch.setenv("WANDB_MODE", "disabled")  # the fake run returns no results to log
    seen = {}

    def fake_run(out, *, policies, **kwargs):
        seen["policies"] = [s.label for s in parse_policies(policies, engine="vllm")]
        (tmp_path / "out" / "report.md").parent.mkdir(exist_ok=True)
        (tmp_path / "out" / "report.md").write_text("report\n")
        return {}

    monkeypatch.setattr("draftrl.eval.serve.compare.run_eval", fake_run)
    code = main(["eval", "--engine", "vllm", "--policies", "none,fixed:4,heuristic,dsd:1-1:4,2-4:3,5-8:3,9-16:3",
                 "--out", str(tmp_path / "out"), "--quiet"])
    assert code == 0
    assert seen["policies"] == ["none", "fixed:4", "heuristic", "dsd:1-1:4,2-4:3,5-8:3,9-16:3"]


def test_the_cli_hands_the_drafter_to_vllm_eagle3_and_refuses_it_without_a_head(monkeypatch, tmp_path, capsys):
    """``--drafter eagle3:DIR`` sets ``env.drafter`` on --engine vllm too; without it ``vllm-eagle3:K``
    loads the shipped head, and fails in one line before --out exists for a target no head ships for.
    The earlier ``--head DIR`` is refused naming its replacement, on both engines."""
    from draftrl.drafters.eagle3 import CONFIG_FILE, WEIGHTS_FILE
    from draftrl.drafters.packaged import packaged_head
    from draftrl.eval.serve.policies import stock_head

    monkeypatch.setenv("WANDB_MODE", "disabled")  # the fake run returns no results to log
    seen = {}

    def fake_run(out, *, config, policies, **kwargs):
        seen["drafter"] = config.drafter
        seen["head"] = stock_head(parse_policies(policies, engine="vllm")[-1], config)
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "report.md").write_text("report\n")
        return {}

    monkeypatch.setattr("draftrl.eval.serve.compare.run_eval", fake_run)
    head = tmp_path / "head"
    head.mkdir()
    (head / CONFIG_FILE).write_text((packaged_head("smollm2-135m") / CONFIG_FILE).read_text())  # checked, not loaded
    (head / WEIGHTS_FILE).write_bytes(b"")
    command = ["eval", "--engine", "vllm", "--policies", "none,vllm-eagle3:4", "--quiet"]
    assert main([*command, "--drafter", f"eagle3:{head}", "--out", str(tmp_path / "a")]) == 0
    assert seen == {"drafter": f"eagle3:{head}", "head": str(head)}
    assert main(["eval", "--engine", "vllm", "--policies", f"none,vllm-eagle3:4@sam:2:{head}", "--quiet",
                 "--out", str(tmp_path / "own")]) == 0
    assert seen == {"drafter": "ngram:1:3:latest", "head": str(head)}  # the policy's own head; the run's drafter stays
    assert main([*command, "--out", str(tmp_path / "shipped")]) == 0 and seen["head"].endswith("smollm2-135m")
    monkeypatch.setattr("draftrl.drafters.packaged.HEADS_DIR", tmp_path / "no-heads")
    capsys.readouterr()
    assert main([*command, "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "vllm-eagle3:4" in err and "--drafter eagle3:DIR" in err
    assert not (tmp_path / "b").exists()
    for engine in ("hf", "vllm"):
        assert main(["eval", "--engine", engine, "--head", str(head), "--out", str(tmp_path / "c"), "--quiet"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--head is gone" in err and f"--drafter eagle3:{head}" in err
        assert not (tmp_path / "c").exists()


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
    specs = parse_policies("heuristic, best-grid,fixed:4:w2,ppo:runs/a,lookahead,fixed:3:6:w2")
    assert [s.label for s in specs] == ["none", "heuristic", "best-grid", "fixed:4:w2", "ppo", "lookahead",
                                        "fixed:3:6:w2"]
    assert [(s.depth, s.verify_size, s.width) for s in (specs[3], specs[6])] == [(4, None, 2), (3, 6, 2)]
    labels = [s.label for s in parse_policies("ppo:runs/size,ppo:runs/depth/policy.zip")]
    assert labels == ["none", "ppo[size]", "ppo[depth]"]


@pytest.mark.parametrize("engine, name", [("hf", "vllm-ngram:4"), ("hf", "dsd:1-1:4,2-16:1"),
                                          ("hf", "vllm-class:m.C:4"), ("hf", "stop:4:t0.5"), ("hf", "vllm-eagle3:2"),
                                          ("hf", "fixed:4:b1"),
                                          ("vllm", "threshold"), ("vllm", "bandit"), ("vllm", "lookahead"),
                                          ("vllm", "best-grid"), ("vllm", "fixed:4:8:w2")])
def test_a_name_the_engine_cannot_run_is_refused_naming_what_it_accepts(engine, name):
    with pytest.raises(ValueError) as err:
        parse_policies(name, engine=engine)
    message = str(err.value)
    assert "\n" not in message and name.split(",")[0] in message
    assert f"--engine {engine} accepts {accepted_names(engine)}" in message


@pytest.mark.parametrize("engine", ["hf", "vllm"])
@pytest.mark.parametrize("bad", ["foo", "ppo", "fixed:x", "heuristic:3", "none,ar", "fixed:4,fixed:4", "fixed:4:w0",
                                 "fixed:4@", "none@eagle3", "fixed:4:8:9:1"])
def test_bad_policy_name_is_one_line_naming_the_valid_ones(engine, bad):
    with pytest.raises(ValueError) as err:
        parse_policies(bad, engine=engine)
    message = str(err.value)
    assert "\n" not in message
    if "," not in bad:
        assert bad in message and accepted_names(engine) in message


def test_vllm_own_methods_say_so_with_their_prefix_and_take_k():
    specs = parse_policies("vllm-ngram:3,vllm-eagle3:5", engine="vllm")
    assert [(s.kind, s.label, s.depth) for s in specs[1:]] == [("vllm-ngram", "vllm-ngram:3", 3),
                                                               ("vllm-eagle3", "vllm-eagle3:5", 5)]
    with pytest.raises(ValueError, match="vllm-eagle3:K with 1 <= K <= 16") as err:
        parse_policies("vllm-eagle3:0", engine="vllm")
    assert "vllm-eagle3:K|vllm-eagle3:S-E:K,..." in str(err.value)
    with pytest.raises(ValueError, match="runs on --engine vllm only"):
        parse_policies("vllm-eagle3:4", engine="hf")
    for bad, why in (("vllm-ngram:4@ngram:1:3", "runs no draftrl drafter"), ("vllm-class:m.C:4@eagle3", "runs no"),
                     ("vllm-eagle3:4@ngram", "write @eagle3")):
        with pytest.raises(ValueError, match=why):
            parse_policies(bad, engine="vllm")


def test_stock_methods_take_vllms_dynamic_sd_table_as_route_a():
    """``vllm-eagle3:S-E:K,...`` is stock EAGLE-3 with K per running-batch-size range: its engine's
    ``speculative_config`` carries vLLM's table, K is the deepest row, and bad tables fail here."""
    from draftrl.config.serve import ServeConfig
    from draftrl.eval.serve.policies import engine_config_for

    items = split_policies("none,vllm-eagle3:1-1:3,2-16:1,vllm-ngram:1-2:4,3-16:0,fixed:4,vllm-eagle3:2")
    assert items == ["none", "vllm-eagle3:1-1:3,2-16:1", "vllm-ngram:1-2:4,3-16:0", "fixed:4", "vllm-eagle3:2"]
    eagle3, ngram = parse_policies(items, engine="vllm")[1:3]
    assert (eagle3.kind, eagle3.depth, eagle3.dsd) == ("vllm-eagle3", 3, ((1, 1, 3), (2, 16, 1)))
    assert (ngram.kind, ngram.depth, ngram.dsd) == ("vllm-ngram", 4, ((1, 2, 4), (3, 16, 0)))
    spec = engine_config_for(eagle3, ServeConfig()).speculative_config()
    assert spec["method"] == "eagle3" and spec["model"].endswith("smollm2-135m")
    assert (spec["num_speculative_tokens"] == 3
            and spec["num_speculative_tokens_per_batch_size"] == [[1, 1, 3], [2, 16, 1]])
    assert "num_speculative_tokens_per_batch_size" not in engine_config_for(
        parse_policies("vllm-eagle3:2", engine="vllm")[1], ServeConfig()).speculative_config()
    for bad, why in (("vllm-eagle3:1-1:0,2-16:0", "deepest K is 1..16"), ("vllm-eagle3:2-16:1", "batch size 1"),
                     ("vllm-ngram:1-4:2,3-16:1", "overlaps"), ("vllm-eagle3:1-1:3,9-4:1", "empty")):
        with pytest.raises(ValueError, match=why):
            parse_policies(bad, engine="vllm")
    from draftrl.decoding.vllm.engine import VLLMEngineConfig

    with pytest.raises(ValueError, match="use method='ngram' or 'eagle3'"):
        VLLMEngineConfig(method="draftrl", dsd=((1, 16, 2),))


def test_a_policy_drafts_with_the_runs_drafter_or_its_own():
    """``fixed:K`` runs draftrl's proposer with ``env.drafter`` (n-gram lookup by default) or its own
    ``@DRAFTER``; a head drafter runs the head inside the proposer (route (b)) with its folder
    resolved, ``stop:K:S`` and ``:bB`` become the proposer's rule, and one drafter shares one engine."""
    from draftrl.config.serve import SERVING_DRAFTER, ServeConfig
    from draftrl.decoding.vllm.head_proposer import HEAD_CLASS_PATH
    from draftrl.decoding.vllm.proposer import CLASS_PATH
    from draftrl.eval.serve.policies import engine_config_for, proposer_rule

    lookup, head, sam = parse_policies("fixed:3,fixed:3@eagle3,fixed:4@sam:2", engine="vllm")[1:]
    assert (head.kind, head.depth, head.drafter, head.label) == ("fixed", 3, "eagle3", "fixed:3@eagle3")
    config = ServeConfig()
    assert engine_config_for(lookup, config).drafter == SERVING_DRAFTER
    assert engine_config_for(lookup, config).speculative_config()["model"] == CLASS_PATH
    sam_engine = engine_config_for(sam, config)
    assert sam_engine.method == "draftrl" and sam_engine.drafter.startswith("sam:2:")
    assert sam_engine.drafter.endswith("smollm2-135m") and sam_engine.speculative_config()["model"] == HEAD_CLASS_PATH
    headed = ServeConfig(drafter="eagle3")  # the run's drafter: the bare name drafts with the head too
    assert engine_config_for(lookup, headed) == engine_config_for(head, config) == engine_config_for(head, headed)
    stopped = parse_policies("stop:6:t0.4@eagle3,stop:6:c0.25@sam:2", engine="vllm")[1:]
    assert [(s.kind, s.depth, s.stop) for s in stopped] == [("stop", 6, "confidence:0.4"),
                                                            ("stop", 6, "cumulative:0.25")]
    assert [proposer_rule(s) for s in stopped] == ["confidence:0.4", "cumulative:0.25"]
    loaded = parse_policies("stop:6:t0.6:b1@sam:2,fixed:4:b2@eagle3,fixed:4:16:b2@eagle3", engine="vllm")[1:]
    assert [(s.depth, s.verify_size, s.stop, s.head_max_batch) for s in loaded] == [
        (6, None, "confidence:0.6", 1), (4, None, None, 2), (4, 16, None, 2)]
    assert [proposer_rule(s) for s in loaded] == ["confidence:0.6|batch:1", "match|batch:2", "match|batch:2"]
    assert [proposer_rule(s) for s in (lookup, head, sam)] == ["match"] * 3
    for bad in ("stop:9:t0.5", "stop:3", "stop:2:1", "stop:x:t0.5", "stop:4:t1.5", "stop:4:x0.3", "stop:4:t0.6:b0",
                "stop:4:b1:t0.6", "stop:4:t0.6:bx", "fixed:4:bx"):
        with pytest.raises(ValueError, match="must look like"):
            parse_policies(bad, engine="vllm")


#: Every spelling of an earlier release and the one line's replacement, for both engines.
RENAMED = [
    ("ngram:4", "vllm-ngram:4"),
    ("ngram:1-2:4,3-16:1", "vllm-ngram:1-2:4,3-16:1"),
    ("eagle3:2", "vllm-eagle3:2"),
    ("eagle3:1-1:3,2-16:1", "vllm-eagle3:1-1:3,2-16:1"),
    ("class:m.C:4", "vllm-class:m.C:4"),
    ("head:3", "fixed:3@eagle3"),
    ("head:6:t0.4", "stop:6:t0.4@eagle3"),
    ("head:6:c0.25", "stop:6:c0.25@eagle3"),
    ("head:4:b2", "fixed:4:b2@eagle3"),
    ("head:4:t0.6:b1", "stop:4:t0.6:b1@eagle3"),
    ("sam:2:4", "fixed:4@sam:2"),
    ("sam:2:6:t0.6", "stop:6:t0.6@sam:2"),
    ("sam:3:6:c0.3:b1", "stop:6:c0.3:b1@sam:3"),
    ("sam:2:4:b1", "fixed:4:b1@sam:2"),
    ("fixed:4:0:2", "fixed:4:w2"),
    ("fixed:4:8:2", "fixed:4:8:w2"),
]


@pytest.mark.parametrize("engine", ["hf", "vllm"])
@pytest.mark.parametrize("old, new", RENAMED)
def test_every_earlier_spelling_is_refused_naming_its_replacement(engine, old, new):
    with pytest.raises(ValueError) as err:
        parse_policies(f"none,{old},fixed:2", engine=engine)
    message = str(err.value)
    assert "\n" not in message and f"policy {old!r} is renamed: write {new} " in message
    replacement = parse_policies(new, engine="vllm" if new.startswith(("vllm-", "stop")) or ":b" in new
                                 or "@" in new else "hf" if ":w" in new else engine)
    assert replacement[-1].text == new  # the replacement parses as written


@pytest.mark.parametrize("engine", ["hf", "vllm"])
@pytest.mark.parametrize("spec", ["ngram", "ngram:1:3", "eagle3", "eagle3:runs/head", "sam:2", "layerskip:8", "self"])
def test_a_drafter_spec_where_a_policy_goes_names_the_two_places_it_belongs(engine, spec):
    with pytest.raises(ValueError) as err:
        parse_policies(spec, engine=engine)
    message = str(err.value)
    assert "\n" not in message and "is a drafter spec, not a policy" in message
    assert f"--drafter {spec}" in message and f"POLICY@{spec}" in message


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_v_zero_is_refused_on_both_engines(engine):
    """V is the most drafted tokens one step verifies on both engines; 0 once meant "all" on hf and
    "none" on vllm, so it is refused rather than read either way."""
    for old in ("fixed:4:0", "fixed:0:0"):
        with pytest.raises(ValueError, match=r"write fixed:\d \(no limit\) or fixed:0 \(no speculation\)") as err:
            parse_policies(old, engine=engine)
        assert "\n" not in str(err.value)
    assert ([(s.depth, s.verify_size) for s in parse_policies("fixed:4,fixed:4:1", engine=engine)[1:]]
            == [(4, None), (4, 1)])


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
