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
BASE: tuple[str, ...] = ("draftrl", "draftrl.config", "draftrl.io", "draftrl.deps", "draftrl.prompts", "draftrl.runs")
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
    assert _wrong_way({"draftrl.eval.demo": {"draftrl.cli.calibrate"}}) == ["draftrl.eval.demo -> draftrl.cli.calibrate"]
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
    entry = 'ENTRY = dict(entry_point="draftrl.eval.demo:DemoConfig")'
    assert _wrong_way({"draftrl.decoding.x": edges("draftrl.decoding.x", entry)}) == [
        "draftrl.decoding.x -> draftrl.eval.demo"]
    # a module that does not exist (any more) is still in its layer's package
    assert edges("draftrl.export.x", 'OLD = "draftrl.envs.features.FeatureBuilder"') == {"draftrl.envs"}
    # envs naming envs (draftrl/envs/ids.py) is legal; docstrings, prose, ids and metadata keys are not imports
    assert _wrong_way({"draftrl.envs.ids": edges("draftrl.envs.ids", 'E = "draftrl.envs.analytic:AnalyticEnv"')}) == []
    prose = '"""Made by draftrl.eval.demo."""\nMSG = "see draftrl.eval.demo for a demo"\nID = "draftrl/Analytic-v0"\n'
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
    assert "draftrl.eval.evaluate" in GRAPH["draftrl.cli.eval"]
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
        "spec = gym.spec('draftrl/SpecDecode-v1')\n"
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
