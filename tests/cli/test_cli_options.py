"""The shared options mean the same on every command: a flag is its config key (``draftrl.cli._options``).

Parsers only: each command's ``config(args)`` resolves ``--config``, ``--set`` and the flags into
its typed config without loading a model.
"""

from __future__ import annotations

import importlib

import pytest

from draftrl.cli import COMMANDS, build_parser

#: Arguments each command needs to parse at all.
REQUIRED: dict[str, list[str]] = {
    "generate": ["--prompt", "hi"],
    "collect": ["--out", "o"],
    "train": ["--out", "o"],
    "grid": ["--out", "o"],
    "eval": ["--out", "o"],
    "export": ["run", "--format", "onnx", "--out", "o"],
}
#: Flag -> (value on the command line, the config attribute path it sets, the value it must hold).
SHARED = {
    "--target": ("tiny-model", "env.target", "tiny-model"),
    "--drafter": ("layerskip:3", "env.drafter", "layerskip:3"),
    "--device": ("cuda:1", "env.device", "cuda:1"),
    "--dtype": ("bfloat16", "env.dtype", "bfloat16"),
    "--kernels": ("stock", "env.kernels", "stock"),
    "--compile": ("default", "env.compile", "default"),
    "--threads": ("3", "threads", 3),
    "--seed": ("7", "seed", 7),
}
CONFIG_COMMANDS = ("generate", "calibrate", "collect", "train", "grid", "eval", "demo")


def _parser(command: str):
    return build_parser()._subparsers._group_actions[0].choices[command]


def _accepts(command: str, flag: str) -> bool:
    return flag in _parser(command)._option_string_actions


def _config(command: str, *argv: str):
    args = build_parser().parse_args([command, *REQUIRED.get(command, []), *argv])
    return importlib.import_module(f"draftrl.cli.{command}").config(args)


def _get(obj, path: str):
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("flag", sorted(SHARED))
def test_a_shared_flag_sets_its_key_on_every_command(flag):
    value, path, expected = SHARED[flag]
    commands = [c for c in CONFIG_COMMANDS if _accepts(c, flag)]
    assert commands, f"no command accepts {flag}"
    for command in commands:
        assert _get(_config(command, flag, value), path) == expected, (command, flag)
        # --set with the same key sets the same value, and a flag wins over --set
        assert _get(_config(command, "--set", f"{path}={value}"), path) == expected, (command, path)
        if flag in ("--threads", "--seed"):
            assert _get(_config(command, "--set", f"{path}=11", flag, value), path) == expected


def test_every_decoding_command_takes_the_same_model_threads_and_config_flags():
    for command in ("generate", "calibrate", "collect", "grid", "eval", "demo"):
        for flag in ("--config", "--set", "--target", "--drafter", "--device", "--dtype", "--kernels", "--threads",
                     "--json"):
            assert _accepts(command, flag), (command, flag)
    for command in ("train", "grid", "eval", "demo", "generate", "calibrate"):
        assert _accepts(command, "--seed"), command
    for command in ("train", "grid", "eval", "demo", "collect", "calibrate", "export"):
        assert _accepts(command, "--out"), command


def test_omitted_flags_leave_the_config_defaults():
    """A flag's default is "not given": the config's own default stands (threads differ by command)."""
    from draftrl.config.commands import CalibrateConfig, GenerateConfig
    from draftrl.eval.config import EvalConfig
    from draftrl.train.config import TrainConfig

    assert _config("generate") == GenerateConfig()
    assert _config("calibrate") == CalibrateConfig()
    assert _config("grid") == EvalConfig()
    assert _config("train").threads == TrainConfig().threads == 1


def test_the_same_yaml_file_drives_every_decoding_command():
    """configs/eval_tiny_cpu.yaml (env, grid, eval sections) reads into each command's env section."""
    for command in ("generate", "calibrate", "collect", "grid", "eval", "demo"):
        cfg = _config(command, "--config", "configs/eval_tiny_cpu.yaml")
        assert cfg.env.languages == ("en", "zh") and cfg.env.max_new_tokens == 32, command


def test_unknown_keys_fail_on_every_command():
    for command in CONFIG_COMMANDS:
        with pytest.raises(ValueError, match="env.targt|did you mean|unknown config key"):
            _config(command, "--set", "env.targt=x")


def test_misspelled_sections_fail_on_every_command(tmp_path):
    """A top-level key no command reads is refused everywhere (a typo would otherwise run the defaults)."""
    bad = tmp_path / "typo.yaml"
    bad.write_text("enviroment:\n  max_new_tokens: 8\n")
    for command in CONFIG_COMMANDS:
        with pytest.raises(ValueError, match="unknown (section|config key) 'enviroment'"):
            _config(command, "--config", str(bad))


def test_sections_name_every_key_a_command_reads():
    """``draftrl.config.SECTIONS`` (what a shared YAML file may hold) is exactly the union of the commands' keys."""
    import dataclasses

    from draftrl.config import SECTIONS

    read = set()
    for command in CONFIG_COMMANDS:
        read |= {f.name for f in dataclasses.fields(_config(command))}
    assert read == set(SECTIONS)


