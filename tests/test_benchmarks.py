"""``benchmarks/`` is a suite: every script goes through ``_bench.py`` and is listed in its README;
each one's ``--help`` runs; one cheap benchmark runs end to end with the ``--out`` guard."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
SCRIPTS = sorted(p for p in BENCH.glob("*.py") if p.name != "_bench.py")
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
       "OMP_NUM_THREADS": "1"}


def harness_names(script: Path) -> set[str]:
    """Names a script imports from ``_bench``."""
    tree = ast.parse(script.read_text())
    return {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module == "_bench"
            for alias in node.names}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_script_runs_through_the_harness(script):
    """Common flags (``common_flags``), the header and the guarded ``--out`` (``Bench``), or it is not in the suite."""
    missing = {"Bench", "common_flags", "parse_args"} - harness_names(script)
    assert not missing, f"benchmarks/{script.name} does not use _bench.py's {sorted(missing)}; " \
                        "see benchmarks/README.md."


def test_every_file_has_a_section_in_the_readme_and_every_section_a_file():
    """A section starts with the script's name in bold: **`name.py`**: the claim, the command, the line."""
    sections = set(re.findall(r"\*\*`([\w.]+)`\*\*", (BENCH / "README.md").read_text()))
    files = {p.name for p in BENCH.iterdir() if p.is_file() and p.name not in ("README.md", "_bench.py")}
    assert not files - sections, f"benchmarks/README.md has no section for {sorted(files - sections)}: " \
                                 "add the claim, the command and the line it prints."
    assert not sections - files, f"benchmarks/README.md has sections for {sorted(sections - files)}, not in benchmarks/"


def test_every_script_answers_help():
    """One interpreter runs every script's ``--help`` (imports included: a stale import fails here)."""
    driver = (
        "import runpy, sys, contextlib, io\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "failed = []\n"
        "for path in sys.argv[2:]:\n"
        "    sys.argv = [path, '--help']\n"
        "    out = io.StringIO()\n"
        "    try:\n"
        "        with contextlib.redirect_stdout(out):\n"
        "            runpy.run_path(path, run_name='__main__')\n"
        "    except SystemExit as stop:\n"
        "        if stop.code in (0, None) and '--overwrite' in out.getvalue():\n"
        "            continue\n"
        "    except Exception as err:\n"
        "        failed.append(f'{path}: {type(err).__name__}: {err}')\n"
        "        continue\n"
        "    failed.append(f'{path}: --help did not exit 0 listing --overwrite')\n"
        "print('\\n'.join(failed))\n"
        "sys.exit(1 if failed else 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", driver, str(BENCH), *map(str, SCRIPTS)], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]


def tiny_recordings(path: Path) -> Path:
    """A recordings directory ``lookup_replay.py`` can replay: continuations that repeat their prompts."""
    requests = []
    for i in range(3):
        prompt = [(7 * i + 3 * j) % 50 for j in range(20)]
        requests.append({"prompt_ids": prompt, "token_ids": (prompt[5:15] * 4)[:30], "max_new_tokens": 24,
                         "prompt": {"id": f"p{i}", "task": "chat"}})
    path.mkdir()
    (path / "recordings.json").write_text(json.dumps({"requests": requests}))
    return path


def test_a_benchmark_end_to_end_and_the_out_guard(tmp_path):
    """``lookup_replay.py --quick`` (no model, no vLLM): header first, ratio-first rows, results.json;
    a second run into the same ``--out`` is refused without ``--overwrite`` and leaves the file alone."""
    recordings, out = tiny_recordings(tmp_path / "rec"), tmp_path / "out"
    command = [sys.executable, str(BENCH / "lookup_replay.py"), "--quick", "--recordings", str(recordings),
               "--out", str(out)]
    first = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr[-2000:]
    lines = first.stdout.splitlines()
    assert lines[0].startswith("# machine: cpu=") and "torch=" in lines[0] and "threads=1" in lines[0]
    rows = [line for line in lines if not line.startswith("#")]
    assert len(rows) == 2 and all(line.startswith("steps_vs_none=") and "x  " in line for line in rows)
    results = json.loads((out / "results.json").read_text())
    assert results["machine"]["threads"] == 1 and [r["context"]["arm"] for r in results["rows"]] == [
        "ref_latest:4", "ref_earliest:4"]
    before = (out / "results.json").read_bytes()

    again = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert again.returncode != 0 and "--overwrite" in again.stderr and "results.json" in again.stderr
    assert again.stdout == "" and (out / "results.json").read_bytes() == before  # refused before any compute

    forced = subprocess.run([*command, "--overwrite"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert forced.returncode == 0, forced.stderr[-2000:]
    assert [p.name for p in out.iterdir()] == ["results.json"]  # atomic write: no temporary file left behind
