"""The Gymnasium 1.x ways of making a draftrl env, each in a fresh interpreter.

``import draftrl.envs`` registers the ids; ``gym.make("draftrl.envs:draftrl/...")`` imports that
module itself. Without either, the bare id is unknown (the negative control: nothing registers
the ids behind the user's back). Registration imports no torch: entry points are strings.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from draftrl.envs.ids import ENVS

ROOT = Path(__file__).resolve().parents[2]
IDS = sorted(e["id"] for e in ENVS)


def _fresh(code: str) -> dict:
    """Run ``code`` in a fresh interpreter with the repository on the path; it prints one JSON line."""
    # -W error::UserWarning: registering an id twice (gymnasium's "Overriding environment ...") fails the run
    result = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", code], capture_output=True, text=True,
                            cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


REPORT = ("ids = sorted(i for i in gym.registry if i.startswith('draftrl/'))\n"
          "obs, info = env.reset(seed=0)\n"
          "print(json.dumps({'ids': ids, 'obs': len(obs), 'torch': 'torch' in sys.modules}))\n")


def test_import_draftrl_envs_registers_every_id():
    report = _fresh("import json, sys; import gymnasium as gym; import draftrl.envs\n"
                    "gym.register_envs(draftrl.envs)\n"
                    "import draftrl.envs  # a second import registers nothing twice\n"
                    "env = gym.make('draftrl/Analytic-v0', alpha=0.7, max_new_tokens=8)\n" + REPORT)
    assert report == {"ids": IDS, "obs": 6, "torch": False}


def test_the_module_prefixed_id_needs_no_import():
    report = _fresh("import json, sys; import gymnasium as gym\n"
                    "env = gym.make('draftrl.envs:draftrl/Analytic-v0', alpha=0.7, max_new_tokens=8)\n" + REPORT)
    assert report == {"ids": IDS, "obs": 6, "torch": False}


def test_without_an_import_the_bare_id_is_unknown():
    report = _fresh("import json; import gymnasium as gym; import draftrl\n"
                    "try:\n    gym.make('draftrl/Analytic-v0')\n    print(json.dumps('made'))\n"
                    "except gym.error.Error as err:\n    print(json.dumps(type(err).__name__))\n")
    assert report in ("NameNotFound", "NamespaceNotFound")


def test_every_id_names_its_module_and_class():
    import gymnasium as gym

    import draftrl.envs  # noqa: F401  registers

    for kwargs in ENVS:
        assert gym.spec(kwargs["id"]).entry_point == kwargs["entry_point"]