def test_command_specific_flags_are_their_keys():
    cfg = _config("generate", "--temperature", "0.7", "--max-new-tokens", "9", "--width", "2", "--verify-size", "3",
                  "--no-monitor", "--draft-sampling", "--sampler", "resample-from-p")
    assert (cfg.env.temperature, cfg.env.max_new_tokens, cfg.env.width, cfg.verify_size) == (0.7, 9, 2, 3)
    assert (cfg.env.monitor, cfg.env.draft_sampling, cfg.sampler) == (False, True, "resample-from-p")
    cfg = _config("eval", "--policies", "none,heuristic", "--no-monitor", "--power-tokens", "5", "--ignore-eos")
    assert (cfg.eval.policies, cfg.eval.monitor, cfg.eval.power_tokens) == (("none", "heuristic"), False, 5)
    assert cfg.env.ignore_eos and _config("generate", "--ignore-eos").env.ignore_eos
    cfg = _config("calibrate", "--num-tokens", "4,1,2", "--repeats", "2", "--temperature", "1.0")
    assert (cfg.calibrate.num_tokens, cfg.calibrate.repeats, cfg.env.temperature) == ((1, 2, 4), 2, 1.0)


def test_every_command_module_has_one_parser():
    assert set(COMMANDS) >= set(CONFIG_COMMANDS)


#: ``--set`` items of workload keys (``draftrl.config.workload.WorkloadConfig``) and the value each must set.
WORKLOAD_SETS = {
    "env.temperature=1": ("temperature", 1.0),
    "env.max_new_tokens=12": ("max_new_tokens", 12),
    "env.max_new_tokens_cap=64": ("max_new_tokens_cap", 64),
    "env.target=tiny-model": ("target", "tiny-model"),
    "env.languages=[en,zh]": ("languages", ("en", "zh")),
    "env.tasks=[chat]": ("tasks", ("chat",)),
    "env.prompts=p.jsonl": ("prompts", "p.jsonl"),
    "env.top_k=5": ("top_k", 5),
}


@pytest.mark.parametrize("item", sorted(WORKLOAD_SETS))
def test_a_workload_key_sets_the_same_field_on_both_engines(item):
    from draftrl.cli.eval import serving_config

    name, expected = WORKLOAD_SETS[item]
    hf = _config("eval", "--set", item).env
    args = build_parser().parse_args(["eval", "--engine", "vllm", "--out", "o", "--set", item])
    vllm = serving_config(args)
    assert getattr(hf, name) == getattr(vllm, name) == expected


def test_both_engines_share_the_workload_fields_and_defaults():
    import dataclasses

    from draftrl.config.env import EnvConfig
    from draftrl.config.serve import ServeConfig
    from draftrl.config.workload import WorkloadConfig

    shared = {f.name for f in dataclasses.fields(WorkloadConfig)}
    assert {"target", "prompts", "split", "languages", "tasks", "max_new_tokens", "temperature"} <= shared
    differ = {name for name in shared if getattr(EnvConfig(), name) != getattr(ServeConfig(), name)}
    assert differ == {"limit_per_group"}  # a serving episode serves one prompt per group (16 requests)


def test_the_flags_set_the_serving_config_too():
    from draftrl.cli.eval import serving_config

    args = build_parser().parse_args(["eval", "--engine", "vllm", "--out", "o", "--target", "tiny-model",
                                      "--dtype", "bfloat16", "--threads", "3", "--seed", "7"])
    config = serving_config(args)
    assert (config.target, config.dtype, config.threads, config.seed) == ("tiny-model", "bfloat16", 3, 7)
    for argv, message in ((["--drafter", "ngram"], "env.drafter"), (["--no-monitor"], "eval.monitor"),
                          (["--set", "temperature=1"], "env.KEY=VALUE")):
        args = build_parser().parse_args(["eval", "--engine", "vllm", "--out", "o", *argv])
        with pytest.raises(ValueError, match=message):
            serving_config(args)


def test_a_serving_config_file_reads_the_env_section_and_refuses_unknown_sections(tmp_path):
    from draftrl.config.serve import load_serve_config

    path = tmp_path / "serve.yaml"
    path.write_text("env:\n  temperature: 1.0\n  max_new_tokens: 8\n  concurrency: 2\nthreads: 2\neval:\n  repeats: 3\n")
    config = load_serve_config(path, ["env.max_new_tokens=12"], split="heldout")
    assert (config.temperature, config.max_new_tokens, config.concurrency, config.threads, config.split) == \
        (1.0, 12, 2, 2, "heldout")
    path.write_text("enviroment:\n  temperature: 1.0\n")
    with pytest.raises(ValueError, match="did you mean 'environment'|unknown section"):
        load_serve_config(path)
    with pytest.raises(ValueError, match="unknown config key 'env.model'; did you mean 'env.max_model_len'|env.model"):
        load_serve_config(None, ["env.model=x"])


def test_collect_engine_vllm_reads_the_same_env_keys():
    from draftrl.cli.collect import serving_config

    args = build_parser().parse_args(["collect", "--engine", "vllm", "--out", "o", "--set", "env.split=heldout",
                                      "--target", "tiny-model"])
    config = serving_config(args)
    assert (config.split, config.target) == ("heldout", "tiny-model")
