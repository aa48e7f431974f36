"""What a newcomer meets in the tree, counted the same way before and after a redesign (issue 42).

    python tools/tree_report.py                    # the static counts of this checkout
    python tools/tree_report.py --root /work/main  # of another checkout
    python tools/tree_report.py --walk             # and one parameter's walk through `draftrl demo`
    python tools/tree_report.py --walk --json      # everything as one JSON object

Static counts read the source with ``ast`` (nothing is imported, stdlib only); ``--walk`` runs
``draftrl demo --quick`` on a tiny random Llama (about a minute on 2 CPU cores) under
``sys.settrace``. Each count, precisely:

modules per folder
    ``.py`` files under ``draftrl/<package>/`` other than ``__init__.py``; a subpackage counts in its
    top package and is listed again on its own line (``decoding/vllm``). ``median lines``: over every
    ``.py`` file of ``draftrl/``, ``__init__.py`` included, newlines counted.
rooms, arrows, floors, circles
    A room is the root package ``draftrl``, each top-level module (``draftrl.io``, ``draftrl.__main__``,
    ...) and each package or subpackage (``draftrl.decoding``, ``draftrl.decoding.vllm``); a module
    lives in the room of its folder. Imports are read as ``tests/test_architecture.py`` reads them:
    import statements anywhere (lazy ones too, relative ones resolved) and any non-docstring string
    that names a draftrl module (``"draftrl.envs:draftrl/X-v0"``, ``f"draftrl.train.{recipe}"``).
    An arrow is an ordered pair of different rooms with at least one import from the first to the
    second. Floors: the rooms on the longest chain of arrows, rooms that import each other (a
    package and its own subpackage) folded into one floor first. Circles: import cycles between
    modules (strongly connected sets of more than one module); the folded room pairs are listed.
envs/ and what imports it
    An env class is a class whose bases reach ``gym.Env`` / ``gymnasium.Env`` (through draftrl
    classes). A module of ``draftrl/envs/`` *holds an environment* when it defines an env class or
    registers ids (``register``/``register_all`` calls, ``entry_point=`` ids); the others are listed.
    Outside ``envs/`` (``draftrl/``, ``benchmarks/``, ``tools/``), an import *wants an environment*
    when it imports the package ``draftrl.envs``, an env class, or an env module as a module; every
    other name taken from ``draftrl.envs.*`` is counted as imported "without wanting an environment".
env ids
    the ``id=`` of every ``dict(id=..., entry_point=...)`` / ``register(id=...)`` under ``draftrl/``.
id-prefix parsing
    outside ``draftrl/envs/ids.py``: a ``str.startswith``/``endswith`` call, or an ``in``/``==``/``!=``
    comparison, with a string constant that is a piece of a registered id's name (the part between
    ``draftrl/`` and ``-vN``, or a capitalised word of it such as ``Depth``; at least 4 characters).
engines and engine protocols
    a class under ``draftrl/`` with a ``round`` method (a round engine) or with both ``add_request``
    and ``step`` (a serving engine), methods inherited from draftrl classes included; ``typing.Protocol``
    classes and env classes are not engines. Protocols: the two contracts (round, serving) that have
    an engine, with the ``typing.Protocol`` class that spells each out, if any.
config dataclasses
    ``@dataclass`` classes (or subclasses of one) whose name ends with ``Config``, ``Settings``,
    ``Args`` or ``Spec``, by suffix; other dataclass names ending in ``Params``/``Options``/``Context``
    are listed beside them.
string grammars
    drafter kinds: the keys of the ``DRAFTERS`` dict (``drafters/registry.py``); policy kinds: the keys
    of the ``FORMS`` dict (``eval/policy_names.py``) and the forms they write (``ngram:K|S-E:K,...`` is
    two); the kind names both grammars use; whether a policy ``fixed`` form documents two meanings.
proposers
    classes under ``draftrl/`` whose name ends with ``Proposer``.
repeated file names
    module file names (not ``__init__.py``) found in more than one folder of ``draftrl/``; again
    without ``cli/``, whose command modules are named after their command on purpose.
words
    files under ``draftrl/``, ``docs/``, ``benchmarks/`` whose text contains each word (case-folded):
    ``simulator``/``replay`` and the upper-bound words ``lookahead`` (or ``look-ahead``),
    ``hindsight``, ``best static``, ``oracle``; track prefixes: module files starting with
    ``serve_``, ``serving``, ``vllm_``, ``dsd_``; evaluation entry points: modules named
    ``evaluate``/``evaluation``/``rollout``.

one parameter's walk through ``draftrl demo``
    The parameter is the ``DemoConfig`` that ``draftrl demo`` builds: born in
    ``draftrl/cli/demo.py:run`` as ``cfg = config(args)`` and handed to ``draftrl/eval/round/demo.py:run_demo``
    (``--start`` / ``--birth`` name another birth place after a redesign). It is followed two ways.

    *Static* (always printed; the source only, as ``tests/test_architecture.py`` reads it): a
    worklist over functions from the birth place. In each function, a name is *tainted* once
    something tainted is assigned to it (assignment, ``for``, ``with ... as``, comprehension, walrus;
    flow-insensitive), ``self.X`` included. A call whose arguments carry a tainted value is resolved
    to draftrl functions (a local or imported function; a class's ``__init__``/``__post_init__``;
    ``self.method``; ``module.function``; ``importlib.import_module(f"draftrl.train.{x}").train``
    to every module that matches) and the parameters it binds (positional, keyword, ``*``/``**``)
    are tainted there. *strict*: a value carries the config only when it is a part or copy of it
    (a tainted name, ``cfg.env.depths``, ``cfg or x``, a tuple/list/dict holding one, ``replace``/
    ``to_dict``/``from_dict``/``load_config``/``resolve``/``copy``/a ``*Config(...)`` constructor of
    one, or a draftrl function whose ``return`` is such a value of its tainted parameters); *broad*:
    any expression that mentions a tainted name (computed values too). Counted: functions reached,
    rooms entered (their modules and packages), moves (distinct call sites from one module into
    another; distinct package pairs), ``enters M`` (call sites into module M), names (the distinct
    tainted parameter and variable names, ``self``/``cls`` and attributes left out). Calls the
    source does not name (``gymnasium.make``, SB3 callbacks, methods of objects of unknown type)
    are not followed.

    *Dynamic* (``--walk``): ``draftrl demo --quick --target TINY --kernels stock`` runs in this
    process under ``sys.settrace`` (``--full``: the default demo, about 7x longer). When the birth
    function (``draftrl/cli/demo.py:config``) returns, the config's fields are re-boxed in place:
    every ``str``/``int``/``float`` becomes an equal instance of a private subclass and every tuple a
    private tuple subclass, so the values keep an identity of their own wherever they are passed
    (``bool`` and ``None`` cannot be followed). A *carrier* is then: such a boxed value (copies
    included: ``deepcopy`` keeps the class), the config itself, and any config dataclass (suffixes
    above), ``dict``, ``list`` or ``tuple`` that holds a carrier (looked up to three levels deep, 64
    items per container): what is derived from the config without computing a new value
    (``dataclasses.replace(config.env, ...)``, ``to_dict``, ``EngineConfig(temperature=
    config.temperature, ...)``). A value computed from a carrier (``x + 1``, ``s.split()``) is new.
    A *visit* is a call of a function defined under ``draftrl/`` that receives a carrier as an
    argument other than ``self``/``cls`` (a config's own methods and properties are the object at
    home, not a walk). Its *room* is its module and its package. A *move* is a visit whose module
    differs from the module of the nearest draftrl frame that called it (library frames such as
    ``gymnasium.make`` or SB3 in between are skipped); ``enters M`` counts the moves into module M,
    as calls and as distinct call sites (caller ``module:line`` -> callee). *Names*: the distinct
    parameter names (at visits) and local variable names (at the return of any draftrl frame) bound
    to a carrier, ``self``/``cls`` and comprehension slots left out; attribute names of other
    objects that hold a carrier (``SpecDecodeEnv.config``) are counted apart. Two tallies: *objects*
    (visits carrying the config or a section of it) and *all* (field values too).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import statistics
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: The walk's birth place: (module, function, the name the config is born as there) for the static
#: walk; (file, function that returns the config) for the dynamic one.
STATIC_START = ("draftrl.cli.demo", "run", "cfg")
DYNAMIC_START = ("draftrl/cli/demo.py", "config")
#: Modules whose entries the walk lists call site by call site (the issue's example).
WATCHED = ("draftrl.decoding.build",)
CONFIG_SUFFIXES = ("Config", "Settings", "Args", "Spec")
OTHER_SUFFIXES = ("Params", "Options", "Context")
WORDS = {"simulator": ("simulator",), "replay": ("replay",), "lookahead": ("lookahead", "look-ahead"),
         "hindsight": ("hindsight",), "best static": ("best static", "best-static"), "oracle": ("oracle",)}
TRACK_PREFIXES = ("serve_", "serving", "vllm_", "dsd_")
EVALUATION_MODULES = ("evaluate", "evaluation", "rollout")
REGISTER_CALLS = ("register", "register_all")


# ----------------------------------------------------------------------------- reading the source

@dataclass
class Module:
    name: str
    """dotted name, ``draftrl.decoding.build`` (a package: ``draftrl.decoding``)"""
    path: Path
    tree: ast.Module
    lines: int
    is_package: bool

    @property
    def room(self) -> str:
        """The module's room: its folder's package, or itself for a top-level module."""
        if self.is_package:
            return self.name
        parent = self.name.rpartition(".")[0]
        return self.name if parent == "draftrl" else parent


def read_modules(root: Path, folder: str = "draftrl") -> dict[str, Module]:
    found = {}
    for path in sorted((root / folder).rglob("*.py")):
        text = path.read_text()
        name = ".".join(path.relative_to(root).with_suffix("").parts)
        is_package = path.name == "__init__.py"
        name = name.removesuffix(".__init__")
        found[name] = Module(name, path, ast.parse(text), text.count("\n"), is_package)
    return found


MODULE_STRING = re.compile(r"draftrl(?:\.\w+)*\.?(?::.*)?", re.DOTALL)


def _docstring_ids(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            ids.add(id(body[0].value))
    return ids


def _named_module(text: str, modules: dict) -> str | None:
    if not MODULE_STRING.fullmatch(text.strip()):
        return None
    parts = text.strip().partition(":")[0].rstrip(".").split(".")
    return next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in modules), None)


def _import_target(node: ast.ImportFrom, package: str) -> str:
    """The module a ``from ... import`` reads, relative ones resolved against ``package``."""
    if not node.level:
        return node.module or ""
    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(parts + ([node.module] if node.module else []))


def import_edges(mod: Module, modules: dict[str, Module]) -> list[tuple[str, list[str]]]:
    """``(imported draftrl module, names taken from it)`` for every import of ``mod`` (statements
    anywhere, relative ones resolved, strings that name a module: names ``[]``)."""
    package = mod.name if mod.is_package else mod.name.rpartition(".")[0]
    docstrings = _docstring_ids(mod.tree)
    edges = []
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            named = _named_module(node.value, modules)
            if named:
                edges.append((named, []))
        elif isinstance(node, ast.Import):
            edges += [(_deepest(a.name, modules), []) for a in node.names if a.name.split(".")[0] == "draftrl"]
        elif isinstance(node, ast.ImportFrom):
            target = _import_target(node, package)
            if target.split(".")[0] != "draftrl":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                edges.append((sub, []) if sub in modules else (_deepest(target, modules), [alias.name]))
    return [(t, names) for t, names in edges if t in modules]


def _deepest(name: str, modules: dict) -> str:
    parts = name.split(".")
    return next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in modules), name)


# ----------------------------------------------------------------------------- classes

@dataclass
class ClassInfo:
    name: str
    module: str
    bases: list[str]
    """base expressions as written (``gym.Env``, ``EnvConfig``)"""
    methods: set[str]
    is_dataclass: bool
    lineno: int
    resolved: list[ClassInfo] = field(default_factory=list)


def read_classes(modules: dict[str, Module]) -> list[ClassInfo]:
    classes = []
    for mod in modules.values():
        for node in ast.walk(mod.tree):
            if isinstance(node, ast.ClassDef):
                decorators = {ast.unparse(d).split("(")[0] for d in node.decorator_list}
                methods = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
                bases = [ast.unparse(b.value if isinstance(b, ast.Subscript) else b) for b in node.bases]
                classes.append(ClassInfo(node.name, mod.name, bases, methods,
                                         bool(decorators & {"dataclass", "dataclasses.dataclass"}), node.lineno))
    by_name = defaultdict(list)
    for c in classes:
        by_name[c.name].append(c)
    for c in classes:
        for base in c.bases:
            short = base.rpartition(".")[2]
            candidates = [b for b in by_name.get(short, []) if b is not c]
            same = [b for b in candidates if b.module == c.module]
            if same or candidates:
                c.resolved.append((same or candidates)[0])
    return classes


def _ancestors(c: ClassInfo, seen=None) -> list[ClassInfo]:
    seen = seen if seen is not None else set()
    out = []
    for b in c.resolved:
        if id(b) not in seen:
            seen.add(id(b))
            out += [b, *_ancestors(b, seen)]
    return out


def _base_texts(c: ClassInfo) -> set[str]:
    return set(c.bases).union(*(set(a.bases) for a in _ancestors(c)))


def is_env_class(c: ClassInfo) -> bool:
    return bool(_base_texts(c) & {"gym.Env", "gymnasium.Env", "Env", "gym.Wrapper", "gymnasium.Wrapper"})


def is_protocol(c: ClassInfo) -> bool:
    return bool(set(c.bases) & {"Protocol", "typing.Protocol"})


def is_dataclass_like(c: ClassInfo) -> bool:
    return c.is_dataclass or any(a.is_dataclass for a in _ancestors(c))


def all_methods(c: ClassInfo) -> set[str]:
    return set(c.methods).union(*(a.methods for a in _ancestors(c)))


# ----------------------------------------------------------------------------- the report

def _scc(nodes: list[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                elif nxt in on:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    member = stack.pop()
                    on.discard(member)
                    comp.append(member)
                    if member == node:
                        break
                out.append(sorted(comp))
    return out


def graph_report(modules: dict[str, Module]) -> dict:
    module_edges = {name: {t for t, _ in import_edges(m, modules)} - {name} for name, m in modules.items()}
    rooms = sorted({m.room for m in modules.values()})
    arrows = sorted({(modules[a].room, modules[b].room) for a, ts in module_edges.items() for b in ts
                     if modules[a].room != modules[b].room})
    room_edges = defaultdict(set)
    for a, b in arrows:
        room_edges[a].add(b)
    comps = _scc(rooms, room_edges)
    comp_of = {r: i for i, comp in enumerate(comps) for r in comp}
    cedges = defaultdict(set)
    for a, b in arrows:
        if comp_of[a] != comp_of[b]:
            cedges[comp_of[a]].add(comp_of[b])
    height: dict[int, int] = {}

    def h(c: int) -> int:  # components come out of Tarjan in reverse topological order
        return height[c]

    for i in range(len(comps)):
        height[i] = 1 + max((h(j) for j in cedges[i]), default=0)
    floors = max(height.values(), default=0)
    by_floor = defaultdict(list)
    for i, comp in enumerate(comps):
        by_floor[height[i]] += comp
    circles = [c for c in _scc(sorted(module_edges), module_edges) if len(c) > 1]
    return {"rooms": len(rooms), "arrows": len(arrows), "floors": floors, "module_circles": circles,
            "folded_rooms": [c for c in comps if len(c) > 1],
            "rooms_by_floor": {f: sorted(by_floor[f]) for f in sorted(by_floor)}, "module_edges": module_edges}


def folder_report(modules: dict[str, Module]) -> dict:
    per_top, per_sub = Counter(), Counter()
    for m in modules.values():
        parts = m.name.split(".")
        if m.is_package or len(parts) < 3:
            if m.is_package and len(parts) >= 2:
                per_top.setdefault(parts[1], 0)
            continue
        per_top[parts[1]] += 1
        if len(parts) > 3:
            per_sub["/".join(parts[1:-1])] += 1
    top_level = sorted(m.name for m in modules.values() if not m.is_package and m.name.count(".") == 1)
    return {"modules": sum(per_top.values()), "top_level_modules": top_level,
            "per_folder": dict(sorted(per_top.items())), "per_subfolder": dict(sorted(per_sub.items())),
            "median_lines": statistics.median(m.lines for m in modules.values()),
            "files": len(modules), "lines": sum(m.lines for m in modules.values())}


def env_ids(modules: dict[str, Module]) -> list[dict]:
    ids = []
    for m in modules.values():
        for node in ast.walk(m.tree):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("dict", "register", "gym.register",
                                                                      "gymnasium.register"):
                kw = {k.arg: k.value for k in node.keywords if k.arg}
                if isinstance(kw.get("id"), ast.Constant) and isinstance(kw.get("entry_point"), ast.Constant):
                    ids.append({"id": kw["id"].value, "entry_point": kw["entry_point"].value, "module": m.name})
    return sorted(ids, key=lambda d: d["id"])


def _id_pieces(ids: list[dict]) -> set[str]:
    pieces = set()
    for d in ids:
        name = re.sub(r"-v\d+$", "", d["id"].rpartition("/")[2])
        words = re.findall(r"[A-Z][a-z0-9]*", name)
        pieces.add(name)
        for i in range(len(words)):
            for j in range(i + 1, len(words) + 1):
                pieces.add("".join(words[i:j]))
    return {p for p in pieces if len(p) >= 4}


def _relative(m: Module) -> str:
    """``draftrl/envs/ids.py`` for ``draftrl.envs.ids``."""
    return str(m.path.relative_to(m.path.parents[len(m.name.split(".")) - (0 if m.is_package else 1)]))


def id_prefix_parsing(modules: dict[str, Module], ids: list[dict], allowed: str = "draftrl.envs.ids") -> list[str]:
    pieces = _id_pieces(ids)
    found = []
    for m in modules.values():
        if m.name == allowed:
            continue
        for node in ast.walk(m.tree):
            consts = []
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("startswith", "endswith"):
                for arg in node.args:
                    consts += [a for a in (arg.elts if isinstance(arg, ast.Tuple) else [arg])
                               if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn, ast.Eq, ast.NotEq))
                                                       for op in node.ops):
                consts += [a for a in (node.left, *node.comparators)
                           if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            elif isinstance(node, ast.Dict):  # a table keyed by id pieces (FAMILIES = {"SpecDecode": ...})
                keys = [k for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
                if keys and all(k.value in pieces for k in keys):
                    consts += keys
            hits = sorted({c.value for c in consts if c.value in pieces})
            if hits:
                found.append(f"{_relative(m)}:{node.lineno} {', '.join(hits)}")
    return sorted(set(found))


def envs_report(modules: dict[str, Module], classes: list[ClassInfo], root: Path) -> dict:
    env_classes = {(c.module, c.name) for c in classes if is_env_class(c)}
    holds = {}
    for m in modules.values():
        if not m.name.startswith("draftrl.envs.") or m.is_package:
            continue
        defines = any(mod == m.name for mod, _ in env_classes)
        registers = any(isinstance(n, ast.Call) and ast.unparse(n.func).rpartition(".")[2] in REGISTER_CALLS
                        for n in ast.walk(m.tree)) or any(
            isinstance(n, ast.keyword) and n.arg == "entry_point" for n in ast.walk(m.tree))
        holds[m.name] = "defines" if defines else "registers" if registers else ""
    outside = {**{k: v for k, v in modules.items() if not k.startswith("draftrl.envs")},
               **{k: v for k, v in _extra_modules(root, modules).items()}}
    unwanted = defaultdict(set)
    for name, m in outside.items():
        for target, names in import_edges(m, {**modules, **outside}):
            if not target.startswith("draftrl.envs."):
                continue
            env_names = {n for mod, n in env_classes if mod == target}
            if not names:  # a module imported as a module, or named in a string
                if not holds.get(target, True):
                    unwanted[name].add(target.removeprefix("draftrl.envs."))
                continue
            for n in names:
                if n not in env_names:
                    unwanted[name].add(f"{target.removeprefix('draftrl.envs.')}.{n}")
    by_folder = Counter(k.split(".")[0] if not k.startswith("draftrl.") else k.split(".")[1] for k in unwanted)
    return {"modules": len(holds), "defining_envs": sorted(k for k, v in holds.items() if v == "defines"),
            "registering_envs": sorted(k for k, v in holds.items() if v == "registers"),
            "not_envs": sorted(k for k, v in holds.items() if not v),
            "env_classes": sorted(f"{mod}.{n}" for mod, n in env_classes),
            "imported_without_an_env": {k: sorted(v) for k, v in sorted(unwanted.items())},
            "importers_by_folder": dict(sorted(by_folder.items()))}


def _extra_modules(root: Path, modules: dict[str, Module]) -> dict[str, Module]:
    """``benchmarks/*.py`` and ``tools/*.py`` read as modules named ``benchmarks.x``, ``tools.x``."""
    extra = {}
    for folder in ("benchmarks", "tools"):
        if (root / folder).is_dir():
            extra.update(read_modules(root, folder))
    return {k: m for k, m in extra.items() if m.path.name != Path(__file__).name}  # it names modules, imports none


def engines_report(classes: list[ClassInfo]) -> dict:
    engines = defaultdict(list)
    protocols = {}
    for c in classes:
        methods = all_methods(c)
        if is_protocol(c):
            if "round" in methods:
                protocols["round"] = f"{c.module}.{c.name}"
            if {"add_request", "step"} <= methods:
                protocols["serving"] = f"{c.module}.{c.name}"
            continue
        if is_env_class(c) or c.name.startswith("_"):
            continue
        if "round" in methods:
            engines["round"].append(f"{c.module}.{c.name}")
        elif {"add_request", "step"} <= methods and not c.name.startswith(("Queued", "Base")):
            engines["serving"].append(f"{c.module}.{c.name}")
    return {"engines": {k: sorted(v) for k, v in sorted(engines.items())},
            "count": sum(len(v) for v in engines.values()),
            "protocols": {k: protocols.get(k) for k in sorted(engines)}}


def configs_report(classes: list[ClassInfo]) -> dict:
    by_suffix = defaultdict(list)
    others = []
    for c in classes:
        if not is_dataclass_like(c):
            continue
        suffix = next((s for s in CONFIG_SUFFIXES if c.name.endswith(s)), None)
        if suffix:
            by_suffix[suffix].append(c.name)
        elif c.name.endswith(OTHER_SUFFIXES):
            others.append(c.name)
    return {"count": sum(len(v) for v in by_suffix.values()), "suffixes": len(by_suffix),
            "by_suffix": {s: sorted(by_suffix[s]) for s in CONFIG_SUFFIXES if s in by_suffix},
            "other_suffixes": sorted(others)}


def _dict_keys(modules: dict[str, Module], name: str) -> tuple[str | None, dict[str, str]]:
    """The string keys (and string values, where they are constants) of a module-level dict ``name``."""
    for m in modules.values():
        for node in m.tree.body:
            target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
                node.target if isinstance(node, ast.AnnAssign) else None
            if isinstance(target, ast.Name) and target.id == name and isinstance(node.value, ast.Dict):
                return m.name, {k.value: (v.value if isinstance(v, ast.Constant) else ast.unparse(v))
                                for k, v in zip(node.value.keys, node.value.values, strict=True)
                                if isinstance(k, ast.Constant)}
    return None, {}


def _alternatives(form: str) -> list[str]:
    """``"ngram:K|S-E:K,..."`` -> two forms; a ``|`` inside brackets (``[:tT|:cT]``) is one form's option."""
    parts, depth, current = [], 0, ""
    for ch in form:
        depth += (ch == "[") - (ch == "]")
        if ch == "|" and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    return [*parts, current]


def grammars_report(modules: dict[str, Module]) -> dict:
    drafters_at, drafters = _dict_keys(modules, "DRAFTERS")
    policies_at, forms = _dict_keys(modules, "FORMS")
    policy_forms = [alt for form in forms.values() for alt in _alternatives(str(form).split(" ")[0])]
    fixed = str(forms.get("fixed", ""))
    doc = ast.get_docstring(modules[policies_at].tree) if policies_at else ""
    fixed_two_meanings = bool(doc and re.search(r"verify size.*budget|budget.*verify size", doc, re.DOTALL)
                              and "fixed" in doc)
    return {"drafter_kinds": sorted(drafters), "drafters_at": drafters_at,
            "policy_kinds": sorted(forms), "policy_forms": len(policy_forms), "policies_at": policies_at,
            "shared_kind_names": sorted(set(drafters) & set(forms)),
            "fixed_form": fixed, "fixed_V_two_meanings": fixed_two_meanings}


def words_report(root: Path, modules: dict[str, Module]) -> dict:
    files = [p for folder in ("draftrl", "docs", "benchmarks") if (root / folder).is_dir()
             for p in sorted((root / folder).rglob("*")) if p.is_file() and p.suffix in (".py", ".md", ".yaml", ".sh")]
    texts = {p: p.read_text(errors="replace").lower() for p in files}
    words = {w: sum(any(s in t for s in spellings) for t in texts.values()) for w, spellings in WORDS.items()}
    both = sum(("simulator" in t and "replay" in t) for t in texts.values())
    names = [m for m in modules.values() if not m.is_package]
    prefixed = {p: sorted(m.name for m in names if m.name.rpartition(".")[2].startswith(p)) for p in TRACK_PREFIXES}
    evaluation = sorted(m.name for m in names if m.name.rpartition(".")[2] in EVALUATION_MODULES)
    doc = root / "docs" / "architecture.md"
    paths = re.findall(r"`((?:draftrl/)?(?:\w+/)+\w+\.py)`", doc.read_text()) if doc.exists() else []
    cited = sorted({f for f in paths if not (root / f).exists() and not (root / "draftrl" / f).exists()})
    return {"files_read": len(files), "files_with": words, "files_with_simulator_and_replay": both,
            "track_prefixed_modules": prefixed, "evaluation_modules": evaluation,
            "architecture_md_cites_missing": cited}


def repeated_names(modules: dict[str, Module]) -> dict:
    folders = defaultdict(set)
    for m in modules.values():
        if not m.is_package and m.name.count(".") >= 2:
            folders[m.path.name].add(str(m.path.parent.relative_to(m.path.parents[m.name.count(".")])))
    everywhere = {n: sorted(f) for n, f in sorted(folders.items()) if len(f) > 1}
    no_cli = {n: [x for x in f if x != "draftrl/cli"] for n, f in everywhere.items()}
    return {"count": len(everywhere), "names": everywhere,
            "count_without_cli": sum(len(f) > 1 for f in no_cli.values())}


def proposers_report(classes: list[ClassInfo]) -> list[str]:
    return sorted(f"{c.module}.{c.name}" for c in classes if c.name.endswith("Proposer"))


def static_report(root: Path, start: tuple[str, str, str] = STATIC_START) -> dict:
    modules = read_modules(root)
    classes = read_classes(modules)
    ids = env_ids(modules)
    graph = graph_report(modules)
    graph.pop("module_edges")
    walks = {kind: static_walk(root, start, strict=kind == "strict", modules=modules) for kind in ("strict", "broad")}
    return {"root": str(root), "static_walk": walks, "folders": folder_report(modules), "graph": graph,
            "envs": envs_report(modules, classes, root), "env_ids": [d["id"] for d in ids],
            "id_prefix_parsing": id_prefix_parsing(modules, ids), "engines": engines_report(classes),
            "configs": configs_report(classes), "grammars": grammars_report(modules),
            "proposers": proposers_report(classes), "repeated_file_names": repeated_names(modules),
            "words": words_report(root, modules)}


# ----------------------------------------------------------------------------- the static walk

@dataclass(eq=False)
class Function:
    module: str
    qualname: str
    node: ast.FunctionDef | ast.AsyncFunctionDef
    cls: str | None
    """the class a method is defined in (its name), else None"""

    @property
    def params(self) -> list[str]:
        a = self.node.args
        names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
        return names + [p.arg for p in (a.vararg, a.kwarg) if p is not None]

    @property
    def positional(self) -> list[str]:
        a = self.node.args
        return [p.arg for p in (*a.posonlyargs, *a.args)]


def _functions(modules: dict[str, Module]) -> dict[tuple[str, str], Function]:
    found = {}

    def visit(mod: str, body: list, prefix: str, cls: str | None) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                qual = f"{prefix}{node.name}"
                found[(mod, qual)] = Function(mod, qual, node, cls)
                visit(mod, node.body, f"{qual}.<locals>.", None)
            elif isinstance(node, ast.ClassDef):
                visit(mod, node.body, f"{prefix}{node.name}.", node.name)
    for name, m in modules.items():
        visit(name, m.tree.body, "", None)
    return found


def _bindings(mod: Module, modules: dict[str, Module],
              scope: ast.AST | None = None) -> dict[str, tuple[str, str | None]]:
    """Local name -> (draftrl module, attribute or None for the module itself), from every import of
    ``mod``, or only from those inside ``scope`` (a function: its own imports win over the module's,
    where two functions import one name from two places, as ``cli/demo.py``'s two ``run_demo``)."""
    package = mod.name if mod.is_package else mod.name.rpartition(".")[0]
    out = {}
    for node in ast.walk(scope if scope is not None else mod.tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("draftrl") and a.asname:
                    out[a.asname] = (a.name, None)
        elif isinstance(node, ast.ImportFrom):
            target = _import_target(node, package)
            if not target.startswith("draftrl"):
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                out[a.asname or a.name] = (sub, None) if sub in modules else (target, a.name)
    return out


def _mentions(expr: ast.AST | None, tainted: set[str]) -> bool:
    """Whether ``expr`` reads a tainted name (``config``, ``config.env.depths``, ``self.config``)."""
    if expr is None:
        return False
    for node in ast.walk(expr):
        if isinstance(node, ast.Name) and node.id in tainted:
            return True
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self" \
                and f"self.{node.attr}" in tainted:
            return True
    return False


#: Calls that derive a config from a config without computing a value (a copy, a section, a typed load).
DERIVING_CALLS = re.compile(r"(^|\.)(replace|to_dict|from_dict|load_config|resolve|deepcopy|copy)$|"
                            r"^[A-Z]\w*(Config|Settings|Args|Spec)$")


def _derives(expr: ast.AST | None, tainted: set[str], returns_config=None) -> bool:
    """Whether ``expr`` IS the config or a part or copy of it (``config``, ``config.env.depths``,
    ``cfg or default``, ``(config.env, x)``, ``dataclasses.replace(config.env, ...)``), not a value
    computed from it (``max(config.depths) + 1``): the strict reading of the static walk."""
    if expr is None:
        return False
    if isinstance(expr, ast.Name):
        return expr.id in tainted
    if isinstance(expr, (ast.Attribute, ast.Subscript)):
        root = expr
        while isinstance(root, (ast.Attribute, ast.Subscript)):
            if isinstance(root, ast.Attribute) and isinstance(root.value, ast.Name) and root.value.id == "self" \
                    and f"self.{root.attr}" in tainted:
                return True
            root = root.value
        return isinstance(root, ast.Name) and root.id in tainted
    if isinstance(expr, (ast.Starred, ast.keyword)):
        return _derives(expr.value, tainted, returns_config)
    if isinstance(expr, ast.BoolOp):
        return any(_derives(v, tainted, returns_config) for v in expr.values)
    if isinstance(expr, ast.IfExp):
        return _derives(expr.body, tainted, returns_config) or _derives(expr.orelse, tainted, returns_config)
    if isinstance(expr, (ast.Tuple, ast.List, ast.Set)):
        return any(_derives(v, tainted, returns_config) for v in expr.elts)
    if isinstance(expr, ast.Dict):
        return any(_derives(v, tainted, returns_config) for v in expr.values if v is not None)
    if isinstance(expr, ast.Call) and (DERIVING_CALLS.search(ast.unparse(expr.func))
                                       or (returns_config is not None and returns_config(expr))):
        return any(_derives(a, tainted, returns_config) for a in (*expr.args, *expr.keywords))
    return False


def _targets(target: ast.AST) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
        return [f"self.{target.attr}"]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for t in target.elts for n in _targets(t)]
    if isinstance(target, ast.Starred):
        return _targets(target.value)
    return []


def _own_nodes(fn: ast.AST):
    """The nodes of a function's own body (nested functions and classes are their own scopes)."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))


def static_walk(root: Path, start: tuple[str, str, str] = STATIC_START, strict: bool = True,
                modules: dict[str, Module] | None = None) -> dict:
    """Follow a name through the source (see the module docstring): ``start`` is (module, function,
    the name the config is born as there); ``strict``: only what :func:`_derives` (else any
    expression that mentions a tainted name) carries the config on."""
    returning: set[tuple[str, str]] = set()
    """functions whose return value is the config or a part or copy of their tainted parameters"""
    callers: dict[tuple[str, str], set] = defaultdict(set)
    current: list[Function] = []

    def returns_config(call: ast.Call) -> bool:
        return any((c.module, c.qualname) in returning for c, _ in callees(current[0], call, set()))

    def carries(expr, tainted) -> bool:
        return _derives(expr, tainted, returns_config) if strict else _mentions(expr, tainted)
    modules = modules if modules is not None else read_modules(root)
    functions = _functions(modules)
    bindings = {name: _bindings(m, modules) for name, m in modules.items()}
    own_bindings: dict[tuple[str, str], dict] = {}
    """each function's own imports, read once"""
    by_module = defaultdict(dict)
    classes = defaultdict(dict)
    for (mod, qual), f in functions.items():
        by_module[mod][qual] = f
    for name, m in modules.items():
        for node in m.tree.body:
            if isinstance(node, ast.ClassDef):
                classes[name][node.name] = node

    def lookup(mod: str, name: str, depth: int = 0) -> list[Function]:
        """A module-level function or class (its ``__init__``/``__post_init__``) named ``name`` in ``mod``,
        following imports (re-exports of a package's ``__init__`` included)."""
        if depth > 4 or mod not in modules:
            return []
        if name in by_module[mod]:
            return [by_module[mod][name]]
        if name in classes[mod]:
            return [f for m in ("__init__", "__post_init__") if (f := by_module[mod].get(f"{name}.{m}"))]
        if name in bindings[mod]:
            target, attr = bindings[mod][name]
            return lookup(target, attr, depth + 1) if attr else []
        return []

    def callees(fn: Function, call: ast.Call, locals_: set[str]) -> list[tuple[Function, bool]]:
        """(callee, bound) for a call: bound = the callee's first parameter is bound already (a method)."""
        f = call.func
        mod = fn.module
        if isinstance(f, ast.Name):
            nested = f"{fn.qualname}.<locals>.{f.id}"
            if nested in by_module[mod]:
                return [(by_module[mod][nested], False)]
            if (mod, fn.qualname) not in own_bindings:
                own_bindings[mod, fn.qualname] = _bindings(modules[mod], modules, fn.node)
            own = own_bindings[mod, fn.qualname].get(f.id)
            found = (lookup(own[0], own[1]) if own[1] else []) if own else lookup(mod, f.id)
            return [(c, c.node.name in ("__init__", "__post_init__")) for c in found]
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            base = f.value.id
            if base == "self" and fn.cls:
                qual = fn.qualname.rsplit(".", 1)[0] + "." + f.attr
                return [(by_module[mod][qual], True)] if qual in by_module[mod] else []
            if base in bindings[mod] and bindings[mod][base][1] is None:
                found = lookup(bindings[mod][base][0], f.attr)
                return [(c, c.node.name in ("__init__", "__post_init__")) for c in found]
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Call) \
                and ast.unparse(f.value.func) in ("importlib.import_module", "import_module") and f.value.args:
            arg = f.value.args[0]
            text = "".join(v.value if isinstance(v, ast.Constant) else "*" for v in arg.values) \
                if isinstance(arg, ast.JoinedStr) else arg.value if isinstance(arg, ast.Constant) else None
            if isinstance(text, str):
                pattern = re.compile(re.escape(text).replace(r"\*", r"\w+") + "$")
                return [(by_module[m][f.attr], False) for m in sorted(modules)
                        if pattern.match(m) and f.attr in by_module[m]]
        return []

    tainted_params: dict[tuple[str, str], set[str]] = defaultdict(set)
    names: dict[str, str] = {}
    sites: dict[str, set[str]] = defaultdict(set)
    package_sites: set[tuple[str, str]] = set()
    first = by_module.get(start[0], {}).get(start[1])
    if first is None:
        raise ValueError(f"the walk's start {start[0]}:{start[1]} is no function of {root}; "
                         "pass --start MODULE:FUNCTION:NAME.")
    seeds = {(first.module, first.qualname): {start[2]}}
    work = [(first, {start[2]})]
    visited: set[tuple[str, str]] = set()
    while work:
        fn, tainted = work.pop()
        key = (fn.module, fn.qualname)
        visited.add(key)
        current[:] = [fn]
        tainted = set(tainted)
        nodes = list(_own_nodes(fn.node))
        changed = True
        while changed:  # flow-insensitive: a name once bound to the config stays tainted in this function
            changed = False
            for node in nodes:
                new: list[str] = []
                if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and carries(node.value, tainted):
                    new = [n for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                           for n in _targets(t)]
                elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)) and carries(node.iter, tainted):
                    new = _targets(node.target)
                elif isinstance(node, ast.withitem) and node.optional_vars is not None \
                        and carries(node.context_expr, tainted):
                    new = _targets(node.optional_vars)
                elif isinstance(node, ast.NamedExpr) and carries(node.value, tainted):
                    new = _targets(node.target)
                if set(new) - tainted:
                    tainted |= set(new)
                    changed = True
        if key not in returning and any(isinstance(n, ast.Return) and carries(n.value, tainted) for n in nodes):
            returning.add(key)  # its callers' calls to it now carry the config: walk them again
            work += [(f, tainted_params[(f.module, f.qualname)] | seeds.get((f.module, f.qualname), set()))
                     for f in callers[key]]
        where = f"{fn.module}:{fn.qualname}"
        for n in tainted:
            if n not in ("self", "cls") and not n.startswith("self."):
                names.setdefault(n, where)
        for node in nodes:
            if not isinstance(node, ast.Call):
                continue
            args = [a for a in node.args] + [k.value for k in node.keywords]
            if not any(carries(a, tainted) for a in args):
                continue
            for callee, bound in callees(fn, node, tainted):
                params = callee.params
                positional = callee.positional[1:] if bound or (callee.cls and callee.positional[:1] == ["self"]
                                                                  and isinstance(node.func, ast.Attribute)) \
                    else callee.positional
                got = set()
                for i, a in enumerate(node.args):
                    if isinstance(a, ast.Starred):
                        if carries(a.value, tainted):
                            vararg = callee.node.args.vararg
                            got |= set(positional[i:]) | ({vararg.arg} if vararg else set())
                        break
                    if carries(a, tainted):
                        if i < len(positional):
                            got.add(positional[i])
                        elif callee.node.args.vararg:
                            got.add(callee.node.args.vararg.arg)
                for k in node.keywords:
                    if not carries(k.value, tainted):
                        continue
                    if k.arg is None:  # **kwargs: every keyword parameter may be bound
                        got |= {p for p in params if p not in ("self", "cls")}
                    elif k.arg in params:
                        got.add(k.arg)
                    elif callee.node.args.kwarg:
                        got.add(callee.node.args.kwarg.arg)
                got.discard("self")
                if not got:
                    continue
                if callee.module != fn.module:
                    sites[callee.module].add(f"{fn.module}:{node.lineno} -> {callee.qualname}")
                    if _package(callee.module) != _package(fn.module):
                        package_sites.add((_package(fn.module), _package(callee.module)))
                ckey = (callee.module, callee.qualname)
                callers[ckey].add(fn)
                if not got <= tainted_params[ckey] or ckey not in visited:
                    tainted_params[ckey] |= got
                    work.append((callee, tainted_params[ckey] | seeds.get(ckey, set())))
    rooms = {m for m, _ in visited}
    return {"start": f"{start[0]}:{start[1]} ({start[2]})", "functions": len(visited),
            "rooms_entered_modules": len(rooms), "rooms_entered_packages": len({_package(m) for m in rooms}),
            "call_sites_between_modules": sum(len(s) for s in sites.values()),
            "distinct_package_moves": len(package_sites),
            "enters": {m: len(s) for m, s in sorted(sites.items(), key=lambda kv: (-len(kv[1]), kv[0]))},
            "call_sites": {m: sorted(s) for m, s in sorted(sites.items())},
            "names": sorted(names), "modules": sorted(rooms)}


# ----------------------------------------------------------------------------- the walk

class _Boxed:
    """Marks a config value re-boxed so that its identity can be followed."""


class _Str(str, _Boxed):
    pass


class _Int(int, _Boxed):
    pass


class _Float(float, _Boxed):
    pass


class _Tuple(tuple, _Boxed):
    pass


BOXES = {str: _Str, int: _Int, float: _Float}


def _box(value):
    if type(value) in BOXES:
        return BOXES[type(value)](value)
    if type(value) is tuple:
        return _Tuple(_box(v) for v in value)
    if type(value) is list:
        value[:] = [_box(v) for v in value]
    elif type(value) is dict:
        for k in value:
            value[k] = _box(value[k])
    elif _is_dataclass_instance(value):
        for name in type(value).__dataclass_fields__:
            object.__setattr__(value, name, _box(getattr(value, name)))
    return value


def _is_dataclass_instance(value) -> bool:
    """Asked of the type: a proxy's ``__getattr__`` (SB3's VecEnv) would otherwise answer, or recurse."""
    return "__dataclass_fields__" in dir(type(value)) and not isinstance(value, type)


def _register_boxes_with_yaml() -> None:
    """PyYAML's safe dumper represents exact types only; the boxes dump as their base type."""
    try:
        import yaml
    except ImportError:
        return
    for box, represent in ((_Str, yaml.SafeDumper.represent_str), (_Int, yaml.SafeDumper.represent_int),
                           (_Float, yaml.SafeDumper.represent_float), (_Tuple, yaml.SafeDumper.represent_list)):
        yaml.SafeDumper.add_representer(box, represent)
        yaml.Dumper.add_representer(box, represent)


def _own_dict(value) -> dict:
    try:
        found = object.__getattribute__(value, "__dict__")
    except (AttributeError, TypeError):
        return {}
    return found if isinstance(found, dict) else {}


@dataclass
class Walk:
    """What one run of the walk saw (see the module docstring for each count's definition)."""

    package_dir: str
    start: tuple[str, str] = DYNAMIC_START
    carriers: dict[int, object] = field(default_factory=dict)
    started: bool = False
    tallies: dict = field(default_factory=lambda: {kind: _tally() for kind in ("all", "objects")})
    """"all": visits carrying any carrier; "objects": visits carrying the config or a section of it"""
    names: dict[str, dict] = field(default_factory=dict)
    """name -> {"where": first seen, "object": ever bound to the config or a section}"""
    attributes: dict[str, dict] = field(default_factory=dict)
    _ours: dict = field(default_factory=dict)
    _generators: dict = field(default_factory=dict)

    def module_of(self, code) -> str | None:
        """``draftrl.x.y`` for a code object of a draftrl file, else None (cached per code object)."""
        got = self._ours.get(code, False)
        if got is not False:
            return got
        name = None
        filename = code.co_filename
        if filename.startswith(self.package_dir) and filename.endswith(".py"):
            rel = Path(filename).relative_to(Path(self.package_dir).parent).with_suffix("")
            name = ".".join(rel.parts).removesuffix(".__init__")
        self._ours[code] = name
        return name

    def is_carrier(self, value, depth: int = 3) -> bool:
        if isinstance(value, _Boxed) or id(value) in self.carriers:
            return True
        if depth == 0:
            return False
        kind = type(value)
        if kind is dict:
            items = list(value.values())[:64]
        elif kind in (list, tuple):
            items = value[:64]
        elif kind.__name__.endswith(CONFIG_SUFFIXES) and _is_dataclass_instance(value):
            items = [getattr(value, f, None) for f in kind.__dataclass_fields__]
        else:
            return False
        if any(self.is_carrier(v, depth - 1) for v in items):
            self.carriers[id(value)] = value
            return True
        return False

    def adopt(self, config) -> None:
        _box(config)
        self.carriers[id(config)] = config
        self.started = True

    def trace(self, frame, event, arg):
        """The global trace function: sees every call, keeps draftrl frames for their return."""
        if event != "call":
            return None
        module = self.module_of(frame.f_code)
        if module is None:
            return None
        frame.f_trace_lines = False
        code = frame.f_code
        if code.co_flags & 0x20 or code.co_flags & 0x200:  # generator / async generator: one visit, not one per resume
            if id(frame) in self._generators:
                return self.local
            self._generators[id(frame)] = frame
        if self.started and code.co_name != "<module>":
            self.enter(frame, module)
        return self.local

    def local(self, frame, event, arg):
        if event == "return":
            self.leave(frame, arg)
        return None

    def _args(self, frame) -> list[str]:
        code = frame.f_code
        n = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)
        return list(code.co_varnames[:n])

    def _caller(self, frame):
        back = frame.f_back
        while back is not None and self.module_of(back.f_code) is None:
            back = back.f_back
        return back

    def is_object(self, value) -> bool:
        """A carrier that is the config or a section derived from it (not a boxed field value)."""
        return not isinstance(value, _Boxed) and self.is_carrier(value)

    def enter(self, frame, module: str) -> None:
        local = frame.f_locals
        carried = [a for a in self._args(frame) if a not in ("self", "cls") and not a.startswith(".")
                   and a in local and self.is_carrier(local[a])]
        if not carried:
            return
        code = frame.f_code
        where = f"{module}:{code.co_qualname}"
        objects = any(self.is_object(local[a]) for a in carried)
        package = _package(module)
        for kind in ("all", "objects") if objects else ("all",):
            tally = self.tallies[kind]
            tally["visits"] += 1
            tally["functions"][where] += 1
            tally["modules"][module] += 1
            tally["packages"][package] += 1
        for a in carried:
            self._name(a, where, self.is_object(local[a]))
        caller = self._caller(frame)
        if caller is None:
            return
        from_module = self.module_of(caller.f_code)
        if from_module == module:
            return
        for kind in ("all", "objects") if objects else ("all",):
            tally = self.tallies[kind]
            tally["moves"][(from_module, module)] += 1
            tally["call_sites"][module].add(f"{from_module}:{caller.f_lineno} -> {code.co_qualname}")
            if _package(from_module) != package:
                tally["package_moves"][(_package(from_module), package)] += 1

    def _name(self, name: str, where: str, is_object: bool) -> None:
        seen = self.names.setdefault(name, {"where": where, "object": False})
        if is_object and not seen["object"]:
            seen.update(where=where, object=True)

    def leave(self, frame, value) -> None:
        code = frame.f_code
        module = self.module_of(code)
        if not self.started:
            if (code.co_filename.endswith(self.start[0]) and code.co_name == self.start[1]
                    and _is_dataclass_instance(value)):
                self.adopt(value)
            else:
                return
        if code.co_name == "<module>":
            return
        where = f"{module}:{code.co_qualname}"
        for name, v in list(frame.f_locals.items()):
            if name in ("self", "cls") or name.startswith("."):
                # a config's own fields are not other names of it
                attrs = _own_dict(v) if name == "self" and not self.is_carrier(v, 0) \
                    and not type(v).__name__.endswith(CONFIG_SUFFIXES) else {}
                for attr, av in list(attrs.items())[:64]:
                    if self.is_carrier(av, 1):
                        seen = self.attributes.setdefault(f"{type(v).__name__}.{attr}",
                                                          {"where": where, "object": False})
                        seen["object"] = seen["object"] or self.is_object(av)
                continue
            if self.is_carrier(v):
                self._name(name, where, self.is_object(v))

    def report(self) -> dict:
        out = {}
        for kind, t in self.tallies.items():
            enters = Counter()
            for (_, to), n in t["moves"].items():
                enters[to] += n
            out[kind] = {
                "visits": t["visits"], "functions": len(t["functions"]),
                "rooms_entered_modules": len(t["modules"]), "rooms_entered_packages": len(t["packages"]),
                "moves_between_modules": sum(t["moves"].values()), "distinct_module_moves": len(t["moves"]),
                "moves_between_packages": sum(t["package_moves"].values()),
                "distinct_package_moves": len(t["package_moves"]),
                "enters": {m: {"calls": enters[m], "call_sites": len(t["call_sites"][m])}
                           for m in sorted(enters, key=lambda m: (-enters[m], m))},
                "call_sites": {m: sorted(x) for m, x in sorted(t["call_sites"].items())},
                "modules": dict(sorted(t["modules"].items())), "packages": dict(sorted(t["packages"].items())),
                "names": sorted(n for n, v in self.names.items() if kind == "all" or v["object"]),
                "attributes": sorted(n for n, v in self.attributes.items() if kind == "all" or v["object"]),
            }
        return out


def _tally() -> dict:
    return {"visits": 0, "functions": Counter(), "modules": Counter(), "packages": Counter(), "moves": Counter(),
            "package_moves": Counter(), "call_sites": defaultdict(set)}


def _package(module: str) -> str:
    """``draftrl.decoding.build`` -> ``draftrl.decoding``; a top-level module (``draftrl.io``) is its own package."""
    return module.rpartition(".")[0] if module.count(".") > 1 else module


def tiny_target(folder: Path) -> Path:
    """A random 4-layer Llama of width 32 over SmolLM2's tokenizer (as tests/byo makes one)."""
    if (folder / "config.json").exists():
        return folder
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from draftrl.models import fetch_model

    tokenizer = AutoTokenizer.from_pretrained(fetch_model("smollm2-135m", quiet=True))
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def run_walk(root: Path, target: str | None, workdir: Path, quick: bool = True,
             birth: tuple[str, str] = DYNAMIC_START) -> dict:
    """Run ``draftrl demo [--quick]`` from ``root`` under the tracer; returns :meth:`Walk.report`."""
    import contextlib
    import io
    import os
    import threading

    os.environ.setdefault("WANDB_MODE", "disabled")
    sys.path.insert(0, str(root))
    import draftrl

    if Path(draftrl.__file__).resolve().parent != (root / "draftrl").resolve():
        raise ValueError(f"draftrl was imported from {draftrl.__file__}, not {root}; "
                         f"run from {root} or set PYTHONPATH={root}.")
    from draftrl.cli import main

    workdir.mkdir(parents=True, exist_ok=True)
    target = target or str(tiny_target(workdir / "tiny-target"))
    out = workdir / "demo"
    argv = ["demo", *(["--quick"] if quick else []), "--target", target, "--kernels", "stock", "--out", str(out),
            "--overwrite", "--json"]
    _register_boxes_with_yaml()
    walk = Walk(str((root / "draftrl").resolve()) + os.sep, birth)
    sink = io.StringIO()
    threading.settrace(walk.trace)
    sys.settrace(walk.trace)
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            code = main(argv)
    finally:
        sys.settrace(None)
        threading.settrace(None)
    if code != 0 or not walk.started:
        raise RuntimeError(f"draftrl {' '.join(argv)} ended with {code} (walk started: {walk.started}):\n"
                           + sink.getvalue()[-2000:])
    report = walk.report()
    report["command"] = "draftrl " + " ".join(argv)
    return report


# ----------------------------------------------------------------------------- printing

def print_report(r: dict, walk: dict | None, out=None, watched: tuple[str, ...] = WATCHED) -> None:
    def p(*a):
        print(*a, file=out or sys.stdout)

    f, g = r["folders"], r["graph"]
    p(f"# tree report of {r['root']}")
    p(f"modules: {f['modules']} (+ {f['files'] - f['modules']} __init__.py); lines {f['lines']}, "
      f"median {f['median_lines']:g} lines per .py file")
    p("modules per folder: " + ", ".join(f"{k} {v}" for k, v in f["per_folder"].items())
      + "; top-level: " + ", ".join(m.removeprefix("draftrl.") for m in f["top_level_modules"]))
    if f["per_subfolder"]:
        p("  of which subfolders: " + ", ".join(f"{k} {v}" for k, v in f["per_subfolder"].items()))
    p(f"import graph: {g['rooms']} rooms on {g['floors']} floors, {g['arrows']} arrows; module circles: "
      f"{len(g['module_circles'])}; rooms importing each other (one floor): "
      + ("; ".join(" <-> ".join(c) for c in g["folded_rooms"]) or "none"))
    for floor, rooms in g["rooms_by_floor"].items():
        p(f"  floor {floor}: {', '.join(x.removeprefix('draftrl.') for x in rooms)}")
    e = r["envs"]
    p(f"envs/: {e['modules']} modules: {len(e['defining_envs'])} define an env, "
      f"{len(e['registering_envs'])} registers ids "
      f"({', '.join(m.removeprefix('draftrl.envs.') for m in e['registering_envs'])}), {len(e['not_envs'])} neither: "
      + ", ".join(m.removeprefix("draftrl.envs.") for m in e["not_envs"]))
    outside = e["imported_without_an_env"]
    p(f"  modules outside envs/ importing from it without wanting an env: {len(outside)} ("
      + ", ".join(f"{k} {v}" for k, v in e["importers_by_folder"].items()) + ")")
    for mod, names in outside.items():
        p(f"    {mod}: {', '.join(names)}")
    p(f"env ids: {len(r['env_ids'])}: {', '.join(i.removeprefix('draftrl/') for i in r['env_ids'])}")
    p(f"id-prefix parsing outside envs/ids.py: {len(r['id_prefix_parsing'])} places")
    for place in r["id_prefix_parsing"]:
        p(f"    {place}")
    en = r["engines"]
    p(f"engines: {en['count']} under {len(en['engines'])} protocols: "
      + "; ".join(f"{k} ({en['protocols'][k] or 'no Protocol class'}): {', '.join(x.rpartition('.')[2] for x in v)}"
                  for k, v in en["engines"].items()))
    c = r["configs"]
    p(f"config dataclasses: {c['count']} with {c['suffixes']} suffixes: "
      + "; ".join(f"{s} {len(v)} ({', '.join(v)})" for s, v in c["by_suffix"].items()))
    if c["other_suffixes"]:
        p(f"  other dataclass suffixes: {', '.join(c['other_suffixes'])}")
    gr = r["grammars"]
    p(f"string grammars: drafter kinds {len(gr['drafter_kinds'])} ({', '.join(gr['drafter_kinds'])}; "
      f"{gr['drafters_at']}); "
      f"policy kinds {len(gr['policy_kinds'])}, {gr['policy_forms']} forms ({gr['policies_at']}); kind names in both: "
      f"{', '.join(gr['shared_kind_names']) or 'none'}; fixed form {gr['fixed_form']!r}, "
      f"V means two things: {gr['fixed_V_two_meanings']}")
    p(f"proposers: {len(r['proposers'])}: {', '.join(r['proposers'])}")
    rep = r["repeated_file_names"]
    p(f"file names repeated across folders: {rep['count']} ({rep['count_without_cli']} without cli/): "
      + ", ".join(f"{n} x{len(v)}" for n, v in rep["names"].items()))
    w = r["words"]
    p(f"words (files of draftrl/, docs/, benchmarks/ out of {w['files_read']}): "
      + ", ".join(f"{k} {v}" for k, v in w["files_with"].items())
      + f"; simulator and replay in one file: {w['files_with_simulator_and_replay']}")
    p("track prefixes (modules): " + ", ".join(f"{k}* {len(v)}" for k, v in w["track_prefixed_modules"].items())
      + f"; evaluation modules: {', '.join(m.removeprefix('draftrl.') for m in w['evaluation_modules'])}")
    if w["architecture_md_cites_missing"]:
        p(f"docs/architecture.md cites missing files: {', '.join(w['architecture_md_cites_missing'])}")
    p("\n# one parameter's walk through `draftrl demo` (the DemoConfig born in draftrl/cli/demo.py:run as cfg)")
    for kind, w in r["static_walk"].items():
        enters = "; ".join(f"enters {m} at {w['enters'].get(m, 0)} call sites" for m in watched)
        what = "parts and copies of the config" if kind == "strict" else "any value computed from it"
        p(f"## static, {kind} (source only; {what}): {w['functions']} functions; rooms entered: "
          f"{w['rooms_entered_modules']} modules in {w['rooms_entered_packages']} packages; moves: "
          f"{w['call_sites_between_modules']} call sites between modules, {w['distinct_package_moves']} "
          f"distinct package moves; {enters}; names it goes by: {len(w['names'])}")
        if kind == "strict":
            p("  names: " + " ".join(w["names"]))
            for m in watched:
                p(f"  into {m}: " + "; ".join(w["call_sites"].get(m, [])))
    if walk is None:
        p("## dynamic: run with --walk")
        return
    p(f"## dynamic (--walk): {walk['command']}")
    for kind, title in (("objects", "the config and its sections (DemoConfig, EnvConfig, ...: objects)"),
                        ("all", "the config, its sections and its field values (boxed str/int/float/tuple)")):
        w = walk[kind]
        p(f"### {title}")
        p(f"visits {w['visits']} ({w['functions']} functions); rooms entered: {w['rooms_entered_modules']} modules in "
          f"{w['rooms_entered_packages']} packages; moves between rooms: {w['moves_between_modules']} between modules "
          f"({w['distinct_module_moves']} distinct), {w['moves_between_packages']} between packages "
          f"({w['distinct_package_moves']} distinct)")
        none = {"calls": 0, "call_sites": 0}
        enters = "; ".join(f"enters {m}: {w['enters'].get(m, none)['calls']} calls from "
                           f"{w['enters'].get(m, none)['call_sites']} call sites" for m in watched)
        p(f"{enters}; names it goes by: "
          f"{len(w['names'])} (parameters and variables); attributes holding it: {len(w['attributes'])}; names and "
          f"attribute names together: {len(set(w['names']) | {a.rpartition('.')[2] for a in w['attributes']})}")
        p("  names: " + " ".join(w["names"]))
        p("  attributes: " + " ".join(w["attributes"]))
        for m in watched:
            p(f"  into {m}: " + "; ".join(w["call_sites"].get(m, [])))
        p("  rooms entered (visits): "
          + ", ".join(f"{m.removeprefix('draftrl.')} {n}" for m, n in w["modules"].items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=REPO, help="the checkout to read (default: this one)")
    parser.add_argument("--walk", action="store_true", help="also run the quick demo and follow its config")
    parser.add_argument("--full", action="store_true",
                        help="--walk: the default demo (both PPO recipes, the power run) instead of --quick")
    parser.add_argument("--target", help="--walk: the demo's --target (default: a tiny random Llama in --workdir)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/tree_report"),
                        help="--walk: where the tiny target and the demo's outputs go (replaced each run)")
    parser.add_argument("--start", default=":".join(STATIC_START),
                        help="the static walk's birth place MODULE:FUNCTION:NAME (default %(default)s)")
    parser.add_argument("--birth", default=":".join(DYNAMIC_START),
                        help="--walk: FILE:FUNCTION whose return value is the config (default %(default)s)")
    parser.add_argument("--watch", action="append", default=None,
                        help=f"modules whose entries are listed call site by call site (default {', '.join(WATCHED)})")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of text")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    if not (root / "draftrl").is_dir():
        raise SystemExit(f"tree_report: {root} has no draftrl/ folder; pass --root CHECKOUT.")
    start = tuple(args.start.split(":"))
    birth = tuple(args.birth.split(":"))
    if len(start) != 3 or len(birth) != 2:
        raise SystemExit(f"tree_report: --start {args.start!r} needs MODULE:FUNCTION:NAME and --birth {args.birth!r} "
                         "FILE:FUNCTION, e.g. --start draftrl.cli.demo:run:cfg --birth draftrl/cli/demo.py:config.")
    try:
        report = static_report(root, start)
    except ValueError as err:
        raise SystemExit(f"tree_report: {err}") from None
    walk = run_walk(root, args.target, args.workdir, quick=not args.full, birth=birth) if args.walk else None
    if args.json:
        print(json.dumps({**report, "walk": walk}, default=list))
    else:
        print_report(report, walk, watched=tuple(args.watch or WATCHED))
    return 0


if __name__ == "__main__":
    sys.exit(main())
