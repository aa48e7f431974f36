"""``tools/tree_report.py`` counts what it says it counts: on small synthetic trees whose answers are
known (each count with a control that must change it), and on this tree, where it runs in seconds."""

from __future__ import annotations

import importlib.util
import io
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    spec = importlib.util.spec_from_file_location("tree_report", ROOT / "tools" / "tree_report.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["tree_report"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


tree_report = _tool()


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


#: A tree of five rooms: draftrl, draftrl.io, draftrl.low, draftrl.low.sub, draftrl.high.
TREE = {
    "draftrl/__init__.py": '"""Root."""\n',
    "draftrl/io.py": "X = 1\n",
    "draftrl/low/__init__.py": "",
    "draftrl/low/a.py": "from draftrl.io import X\nfrom draftrl.low.sub import b\n",
    "draftrl/low/sub/__init__.py": "",
    # a subpackage importing its parent package: the two rooms share a floor
    "draftrl/low/sub/b.py": "def f():\n    import draftrl.low\n",
    "draftrl/high/__init__.py": "",
    "draftrl/high/c.py": ('"""Names draftrl.io in prose only."""\nimport importlib\n'
                         'def g():\n    return importlib.import_module("draftrl.low.a")\n'),
}


def test_rooms_arrows_and_floors_of_a_known_tree(tmp_path):
    modules = tree_report.read_modules(_write(tmp_path, TREE))
    graph = tree_report.graph_report(modules)
    assert graph["rooms"] == 5
    # low -> io, low -> low.sub, low.sub -> low, high -> low (a string import); the docstring is not an import
    assert graph["arrows"] == 4
    assert graph["folded_rooms"] == [["draftrl.low", "draftrl.low.sub"]]
    assert graph["floors"] == 3  # io; low + low.sub; high
    assert graph["module_circles"] == []
    folders = tree_report.folder_report(modules)
    assert folders["per_folder"] == {"high": 1, "low": 2} and folders["per_subfolder"] == {"low/sub": 1}


def test_a_module_cycle_is_a_circle(tmp_path):
    tree = {**TREE, "draftrl/low/a.py": "from draftrl.high import c\n"}  # high.c -> low.a -> high.c
    graph = tree_report.graph_report(tree_report.read_modules(_write(tmp_path, tree)))
    assert graph["module_circles"] == [["draftrl.high.c", "draftrl.low.a"]]


ENVS = {
    "draftrl/__init__.py": "",
    "draftrl/envs/__init__.py": "from draftrl.envs.ids import register_all\nregister_all({}, print)\n",
    "draftrl/envs/ids.py": ('ENVS = (dict(id="draftrl/TraceReplay-v1",\n'
                            '             entry_point="draftrl.envs.replay:ReplayEnv"),)\n'
                            'def register_all(registry, register):\n    pass\n'),
    "draftrl/envs/replay.py": ("import gymnasium as gym\nclass Base(gym.Env[int, int]):\n    pass\n"
                               "class ReplayEnv(Base):\n    pass\n"),
    "draftrl/envs/helpers.py": "def build_engine():\n    pass\n",
    "draftrl/eval/__init__.py": "",
    "draftrl/eval/uses.py": ("from draftrl.envs.replay import ReplayEnv\n"
                             "from draftrl.envs.helpers import build_engine\n"
                             'def family(env_id):\n    return env_id.startswith("TraceReplay")\n'),
    "draftrl/eval/fine.py": 'import draftrl.envs\nNAME = "replay"\nOK = "draftrl/TraceReplay-v1" != NAME\n',
}


def test_envs_modules_their_importers_and_id_prefix_parsing(tmp_path):
    root = _write(tmp_path, ENVS)
    modules = tree_report.read_modules(root)
    classes = tree_report.read_classes(modules)
    report = tree_report.envs_report(modules, classes, root)
    assert report["defining_envs"] == ["draftrl.envs.replay"]  # ReplayEnv through Base, a subscripted gym.Env
    assert report["registering_envs"] == ["draftrl.envs.ids"]
    assert report["not_envs"] == ["draftrl.envs.helpers"]
    # the env class and the package import are wanted; build_engine is not
    assert report["imported_without_an_env"] == {"draftrl.eval.uses": ["helpers.build_engine"]}
    ids = tree_report.env_ids(modules)
    assert [d["id"] for d in ids] == ["draftrl/TraceReplay-v1"]
    places = tree_report.id_prefix_parsing(modules, ids)
    assert places == ["draftrl/eval/uses.py:4 TraceReplay"]  # fine.py compares a whole id: no prefix parsing
    assert tree_report.id_prefix_parsing(modules, ids, allowed="draftrl.eval.uses") == []


CONFIGS = {
    "draftrl/__init__.py": "",
    "draftrl/config.py": ("from dataclasses import dataclass\n@dataclass\nclass EnvConfig:\n    x: int = 0\n"
                          "class EnvSpec(EnvConfig):\n    pass\n"
                          "@dataclass(frozen=True)\nclass PolicySpec:\n    kind: str = ''\n"
                          "class NotDataSettings:\n    pass\n"
                          "@dataclass\nclass SamplingParams:\n    t: float = 0.0\n"),
    "draftrl/engines.py": ("from typing import Protocol\nclass Serving(Protocol):\n    def add_request(self): ...\n"
                           "    def step(self): ...\nclass Queue:\n    def add_request(self): ...\n"
                           "class Batch(Queue):\n    def step(self): ...\nclass Decoder:\n    def round(self): ...\n"
                           "class HeadProposer:\n    pass\n"),
}


def test_config_classes_engines_and_proposers(tmp_path):
    modules = tree_report.read_modules(_write(tmp_path, CONFIGS))
    classes = tree_report.read_classes(modules)
    configs = tree_report.configs_report(classes)
    # EnvSpec is a dataclass through its base; NotDataSettings is no dataclass
    assert configs["by_suffix"] == {"Config": ["EnvConfig"], "Spec": ["EnvSpec", "PolicySpec"]}
    assert configs["count"] == 3 and configs["other_suffixes"] == ["SamplingParams"]
    engines = tree_report.engines_report(classes)
    assert engines["engines"] == {"round": ["draftrl.engines.Decoder"], "serving": ["draftrl.engines.Batch"]}
    assert engines["protocols"] == {"round": None, "serving": "draftrl.engines.Serving"}
    assert tree_report.proposers_report(classes) == ["draftrl.engines.HeadProposer"]


WALK = {
    "draftrl/__init__.py": "",
    "draftrl/cli/__init__.py": "",
    "draftrl/cli/demo.py": (
        "from dataclasses import dataclass, field, replace\n"
        "from draftrl.decoding.build import use\n"
        "@dataclass\nclass EnvConfig:\n    target: str = 'tiny'\n    depths: tuple = (1, 2)\n"
        "@dataclass\nclass DemoConfig:\n    env: EnvConfig = field(default_factory=EnvConfig)\n    threads: int = 3\n"
        "def config():\n    return DemoConfig()\n"
        "def run():\n    cfg = config()\n    env = replace(cfg.env, target='other')\n"
        "    use(env, cfg.threads + 1)\n    return use(cfg.env, 0)\n"),
    "draftrl/decoding/__init__.py": "",
    "draftrl/decoding/build.py": (
        "def use(env_config, n):\n    spec = env_config.target\n    return build(spec, n)\n"
        "def build(spec, n):\n    return spec\n"),
}


def test_the_static_walk_follows_parts_and_copies_and_broad_also_computed_values(tmp_path):
    root = _write(tmp_path, WALK)
    strict = tree_report.static_walk(root, ("draftrl.cli.demo", "run", "cfg"), strict=True)
    assert strict["names"] == ["cfg", "env", "env_config", "spec"]  # `n` gets cfg.threads + 1: computed, not followed
    # two call sites run -> use; use -> build stays in its room
    assert strict["enters"] == {"draftrl.decoding.build": 2}
    assert strict["rooms_entered_modules"] == 2 and strict["distinct_package_moves"] == 1
    broad = tree_report.static_walk(root, ("draftrl.cli.demo", "run", "cfg"), strict=False)
    assert broad["names"] == ["cfg", "env", "env_config", "n", "spec"]


def test_the_static_walk_reads_a_functions_own_imports_first(tmp_path):
    """Two functions import ``run_demo`` from two modules (as ``cli/demo.py`` does, one per track): each
    call follows its own function's import. Control: the module-wide binding (the later import) sends
    ``run``'s config into the other module, which never builds an engine."""
    files = {
        "draftrl/__init__.py": "", "draftrl/cli/__init__.py": "", "draftrl/round/__init__.py": "",
        "draftrl/serve/__init__.py": "", "draftrl/decoding/__init__.py": "",
        "draftrl/cli/demo.py": (
            "def config():\n    return 1\n"
            "def run():\n    cfg = config()\n    from draftrl.round.demo import run_demo\n    return run_demo(cfg)\n"
            "def run_serve(other):\n    from draftrl.serve.demo import run_demo\n    return run_demo(other)\n"),
        "draftrl/round/demo.py": "from draftrl.decoding.build import build\ndef run_demo(c):\n    return build(c)\n",
        "draftrl/serve/demo.py": "def run_demo(s):\n    return s\n",
        "draftrl/decoding/build.py": "def build(spec):\n    return spec\n",
    }
    root = _write(tmp_path, files)
    walk = tree_report.static_walk(root, ("draftrl.cli.demo", "run", "cfg"), strict=True)
    assert walk["enters"] == {"draftrl.round.demo": 1, "draftrl.decoding.build": 1}
    assert walk["names"] == ["c", "cfg", "spec"]
    modules = tree_report.read_modules(root)
    module_wide = tree_report._bindings(modules["draftrl.cli.demo"], modules)
    assert module_wide["run_demo"] == ("draftrl.serve.demo", "run_demo")  # what the walk used to follow


def test_the_dynamic_walk_follows_identities_not_computed_values(tmp_path):
    root = _write(tmp_path, WALK)
    sys.path.insert(0, str(root))
    try:
        spec = importlib.util.spec_from_file_location("walk_demo", root / "draftrl" / "cli" / "demo.py")
        engines = importlib.util.spec_from_file_location("walk_engines", root / "draftrl" / "decoding" / "build.py")
        engines_module = importlib.util.module_from_spec(engines)
        engines.loader.exec_module(engines_module)
        demo_source = (root / "draftrl" / "cli" / "demo.py").read_text().replace(
            "from draftrl.decoding.build import use\n", "")
        demo = importlib.util.module_from_spec(spec)
        demo.use = engines_module.use
        sys.modules["walk_demo"] = demo
        exec(compile(demo_source, str(root / "draftrl" / "cli" / "demo.py"), "exec"), demo.__dict__)
        walk = tree_report.Walk(str(root / "draftrl") + "/")
        sys.settrace(walk.trace)
        try:
            demo.run()
        finally:
            sys.settrace(None)
    finally:
        sys.path.remove(str(root))
        sys.modules.pop("walk_demo", None)
    report = walk.report()
    assert walk.started
    every = report["all"]
    assert every["names"] == ["cfg", "env", "env_config", "spec"]  # not `n` (cfg.threads + 1), not the literal 0
    assert every["enters"] == {"draftrl.decoding.build": {"calls": 2, "call_sites": 2}}
    # use twice; build once: the first spec is 'other', a new value, the second the boxed target
    assert every["visits"] == 3
    objects = report["objects"]
    assert objects["visits"] == 2 and objects["names"] == ["cfg", "env", "env_config"]  # `spec` is a field value


def test_the_report_runs_on_this_tree(capsys):
    assert tree_report.main(["--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["graph"]["rooms"] >= 10 and report["graph"]["module_circles"] == []
    assert report["env_ids"] and report["grammars"]["drafter_kinds"] and report["grammars"]["policy_kinds"]
    assert report["folders"]["modules"] == sum(report["folders"]["per_folder"].values())
    walk = report["static_walk"]["strict"]
    assert "cfg" in walk["names"] and walk["rooms_entered_packages"] >= 3
    assert len(report["static_walk"]["broad"]["names"]) >= len(walk["names"])
    text = io.StringIO()
    tree_report.print_report(report, None, out=text)
    assert f"{report['graph']['rooms']} rooms on {report['graph']['floors']} floors" in text.getvalue()
    assert "# one parameter's walk" in text.getvalue()


@pytest.mark.slow
def test_the_dynamic_walk_of_the_quick_demo(tmp_path, capsys):
    """``--walk`` end to end: the quick demo on a tiny random Llama, about a minute on 2 cores."""
    assert tree_report.main(["--walk", "--workdir", str(tmp_path), "--json"]) == 0
    walk = json.loads(capsys.readouterr().out)["walk"]
    assert {"cfg", "config"} <= set(walk["objects"]["names"])
    assert walk["all"]["rooms_entered_packages"] >= walk["objects"]["rooms_entered_packages"] >= 5
