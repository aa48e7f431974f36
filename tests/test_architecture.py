"""The layering rule of docs/architecture.md, checked on every module's imports (top-level and lazy).

A module may import its own package, the base modules, and the packages its layer lists in
``MAY_IMPORT``; no chain of imports may lead back to where it started. Imports are read from
the source (``ast``), so an import inside a function counts as much as one at the top, and so
does a string that names a draftrl module (``"draftrl.envs:draftrl/Analytic-v0"`` for
``gym.make``, ``"draftrl.train.ppo_size"`` for ``importlib.import_module``, an entry point
``"draftrl.envs.analytic:AnalyticEnv"``): a string import is an import.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "draftrl"

#: Modules below everything: any layer may import them, they import only each other.
BASE: tuple[str, ...] = ("draftrl", "draftrl.config", "draftrl.io", "draftrl.deps", "draftrl.prompts", "draftrl.runs",
                         "draftrl.cluster")
#: Each layer (a subpackage of draftrl) and the layers it may import besides itself and the base.
MAY_IMPORT: dict[str, set[str]] = {
    "signals": set(),
    "models": set(),
    "drafters": {"models"},
    "decoding": {"models", "drafters"},
    "replay": {"signals", "models", "drafters", "decoding"},
    "envs": {"signals", "models", "drafters", "decoding", "replay"},
    "policies": {"signals", "decoding", "envs"},
    "export": {"signals", "models", "drafters", "decoding", "policies"},
    "train": {"signals", "models", "drafters", "decoding", "replay", "envs", "policies"},
    "distill": {"models", "drafters", "decoding"},
    "eval": {"signals", "models", "drafters", "decoding", "replay", "envs", "policies", "train"},
    "cli": {"signals", "models", "drafters", "decoding", "replay", "envs", "policies", "export", "train", "distill",
            "eval"},
    "__main__": {"cli"},
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


MODULES = _modules()


#: A string that names a draftrl module, alone or before ``:`` (an entry point, a gymnasium
#: ``module:id``); f-strings are read part by part (``f"draftrl.train.{recipe}"`` -> ``draftrl.train.``).
MODULE_STRING = re.compile(r"draftrl(?:\.\w+)*\.?(?::.*)?", re.DOTALL)


def _named_module(text: str) -> str | None:
    """The deepest draftrl module (or package) a string like ``MODULE_STRING`` names, else None."""
    if not MODULE_STRING.fullmatch(text.strip()):
        return None
    parts = text.strip().partition(":")[0].rstrip(".").split(".")
    return next(".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in MODULES)


def _docstrings(tree: ast.AST) -> set[int]:
    """``id`` of every docstring node (prose names modules without importing them)."""
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            found.add(id(body[0].value))
    return found


def _imports(name: str, path: Path) -> set[str]:
    """The draftrl modules ``name`` imports anywhere in its source (``from pkg import sub`` -> ``pkg.sub``),
    by an import statement or by a string that names a module (``_named_module``)."""
    return _imports_in(name, ast.parse(path.read_text()), is_package=path.name == "__init__.py")


def _imports_in(name: str, tree: ast.AST, is_package: bool = False) -> set[str]:
    """``_imports`` of a parsed module (a test can feed it a synthetic one)."""
    package = name if is_package else name.rpartition(".")[0]
    edges = set()
    docstrings = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            named = _named_module(node.value)
            if named is not None:
                edges.add(named)
        if isinstance(node, ast.Import):
            edges |= {a.name for a in node.names if a.name.split(".")[0] == "draftrl"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(parts + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "draftrl":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                edges.add(sub if sub in MODULES else target)
    return edges


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(module: str) -> str:
    """``base`` for the base modules, else the subpackage of draftrl the module belongs to."""
    if module == "draftrl" or any(module == b or module.startswith(b + ".") for b in BASE[1:]):
        return "base"
    return module.split(".")[1]


def test_every_module_belongs_to_a_known_layer():
    unknown = sorted({_layer(m) for m in MODULES} - set(MAY_IMPORT) - {"base"})
    assert not unknown, f"packages {unknown} have no place in MAY_IMPORT (and docs/architecture.md)"


def _wrong_way(graph: dict[str, set[str]]) -> list[str]:
    """``"module -> target"`` for every import ``MAY_IMPORT`` does not allow."""
    wrong = []
    for module, targets in graph.items():
        layer = _layer(module)
        allowed = {"base"} if layer == "base" else {"base", layer} | MAY_IMPORT[layer]
        wrong += [f"{module} -> {t}" for t in sorted(targets) if _layer(t) not in allowed]
    return wrong


def test_no_module_imports_from_a_layer_above_it():
    wrong = _wrong_way(GRAPH)
    assert not wrong, "imports against the layer order (docs/architecture.md):\n" + "\n".join(wrong)


def test_wrong_way_edges_are_caught():
    """Negative controls: the edges this redesign removed would fail the check."""
    assert (_wrong_way({"draftrl.eval.round.demo": {"draftrl.cli.calibrate"}})
            == ["draftrl.eval.round.demo -> draftrl.cli.calibrate"])
    assert _wrong_way({"draftrl.export.features": {"draftrl.replay.traces"}})  # export rebuilds features without replay
    assert _wrong_way({"draftrl.decoding.batch": {"draftrl.replay.serve_engine"}})  # replay sits above decoding
    assert _wrong_way({"draftrl.replay.traces": {"draftrl.envs.spec_decode"}})  # and below the envs
    assert _wrong_way({"draftrl.config.env": {"draftrl.models"}})
    assert _wrong_way({"draftrl.policies.baselines": {"draftrl.signals.speedup"}}) == []
    assert _wrong_way({"draftrl.drafters.ngram": {"draftrl.decoding.engine"}})  # drafters sit below the engine


def test_string_imports_are_edges():
    """Negative controls: a module named in a string is an import of that module, checked like one."""
    def edges(name: str, source: str) -> set[str]:
        return _imports_in(name, ast.parse(source))

    make = 'import gymnasium as gym\ndef rollout(env_id):\n    return gym.make(f"draftrl.envs:{env_id}")\n'
    assert edges("draftrl.export.engine_config", make) == {"draftrl.envs"}
    assert _wrong_way({"draftrl.export.engine_config": edges("draftrl.export.engine_config", make)}) == [
        "draftrl.export.engine_config -> draftrl.envs"]
    assert _wrong_way({"draftrl.export.x": edges("draftrl.export.x", 'E = "draftrl.envs:draftrl/Analytic-v0"')})
    lazy = 'import importlib\ndef load():\n    return importlib.import_module("draftrl.train.ppo_size")\n'
    assert _wrong_way({"draftrl.policies.x": edges("draftrl.policies.x", lazy)}) == [
        "draftrl.policies.x -> draftrl.train.ppo_size"]
    entry = 'ENTRY = dict(entry_point="draftrl.eval.round.demo:DemoConfig")'
    assert _wrong_way({"draftrl.decoding.x": edges("draftrl.decoding.x", entry)}) == [
        "draftrl.decoding.x -> draftrl.eval.round.demo"]
    # a module that does not exist (any more) is still in its layer's package
    assert edges("draftrl.export.x", 'OLD = "draftrl.envs.features.FeatureBuilder"') == {"draftrl.envs"}
    # envs naming envs (draftrl/envs/ids.py) is legal; docstrings, prose, ids and metadata keys are not imports
    assert _wrong_way({"draftrl.envs.ids": edges("draftrl.envs.ids", 'E = "draftrl.envs.analytic:AnalyticEnv"')}) == []
    prose = ('"""Made by draftrl.eval.round.demo."""\nMSG = "see draftrl.eval.round.demo for a demo"\n'
             'ID = "draftrl/Analytic-v0"\n')
    assert edges("draftrl.decoding.x", prose + 'KEY = "draftrl.manifest"') == {"draftrl"}
    assert "draftrl.envs.analytic" in GRAPH["draftrl.envs.ids"]


def test_no_import_cycles():
    """Tarjan's strongly connected components over the module graph: every one must be a single module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in GRAPH.get(node, ()):
            if nxt not in GRAPH:
                continue
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in GRAPH:
        if node not in index:
            visit(node)
    assert not cycles, f"import cycles: {cycles}"


