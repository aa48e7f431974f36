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
    "--wandb-project": ("speedups", "wandb.project", "speedups"),
    "--wandb-group": ("cpu-baseline", "wandb.group", "cpu-baseline"),
    "--wandb-entity": ("team", "wandb.entity", "team"),
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
    from draftrl.eval.round.config import EvalConfig
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
    assert config.drafter == "ngram:1:3:latest"  # the proposer's n-gram drafter, unless --drafter names another
    args = build_parser().parse_args(["eval", "--engine", "vllm", "--out", "o", "--drafter", "eagle3:runs/head"])
    assert serving_config(args).drafter == "eagle3:runs/head"
    for argv, message in ((["--drafter", "layerskip:8"], "env.drafter='layerskip:8' cannot run inside vLLM's proposer"),
                          (["--no-monitor"], "eval.monitor"), (["--set", "temperature=1"], "env.KEY=VALUE"),
                          (["--set", "env.head=runs/head"], "env.head is gone.*env.drafter: eagle3:DIR")):
        args = build_parser().parse_args(["eval", "--engine", "vllm", "--out", "o", *argv])
        with pytest.raises(ValueError, match=message):
            serving_config(args)


def test_every_command_that_logs_takes_the_wandb_flags():
    """grid, eval, train and both demos: --wandb-project/--wandb-group/--wandb-entity are their wandb keys
    (--engine vllm reads them beside its ServeConfig, the serve demo into its own wandb section)."""
    from draftrl.cli.demo import config as demo_config
    from draftrl.cli.eval import serving_config, serving_wandb
    from draftrl.config import load_config
    from draftrl.eval.serve.demo import ServeDemoConfig

    for command in ("train", "grid", "eval", "demo"):
        for flag in ("--wandb-project", "--wandb-group", "--wandb-entity"):
            assert _accepts(command, flag), (command, flag)
    assert _config("grid", "--wandb-group", "2026").wandb.group == "2026"  # a number-like name stays a name
    argv = ["--wandb-project", "p", "--wandb-group", "g", "--wandb-entity", "e"]
    args = build_parser().parse_args(["eval", "--engine", "vllm", "--out", "o", *argv, "--set", "wandb.tags=[x]"])
    wandb = serving_wandb(args)
    assert (wandb.project, wandb.group, wandb.entity, wandb.tags) == ("p", "g", "e", ["x"])
    serving_config(args)  # the wandb keys are not workload keys
    args = build_parser().parse_args(["demo", "--engine", "vllm", *argv])
    assert demo_config(args).wandb.group == "g"
    served = load_config(ServeDemoConfig, None, ["wandb.group=g", "wandb.project=p"])
    assert (served.wandb.group, served.wandb.project) == ("g", "p")


def test_a_serving_config_file_reads_the_env_section_and_refuses_unknown_sections(tmp_path):
    from draftrl.config.serve import load_serve_config

    path = tmp_path / "serve.yaml"
    path.write_text("env:\n  temperature: 1.0\n  max_new_tokens: 8\n  concurrency: 2\n"
                    "threads: 2\neval:\n  repeats: 3\n")
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


