"""``draftrl export RULE --format vllm --out DIR`` for rules with no policy network: a stock rule
(route (a): ``vllm-eagle3``/``vllm-ngram``, a Dynamic SD table optional) writes a config plain vLLM
runs; a head rule (route (b): ``fixed``/``stop`` with a head drafter) also names route (a) at its
depth. Policies trained with the head export to
stock ``eagle3`` with the head folder. (Real vLLM starts these in tests/real_vllm.)"""

from __future__ import annotations

import json
from pathlib import Path

from draftrl.cli import main
from draftrl.drafters.packaged import packaged_head
from draftrl.export import engine_config as ec

SHIPPED = str(Path(packaged_head("smollm2-135m")).resolve())


def _same_files(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.iterdir())
    return names == sorted(p.name for p in b.iterdir()) and all((a / n).read_bytes() == (b / n).read_bytes()
                                                                 for n in names)


def test_a_stock_eagle3_table_exports_as_plain_vllm_config(tmp_path, capsys):
    """The bundle holds the head it names (a path relative to the bundle), the target, vLLM's
    memory share and lines that run from the bundle folder."""
    out = tmp_path / "route_a"
    assert main(["export", "vllm-eagle3:1-1:3,2-16:1", "--format", "vllm", "--out", str(out),
                 "--gpu-memory-utilization", "0.45"]) == 0
    bundle = json.loads((out / "vllm.json").read_text())
    assert (sorted(p.name for p in out.iterdir()) == ["drafter", "vllm.json"]
            and _same_files(out / "drafter", Path(SHIPPED)))
    assert bundle["speculative_config"] == {"method": "eagle3", "model": "./drafter", "num_speculative_tokens": 3,
                                            "num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 16, 1]]}
    assert bundle["target"] == "smollm2-135m" and bundle["engine_args"] == {"gpu_memory_utilization": 0.45}
    assert bundle["env"] == {} and not any(w in bundle[k] for w in ("custom_class", "DRAFTRL_")
                                           for k in ("python", "serve"))
    assert bundle["serve"].startswith("cd BUNDLE_DIR && vllm serve MODEL_DIR --gpu-memory-utilization 0.45 "
                                      "--speculative-config ")
    assert "gpu_memory_utilization=0.45" in bundle["python"]
    assert json.loads(bundle["serve"].split("'")[1]) == bundle["speculative_config"]
    assert str(tmp_path) not in (out / "vllm.json").read_text().replace(bundle["drafter_source"], "")
    assert "speculative_config=" in capsys.readouterr().out
    assert bundle["policy"] == "vllm-eagle3:1-1:3,2-16:1"
    assert main(["export", "vllm-ngram:4", "--format", "vllm", "--out", str(tmp_path / "ngram")]) == 0
    ngram = json.loads((tmp_path / "ngram" / "vllm.json").read_text())["speculative_config"]
    assert ngram["method"] == "ngram" and ngram["num_speculative_tokens"] == 4
    assert "num_speculative_tokens_per_batch_size" not in ngram


def test_a_bad_rule_is_refused_in_one_line_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "bad"
    for argv, why in ((["vllm-eagle3:1-4:2,3-16:1"], "overlaps"),
                      (["vllm-eagle3:2", "--drafter", f"eagle3:{tmp_path}"], "config.json"),
                      ([f"vllm-eagle3:2@eagle3:{tmp_path}"], "config.json"),
                      (["fixed:4"], "name it with --drafter eagle3[:DIR] or sam:N[:DIR] (or fixed:4@eagle3)"),
                      (["stop:4:t0.6", "--drafter", "ngram:1:3"], "a vllm rule bundle runs an EAGLE-3 head"),
                      (["fixed:4@eagle3", "--drafter", "sam:2"], "give it once"),
                      (["vllm-ngram:4", "--drafter", "eagle3"], "reads no drafter"),
                      (["fixed:4:8@eagle3", "--budget", "8"], "a rule's budget is its V"),
                      (["heuristic", "--drafter", "eagle3"], "--drafter is read by --format vllm rule bundles only")):
        assert main(["export", *argv, "--format", "vllm", "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and why in err, (argv, err)
        assert not out.exists()


#: Rule names of earlier releases and what ``draftrl export`` now names instead.
RENAMED_RULES = [("sam:2:6:t0.6:b1", "stop:6:t0.6:b1@sam:2"), ("head:3", "fixed:3@eagle3"),
                 ("eagle3:1-1:2,2-16:1", "vllm-eagle3:1-1:2,2-16:1"), ("ngram:4", "vllm-ngram:4")]


def test_earlier_rule_names_and_the_head_flag_are_refused_naming_their_replacement(tmp_path, capsys):
    out = tmp_path / "old"
    for old, new in RENAMED_RULES:
        assert main(["export", old, "--format", "vllm", "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"is renamed: write {new} " in err, err
    assert main(["export", "vllm-eagle3:2", "--format", "vllm", "--out", str(out), "--head", "runs/head"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--head is gone" in err and "--drafter eagle3:runs/head" in err
    assert not out.exists()


def test_a_head_rule_bundle_also_names_route_a(tmp_path):
    out = tmp_path / "route_b"
    assert main(["export", "stop:4:t0.6@sam:2", "--format", "vllm", "--out", str(out)]) == 0
    bundle = json.loads((out / "vllm.json").read_text())
    proposer = json.loads((out / "proposer.json").read_text())
    assert bundle["policy"] == "stop:4:t0.6@sam:2"
    assert proposer == {"drafter": "sam:2:drafter", "depth": 4, "rule": "confidence:0.6", "budget": None}
    assert bundle["speculative_config"]["method"] == "custom_class" and bundle["env"] == {"DRAFTRL_PROPOSER_CONFIG":
                                                                                          "proposer.json"}
    assert proposer["drafter"] == "sam:2:drafter" and _same_files(out / "drafter", Path(SHIPPED))
    assert bundle["engine_args"] == {"gpu_memory_utilization": 0.9, "enforce_eager": True}
    assert "--enforce-eager" in bundle["serve"] and "enforce_eager=True" in bundle["python"]
    assert bundle["route_a"]["speculative_config"] == {"method": "eagle3", "model": "./drafter",
                                                       "num_speculative_tokens": 4}
    assert "custom_class" not in bundle["route_a"]["serve"] and "DRAFTRL_" not in bundle["route_a"]["serve"]
    # a rule names the target given; a run's bundle the run's own (tests/byo/test_byo_export.py)
    assert main(["export", "vllm-ngram:3", "--format", "vllm", "--out", str(tmp_path / "hub"), "--target",
                 "someone/my-llama"]) == 0
    hub = json.loads((tmp_path / "hub" / "vllm.json").read_text())
    assert hub["target"] == "someone/my-llama" and "vllm serve someone/my-llama " in hub["serve"]
    assert "LLM(model='someone/my-llama', gpu_memory_utilization=0.9, " in hub["python"]


def test_a_head_rule_takes_its_drafter_from_the_flag_or_the_name_and_its_budget_from_v(tmp_path):
    """``fixed:K[:V][:bB]`` with ``--drafter`` writes the same proposer as with ``@DRAFTER``:
    the earlier ``head:K`` / ``head:K:bB`` bundles, now with V as the proposer's budget."""
    flag, named = tmp_path / "flag", tmp_path / "named"
    assert main(["export", "fixed:3:b1", "--drafter", "eagle3", "--format", "vllm", "--out", str(flag)]) == 0
    assert main(["export", "fixed:3:b1@eagle3", "--format", "vllm", "--out", str(named)]) == 0
    for out in (flag, named):
        assert json.loads((out / "proposer.json").read_text()) == {"drafter": "eagle3:drafter", "depth": 3,
                                                                   "rule": "match|batch:1", "budget": None}
    assert main(["export", "fixed:4:16@eagle3", "--format", "vllm", "--out", str(tmp_path / "budget")]) == 0
    assert json.loads((tmp_path / "budget" / "proposer.json").read_text())["budget"] == 16


def test_policies_trained_with_the_head_export_to_stock_eagle3():
    derivation = {"k1": 3, "width": 1, "verify_size": 0, "drafter": "sam:2", "target": "smollm2-135m",
                  "depths": [0, 2, 3], "depth_by_batch": [[1, 4, 3], [5, 512, 1]],
                  "deepest_common_by_batch": [[1, 512, 3]], "common_depths": [2, 3]}
    config = ec.vllm_config(derivation)
    spec = config["speculative_config"]
    assert spec["method"] == "eagle3" and spec["model"] == SHIPPED and spec["num_speculative_tokens"] == 3
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 4, 3], [5, 512, 1]]
    assert "head alone" in config["notes"][0]
    assert ec.vllm_config({**derivation, "drafter": "eagle3:/heads/h"})["speculative_config"]["model"] == "/heads/h"
    assert ec.vllm_config(derivation, method="eagle3")["speculative_config"]["model"] == SHIPPED
    args = ec.sglang_config(derivation)["server_args"]
    assert args["speculative_algorithm"] == "EAGLE3" and args["speculative_draft_model_path"] == SHIPPED