def test_the_graph_sees_lazy_imports():
    """Negative control: an import inside a function is an edge (the CLI imports eval lazily)."""
    assert "draftrl.eval.round.compare" in GRAPH["draftrl.cli.eval"]
    assert _layer("draftrl.config.env") == "base" and _layer("draftrl.export.controller") == "export"


def _fresh(code: str) -> dict:
    """Run ``code`` in a fresh interpreter (repository on the path); it prints one JSON line."""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


HEAVY = ("torch", "gymnasium", "stable_baselines3", "transformers")


def test_controller_import_pulls_in_neither_gymnasium_nor_torch():
    loaded = _fresh(
        "import json, sys; import draftrl.export.controller; "
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    assert loaded == []
    # the control: importing the env package does load gymnasium, so the check can see it
    assert _fresh("import json, sys; import draftrl.envs; print(json.dumps('gymnasium' in sys.modules))")


def test_gym_make_in_a_fresh_interpreter_without_importing_draftrl():
    """gymnasium 1.x imports the module named before ``:`` and then finds the id it registered."""
    report = _fresh(
        "import json, sys; import gymnasium as gym\n"
        "before = 'draftrl' in sys.modules\n"
        "env = gym.make('draftrl.envs:draftrl/Analytic-v0', alpha=0.7, max_new_tokens=8)\n"
        "obs, info = env.reset(seed=0)\n"
        "spec = gym.spec('draftrl/SpecDecode-v2')\n"
        "print(json.dumps({'before': before, 'obs': len(obs), 'entry': spec.entry_point,"
        " 'torch': 'torch' in sys.modules}))"
    )
    assert report == {"before": False, "obs": 6, "entry": "draftrl.envs.spec_decode:SpecDecodeEnv", "torch": False}


def test_architecture_doc_lists_every_layer():
    text = (ROOT / "docs" / "architecture.md").read_text()
    missing = [layer for layer in MAY_IMPORT if layer != "__main__" and f"`{layer}`" not in text]
    assert not missing, f"docs/architecture.md does not name the layers {missing}"


@pytest.mark.parametrize("layer", sorted(set(MAY_IMPORT) - {"__main__"}))
def test_each_layer_has_modules(layer):
    assert any(_layer(m) == layer for m in MODULES), f"MAY_IMPORT names {layer}, which has no module"


# ----------------------------------------------------------------------------- envs/ holds environments only
#: Base classes that make a class an environment (a subscripted ``gym.Env[...]`` counts).
ENV_BASES = {"gym.Env", "gymnasium.Env", "Env", "gym.Wrapper", "gymnasium.Wrapper"}
ENVS_PACKAGE = "draftrl.envs"


def _env_classes(trees: dict[str, ast.AST]) -> set[tuple[str, str]]:
    """``(module, class)`` of every environment class in ``trees``: a base in ``ENV_BASES`` or, through
    draftrl classes, a base that is one (a fixpoint over the classes' base names)."""
    classes = {(name, node.name): {ast.unparse(b.value if isinstance(b, ast.Subscript) else b) for b in node.bases}
               for name, tree in trees.items() for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    envs: set[tuple[str, str]] = set()
    while True:
        names = {cls for _, cls in envs}
        found = {key for key, bases in classes.items()
                 if bases & ENV_BASES or {b.rpartition(".")[2] for b in bases} & names}
        if found == envs:
            return envs
        envs = found


def _not_envs(trees: dict[str, ast.AST]) -> list[str]:
    """Modules of ``draftrl.envs`` (not the package) that neither define an env class nor register ids."""
    defining = {module for module, _ in _env_classes(trees)}
    lonely = []
    for name, tree in trees.items():
        if name == ENVS_PACKAGE or name in defining:
            continue
        calls = {ast.unparse(n.func).rpartition(".")[2] for n in ast.walk(tree) if isinstance(n, ast.Call)}
        registers = bool(calls & {"register", "register_all"}) or any(
            isinstance(n, ast.keyword) and n.arg == "entry_point" for n in ast.walk(tree))
        if not registers:
            lonely.append(name)
    return sorted(lonely)


ENV_TREES = {name: ast.parse(path.read_text()) for name, path in MODULES.items()
             if name == ENVS_PACKAGE or name.startswith(ENVS_PACKAGE + ".")}


def test_every_envs_module_defines_or_registers_an_environment():
    lonely = _not_envs(ENV_TREES)
    assert not lonely, f"draftrl/envs/ holds environments only; {lonely} define none (move them to their layer)"


def test_a_module_without_an_env_is_reported():
    """Negative control: a helper module in envs/ is caught; a subscripted gym.Env base counts."""
    helper = ast.parse("def build_engine():\n    return None\n")
    env = ast.parse("import gymnasium as gym\nclass X(gym.Env[int, int]):\n    pass\nclass Y(X):\n    pass\n")
    assert _not_envs({**ENV_TREES, "draftrl.envs.helpers": helper}) == ["draftrl.envs.helpers"]
    assert _not_envs({"draftrl.envs.x": env}) == []
    assert _env_classes({"draftrl.envs.x": env}) == {("draftrl.envs.x", "X"), ("draftrl.envs.x", "Y")}


def _outside_uses(trees: dict[str, ast.AST], env_classes: set[tuple[str, str]]) -> list[str]:
    """``module -> envs.X.name`` for every name a module outside envs/ takes from it that is not an env
    class; ``import draftrl.envs`` (registration) and ``draftrl.envs.ids`` (the registry) are fine."""
    wrong = []
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or node.level or not (node.module or "").startswith(ENVS_PACKAGE):
                continue
            if node.module == f"{ENVS_PACKAGE}.ids":
                continue
            for alias in node.names:
                if node.module == ENVS_PACKAGE:  # from draftrl.envs import <module>: a module of envs, an env's
                    continue
                if (node.module, alias.name) not in env_classes:
                    wrong.append(f"{name} -> {node.module.removeprefix('draftrl.')}.{alias.name}")
    return sorted(wrong)


def _outside_trees() -> dict[str, ast.AST]:
    """Every module outside ``draftrl.envs``: the package's, ``benchmarks/*.py`` and ``tools/*.py``."""
    trees = {name: ast.parse(path.read_text()) for name, path in MODULES.items()
             if not (name == ENVS_PACKAGE or name.startswith(ENVS_PACKAGE + "."))}
    for folder in ("benchmarks", "tools"):
        for path in sorted((ROOT / folder).glob("*.py")):
            trees[f"{folder}.{path.stem}"] = ast.parse(path.read_text())
    return trees


def test_nothing_outside_envs_takes_anything_from_it_but_an_environment():
    wrong = _outside_uses(_outside_trees(), _env_classes(ENV_TREES))
    assert not wrong, "modules outside draftrl/envs/ import from it without making an env:\n" + "\n".join(wrong)


def test_a_non_env_name_taken_from_envs_is_reported():
    """Negative control: a mixin taken from envs is caught, the env class beside it is not."""
    classes = _env_classes(ENV_TREES)
    mixin = ast.parse("from draftrl.envs.spec_decode import SeededEpisodes, SpecDecodeEnv\n"
                      "from draftrl.envs.ids import ENVS\nimport draftrl.envs\n")
    assert _outside_uses({"draftrl.eval.x": mixin}, classes) == ["draftrl.eval.x -> envs.spec_decode.SeededEpisodes"]


def _id_pieces() -> set[str]:
    """Every run of capitalised words of a registered id's name, 4 characters or more
    (``TraceReplayDepth`` -> ``TraceReplay``, ``ReplayDepth``, ``Depth``, ...)."""
    from draftrl.envs.ids import ENVS

    pieces = set()
    for entry in ENVS:
        name = re.sub(r"-v\d+$", "", entry["id"].rpartition("/")[2])
        words = re.findall(r"[A-Z][a-z0-9]*", name)
        pieces |= {"".join(words[i:j]) for i in range(len(words)) for j in range(i + 1, len(words) + 1)}
    return {p for p in pieces if len(p) >= 4}


def _id_parsing(trees: dict[str, ast.AST], pieces: set[str]) -> list[str]:
    """``module:line pieces`` wherever a string constant that is a piece of an id's name is compared
    (``==``, ``!=``, ``in``), matched (``startswith``/``endswith``) or is every key of a dict."""
    found = set()
    for name, tree in trees.items():
        for node in ast.walk(tree):
            consts = []
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("startswith", "endswith"):
                for arg in node.args:
                    consts += arg.elts if isinstance(arg, ast.Tuple) else [arg]
            elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn, ast.Eq, ast.NotEq))
                                                       for op in node.ops):
                consts += [node.left, *node.comparators]
            elif isinstance(node, ast.Dict):
                keys = [k for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
                consts += keys if keys and all(k.value in pieces for k in keys) else []
            hits = sorted({c.value for c in consts if isinstance(c, ast.Constant) and c.value in pieces})
            if hits:
                found.add(f"{name}:{node.lineno} {', '.join(hits)}")
    return sorted(found)


def test_no_id_prefix_parsing_outside_the_registry():
    """What an id takes is its ``draftrl/envs/ids.py`` entry's (``section``, ``takes``, ``kwargs``), never
    read from its name: no module, benchmark or tool outside ids.py tests a piece of an id's name."""
    trees = {name: tree for name, tree in _outside_trees().items() if name != f"{ENVS_PACKAGE}.ids"}
    trees.update({name: tree for name, tree in ENV_TREES.items() if name != f"{ENVS_PACKAGE}.ids"})
    parsing = _id_parsing(trees, _id_pieces())
    assert not parsing, ("env arguments are read from id names outside draftrl/envs/ids.py "
                         "(register the id's section and takes there instead):\n" + "\n".join(parsing))


def test_id_prefix_parsing_is_reported():
    """Negative controls: a prefix test and a table keyed by id pieces are caught, a whole id is not."""
    pieces = _id_pieces()
    assert {"TraceReplay", "Depth", "Serve", "SpecDecode"} <= pieces
    prefix = ast.parse('def family(env_id):\n    return env_id.startswith("TraceReplay")\n')
    table = ast.parse('FAMILIES = {"SpecDecode": None, "Serve": "serve"}\n')
    whole = ast.parse('def is_replay(env_id):\n    return "draftrl/TraceReplay-v1" == env_id\n')
    assert _id_parsing({"draftrl.x.a": prefix}, pieces) == ["draftrl.x.a:2 TraceReplay"]
    assert _id_parsing({"draftrl.x.b": table}, pieces) == ["draftrl.x.b:1 Serve, SpecDecode"]
    assert _id_parsing({"draftrl.x.c": whole}, pieces) == []
    # the table and prefix tests this check retired (config/env_spec.py's FAMILIES and family) are caught
    substring = ast.parse('def depth(name):\n    return {"verify_size": 0} if "Depth" in name else {}\n')
    assert _id_parsing({"draftrl.train.x": substring}, pieces) == ["draftrl.train.x:2 Depth"]
    families = ast.parse('FAMILIES = {"SpecDecode": None, "TraceReplay": None, "Analytic": "analytic", '
                         '"Serve": "serve"}\nok = name.startswith(tuple(FAMILIES))\n')
    assert _id_parsing({"draftrl.train.y": families}, pieces) == [
        "draftrl.train.y:1 Analytic, Serve, SpecDecode, TraceReplay"]


# ----------------------------------------------------------------------------- one suffix for config classes
#: Suffixes a dataclass may not carry: a config class ends in ``Config`` (``GridConfig``, ``TrainEnvConfig``),
#: and a parsed value is named for what it is (``PolicyName``), so there is one word for each.
RETIRED_SUFFIXES = ("Settings", "Args", "Spec", "Section")


def _dataclasses(trees: dict[str, ast.AST]) -> set[tuple[str, str]]:
    """``(module, class)`` of every dataclass in ``trees``: decorated with ``dataclass`` (called or not,
    ``dataclasses.dataclass`` too) or, through draftrl classes, a subclass of one."""
    def decorated(node: ast.ClassDef) -> bool:
        names = {ast.unparse(d.func if isinstance(d, ast.Call) else d) for d in node.decorator_list}
        return bool({n.rpartition(".")[2] for n in names} & {"dataclass"})

    classes = {(name, node.name): (decorated(node), {ast.unparse(b).rpartition(".")[2] for b in node.bases})
               for name, tree in trees.items() for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    found = {key for key, (is_dc, _) in classes.items() if is_dc}
    while True:
        names = {cls for _, cls in found}
        more = found | {key for key, (_, bases) in classes.items() if bases & names}
        if more == found:
            return found
        found = more


def _retired_suffixes(trees: dict[str, ast.AST]) -> list[str]:
    """``module.Class`` of every dataclass whose name ends in a ``RETIRED_SUFFIXES`` suffix."""
    return sorted(f"{module}.{cls}" for module, cls in _dataclasses(trees) if cls.endswith(RETIRED_SUFFIXES))


PACKAGE_TREES = {name: ast.parse(path.read_text()) for name, path in MODULES.items()}


def test_config_classes_have_one_suffix():
    wrong = _retired_suffixes(PACKAGE_TREES)
    assert not wrong, (f"dataclasses named with a retired suffix ({', '.join(RETIRED_SUFFIXES)}): {wrong}; "
                       "a config class ends in Config, a parsed value is named for what it is (PolicyName)")


def test_a_retired_config_suffix_is_reported():
    """Negative controls: a decorated ``*Settings``, a ``*Spec`` that is a dataclass only through its
    base, and a called ``dataclasses.dataclass(frozen=True)`` are caught; a plain class is not."""
    source = ("import dataclasses\nfrom dataclasses import dataclass\n"
              "from draftrl.config.env import EnvConfig\n"
              "@dataclass\nclass FooSettings:\n    x: int = 0\n"
              "class BarSpec(EnvConfig):\n    pass\n"
              "@dataclasses.dataclass(frozen=True)\nclass BazArgs:\n    y: int = 0\n"
              "class NotDataSettings:\n    pass\n")
    trees = {**PACKAGE_TREES, "draftrl.x": ast.parse(source)}
    assert _retired_suffixes(trees) == ["draftrl.x.BarSpec", "draftrl.x.BazArgs", "draftrl.x.FooSettings"]
    assert ("draftrl.config.env", "EnvConfig") in _dataclasses(PACKAGE_TREES)


# ----------------------------------------------------------------------------- one home for the vLLM plug-ins
#: where every vLLM proposer lives; export/ supplies controllers (draftrl.decoding.vllm.control)
PROPOSERS_HOME = "draftrl.decoding.vllm"


def _misplaced_proposers(trees: dict[str, ast.AST]) -> list[str]:
    """``module.Class`` of every class named ``*Proposer`` outside ``PROPOSERS_HOME``."""
    return sorted(f"{name}.{node.name}" for name, tree in trees.items() for node in ast.walk(tree)
                  if isinstance(node, ast.ClassDef) and node.name.endswith("Proposer")
                  and not name.startswith(PROPOSERS_HOME + "."))


def test_every_proposer_lives_in_decoding_vllm():
    misplaced = _misplaced_proposers(PACKAGE_TREES)
    assert not misplaced, (f"proposers live in {PROPOSERS_HOME} and ask a controller; supply a controller from "
                           f"the other layers instead: {misplaced}")


def test_a_proposer_outside_decoding_vllm_is_reported():
    """Negative control: a proposer class defined in export/ is caught, the same class in decoding/vllm/ is not."""
    proposer = ast.parse("class FooProposer:\n    pass\n")
    assert _misplaced_proposers({"draftrl.export.x": proposer, "draftrl.decoding.vllm.y": proposer}) == [
        "draftrl.export.x.FooProposer"]


# ----------------------------------------------------------------------------- the two tracks of eval
#: The two tracks of evaluation (docs/architecture.md): the round track (one request, a
#: ``RoundEngine``) and the serve track (a batch under load, a ``ServingEngine``). Each imports the
#: shared ``draftrl.eval`` modules (metrics, bootstrap, report, ...); neither imports the other, and
#: the shared modules import neither, so a change to one track cannot reach the other.
TRACKS: tuple[str, ...] = ("draftrl.eval.round", "draftrl.eval.serve")


def _track(module: str) -> str | None:
    """The track ``module`` belongs to, None for a shared or non-eval module."""
    return next((t for t in TRACKS if module == t or module.startswith(t + ".")), None)


def _track_crossings(graph: dict[str, set[str]]) -> list[str]:
    """``"module -> target"`` for every import by an eval module into a track other than its own
    (a shared module has none of its own)."""
    return sorted(f"{module} -> {target}" for module, targets in graph.items()
                  if module == "draftrl.eval" or module.startswith("draftrl.eval.")
                  for target in targets if _track(target) not in (None, _track(module)))


def test_the_eval_tracks_do_not_import_each_other():
    assert {_track(m) for m in MODULES} >= set(TRACKS), "a track named in TRACKS has no module"
    crossings = _track_crossings(GRAPH)
    assert not crossings, (f"eval imports across its tracks: {crossings}; move what both tracks need to the "
                           "shared draftrl.eval modules")


def test_a_track_crossing_is_reported():
    """Negative controls: the serve track importing the round track (also lazily, by a function's
    import), and a shared module importing a track (``metrics`` reading ``RequestRun`` from the
    round rollout, as before the tracks were named) are reported; a track importing the shared
    modules, its own track, or the CLI importing both is not."""
    serve = ast.parse("def f():\n    from draftrl.eval.round.config import EvalConfig\n"
                      "from draftrl.eval.metrics import summarize_serving\nfrom draftrl.eval.serve import rollout\n")
    graph = {"draftrl.eval.serve.demo": _imports_in("draftrl.eval.serve.demo", serve),
             "draftrl.eval.metrics": {"draftrl.eval.round.rollout"},
             "draftrl.eval.round.grid": {"draftrl.eval.metrics", "draftrl.eval.round.rollout"},
             "draftrl.cli.eval": {"draftrl.eval.round.compare", "draftrl.eval.serve.compare"}}
    assert _track_crossings(graph) == ["draftrl.eval.metrics -> draftrl.eval.round.rollout",
                                       "draftrl.eval.serve.demo -> draftrl.eval.round.config"]


# ----------------------------------------------------------------------------- one rollout loop
def _env_steps(trees: dict[str, ast.AST], under: str) -> list[str]:
    """``module:line`` of every ``<...env>.step(...)`` call in the modules under ``under`` (an engine's
    ``step`` is not an env's)."""
    found = []
    for name, tree in trees.items():
        if not (name == under or name.startswith(under + ".")):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "step":
                owner = node.func.value
                owner_name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
                if owner_name.lower().endswith("env"):
                    found.append(f"{name}:{node.lineno}")
    return sorted(found)


def test_eval_rolls_policies_out_through_the_one_loop():
    """Both eval tracks roll a policy out with ``policies.evaluate.evaluate_policy`` (SB3's
    ``evaluate_policy``), passing hooks for what they record; none steps an env itself."""
    steps = _env_steps(PACKAGE_TREES, "draftrl.eval")
    assert not steps, f"eval steps envs itself at {steps}; call draftrl.policies.evaluate.evaluate_policy with on_round"
    assert _env_steps(PACKAGE_TREES, "draftrl.policies.evaluate")  # the loop itself is seen


def test_an_own_rollout_loop_is_reported():
    """Negative control: the serve rollout's loop before it called ``evaluate_policy`` is reported;
    an engine step is not."""
    old = ("def run_episode(env, policy, prompt_ids, seed=0):\n"
           "    obs, _ = env.reset(seed=seed, options={'prompt_ids': prompt_ids})\n"
           "    done = False\n"
           "    while not done:\n"
           "        obs, _, terminated, truncated, info = env.step(policy.to_action(*policy.act(obs)))\n"
           "        done = terminated or truncated\n"
           "def engine_only(engine):\n    return self.engine.step(None)\n")
    assert _env_steps({"draftrl.eval.serve.x": ast.parse(old)}, "draftrl.eval") == ["draftrl.eval.serve.x:5"]