def test_collect_engine_vllm_refuses_a_drafter_it_would_not_read(tmp_path, capsys):
    """Recordings are decoded without speculation: a drafter there would be ignored, so it is refused."""
    from draftrl.cli import main

    assert main(["collect", "--engine", "vllm", "--drafter", "eagle3", "--out", str(tmp_path / "rec")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "records without speculation" in err and not (tmp_path / "rec").exists()


@pytest.mark.parametrize("argv", [["eval", "--out", "o"], ["eval", "--engine", "vllm", "--out", "o"],
                                  ["export", "runs/x", "--format", "vllm", "--out", "o"]])
def test_the_head_flag_is_refused_naming_the_drafter(argv, capsys):
    """``--head DIR`` of earlier releases: hidden from --help, refused in one line naming ``--drafter eagle3:DIR``."""
    from draftrl.cli import main

    assert main([*argv, "--head", "runs/head"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--head is gone" in err and "--drafter eagle3:runs/head" in err
    assert "--head" not in _parser(argv[0]).format_help()


# ----------------------------------------------------------------------------- a demo config drives each step
def _demo_copy(tmp_path, name: str = "demo_cpu.yaml", target: str = "my-target", extra: str = ""):
    """configs/NAME as a user copies it, the target edited (its drafter still sam:2), plus ``extra`` lines."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "configs" / name).read_text()
    copy = tmp_path / name
    copy.write_text(text.replace("\nenv:\n", f"\nenv:\n  target: {target}\n", 1) + extra)
    return str(copy)


@pytest.mark.parametrize("name", ["demo_cpu.yaml", "demo_quick_cpu.yaml"])
def test_every_step_command_reads_a_demo_config_as_the_demo_runs_that_step(tmp_path, name):
    """Each step command takes what the demo's step reads, with the demo's defaults (not the command's own)."""
    import dataclasses

    from draftrl.config.commands import CalibrateConfig, CollectConfig
    from draftrl.eval.round.config import EvalConfig
    from draftrl.eval.round.demo import step_config, train_config

    copy = _demo_copy(tmp_path, name, target="smollm2-135m")
    demo = _config("demo", "--config", copy)
    assert demo.env.drafter == "sam:2"  # a head ships for SmolLM2: nothing falls back
    for command, cls in (("calibrate", CalibrateConfig), ("collect", CollectConfig), ("grid", EvalConfig),
                         ("eval", EvalConfig)):
        assert _config(command, "--config", copy) == step_config(demo, cls), command
    # the demo's, not CalibrationConfig's 1,2,4,8
    assert _config("calibrate", "--config", copy).calibrate.widths == (1,)
    assert _config("collect", "--config", copy).env.split == "tune"  # the demo collects the tune split
    collect = _config("collect", "--config", copy)  # the demo's K and temperature mix
    assert collect.continuations == demo.continuations == 1 and len(collect.env.sampling_classes) == 3
    with pytest.raises(ValueError, match="continuations=0 must be >= 1"):
        _config("collect", "--config", copy, "--set", "continuations=0")
    assert _config("collect", "--config", copy, "--set", "env.split=heldout").env.split == "heldout"
    assert _config("grid", "--config", copy).threads == 1 != EvalConfig().threads
    trained = _config("train", "--config", copy, "--traces", "runs/demo/traces")
    assert trained == train_config(demo, demo.train.recipes[0], "runs/demo/traces")
    flagged = _config("train", "--config", copy, "--traces", "t", "--kernels", "stock", "--set", "recipe=ppo_depth",
                      "--set", "ppo.learning_rate=1.0e-3")
    assert flagged == dataclasses.replace(
        train_config(dataclasses.replace(demo, env=dataclasses.replace(demo.env, kernels="stock")), "ppo_depth", "t"),
        ppo=dataclasses.replace(trained.ppo, learning_rate=1.0e-3))  # env.KEY sets env and depth_env, as the demo


def test_a_demo_config_keeps_unknown_keys_and_sections_refused(tmp_path):
    for command in ("calibrate", "collect", "grid", "eval", "demo"):
        with pytest.raises(ValueError, match=r"unknown config key 'grid.repeat'; did you mean 'grid.repeats'"):
            _config(command, "--config", _typo(tmp_path, "grid:\n", "grid:\n  repeat: 2\n"))
        with pytest.raises(ValueError, match="did you mean 'calibrate.contexts'"):
            _config(command, "--config", _typo(tmp_path, "calibrate:\n", "calibrate:\n  context: [64]\n"))
        with pytest.raises(ValueError, match=r"unknown (section|config key) 'grids'; did you mean 'grid'"):
            _config(command, "--config", _typo(tmp_path, "grid:\n", "grids:\n"))
    with pytest.raises(ValueError, match="did you mean 'train.total_timesteps'"):
        _config("train", "--config", _typo(tmp_path, "train:\n", "train:\n  total_timestep: 5\n"), "--traces", "t")
    with pytest.raises(ValueError, match="demo config: pass --traces DIR"):
        _config("train", "--config", _demo_copy(tmp_path))
    with pytest.raises(ValueError, match="--traces is read with a demo config only"):
        _config("train", "--config", "configs/analytic_regimes.yaml", "--traces", "t")
    with pytest.raises(ValueError, match="did you mean 'calibrate.repeats'"):  # --set stays strict
        _config("calibrate", "--config", _demo_copy(tmp_path), "--set", "calibrate.repeat=2")


def _typo(tmp_path, old: str, new: str) -> str:
    """A copy of configs/demo_cpu.yaml with its first ``old`` replaced by ``new``."""
    path = tmp_path / "typo.yaml"
    text = open(_demo_copy(tmp_path)).read()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    return str(path)


def test_a_missing_head_falls_back_from_a_default_and_is_refused_when_asked_for(tmp_path, capsys):
    """Decided from the target's name before anything loads: the demo's default sam:2 (built in or in a
    copied file) drafts by n-gram lookup, saying so once; sam:2 or eagle3 on the command line is refused."""
    from draftrl.drafters.packaged import FALLBACK_DRAFTER

    copy = _demo_copy(tmp_path)
    for argv in (["demo", "--target", "my-target"], ["demo", "--quick", "--target", "my-target"],
                 ["demo", "--config", copy], ["grid", "--config", copy], ["eval", "--config", copy],
                 ["calibrate", "--config", copy], ["collect", "--config", copy], ["generate", "--config", copy],
                 ["train", "--config", copy, "--traces", "t"]):
        cfg = _config(*argv)
        assert cfg.env.drafter == FALLBACK_DRAFTER, argv
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith(f"draftrl {argv[0]}: drafter sam:2 needs an EAGLE-3 head"), line
        assert ("ships none for the target 'my-target'" in line and "drafting with ngram:1:3:latest" in line
                and "`draftrl distill --target my-target --out heads/my-target`" in line), line
    assert _config("train", "--config", copy, "--traces", "t").depth_env.drafter == FALLBACK_DRAFTER
    capsys.readouterr()
    assert _config("demo").env.drafter == "sam:2" and not capsys.readouterr().err  # SmolLM2's head ships
    assert _config("grid", "--target", "my-target").env.drafter == "ngram"  # needs no head: untouched
    assert _config("demo", "--target", "my-target", "--drafter", "sam:2:heads/mine").env.drafter == "sam:2:heads/mine"
    for argv in (["demo", "--target", "my-target", "--drafter", "sam:2"],
                 ["grid", "--config", copy, "--drafter", "eagle3"],
                 ["calibrate", "--config", copy, "--set", "env.drafter=sam:3"],
                 ["generate", "--target", "my-target", "--drafter", "eagle3"],
                 ["train", "--config", copy, "--traces", "t", "--drafter", "sam:2"]):
        with pytest.raises(ValueError, match=r"ships none for the target 'my-target'.*draftrl distill --target "
                                             r"my-target --out heads/my-target.*or draft by lookup"):
            _config(*argv)
def test_the_vllm_engine_flags_set_the_serving_config_and_are_refused_without_vllm(capsys):
    """--gpu-memory-utilization / --enforce-eager are ServeConfig keys on eval and collect --engine
    vllm; with --engine hf (no vLLM engine) each is refused in one line; a memory share that
    several held engines would overflow is refused naming the share that fits."""
    from draftrl.cli import main
    from draftrl.cli.eval import serving_config

    args = build_parser().parse_args(["eval", "--engine", "vllm", "--out", "o", "--gpu-memory-utilization", "0.45",
                                      "--enforce-eager", "--set", "env.max_engines=2"])
    config = serving_config(args)
    assert (config.gpu_memory_utilization, config.enforce_eager, config.max_engines) == (0.45, True, 2)
    default = serving_config(build_parser().parse_args(["eval", "--engine", "vllm", "--out", "o"]))
    assert (default.gpu_memory_utilization, default.enforce_eager, default.max_engines) == (None, None, 1)
    args = build_parser().parse_args(["eval", "--engine", "vllm", "--out", "o", "--gpu-memory-utilization", "0.6",
                                      "--set", "env.max_engines=2"])
    with pytest.raises(ValueError, match=r"gpu_memory_utilization=0.6 x max_engines=2 exceeds the whole GPU; lower "
                                         r"gpu_memory_utilization to 0.50"):
        serving_config(args)
    for command in (["eval", "--policies", "none"], ["collect"], ["calibrate"]):
        assert main([*command, "--out", "o", "--gpu-memory-utilization", "0.5"]) == 2
        assert f"--gpu-memory-utilization is read by draftrl {command[0]} --engine vllm only" in capsys.readouterr().err


def test_the_vllm_engine_flags_set_the_serve_demos_config_and_are_refused_on_its_hf_engine(tmp_path, capsys):
    """demo --engine vllm takes --gpu-memory-utilization / --enforce-eager as every other vLLM command does,
    into ServeDemoConfig's keys of the same name (which reach each step's engine); --engine hf refuses them in
    one line before anything runs; a share outside (0, 1] is refused naming the range."""
    from draftrl.cli import main
    from draftrl.cli._options import load
    from draftrl.eval.serve.demo import ServeDemoConfig, _serve_config

    args = build_parser().parse_args(["demo", "--engine", "vllm", "--quick", "--gpu-memory-utilization", "0.45",
                                      "--enforce-eager"])
    config = load(ServeDemoConfig, args, base=ServeDemoConfig.quick())
    assert (config.gpu_memory_utilization, config.enforce_eager) == (0.45, True)
    serve = _serve_config(config, split="heldout")  # what the collect and sweep steps build their engines from
    assert (serve.gpu_memory_utilization, serve.enforce_eager) == (0.45, True)
    default = load(ServeDemoConfig, build_parser().parse_args(["demo", "--engine", "vllm"]))
    assert (default.gpu_memory_utilization, default.enforce_eager) == (None, None)
    with pytest.raises(ValueError, match=r"gpu_memory_utilization=1.5 must be in \(0, 1\]"):
        load(ServeDemoConfig, build_parser().parse_args(["demo", "--engine", "vllm", "--gpu-memory-utilization",
                                                          "1.5"]))
    for flag in (["--gpu-memory-utilization", "0.5"], ["--enforce-eager"]):
        out = tmp_path / "demo"
        assert main(["demo", "--quick", "--out", str(out), *flag]) == 2
        err = capsys.readouterr().err.strip()
        assert err.endswith(f"{flag[0]} is read by draftrl demo --engine vllm only; drop it, or add --engine vllm.")
        assert len(err.splitlines()) == 1 and not out.exists()
