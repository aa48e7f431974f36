"""Build step that pyproject.toml cannot declare: ship ``draftrl_gym.pth`` into site-packages.

The project's metadata lives in pyproject.toml. This file only adds ``build_pth``, a ``build``
sub-command that puts ``draftrl_gym.pth`` (one line: ``import _draftrl_gym``, the start-up hook
that registers draftrl's gymnasium ids when gymnasium loads; see ``_draftrl_gym.py``) at the root
of what is installed, as setuptools' own ``distutils-precedence.pth`` is:

- a wheel (``pip install .``, ``pip install --target``): into ``build_lib``, the wheel's root;
- an editable install (``pip install -e .``, PEP 660): setuptools runs every ``build`` sub-command
  with ``editable_mode = True`` and installs the editable wheel's non-package files from
  ``install.install_lib``, the unpacked wheel's root, so the file is written there (a file in
  ``build_lib`` would be dropped, since an editable wheel maps packages to the source tree).
"""

import os

from setuptools import Command, setup
from setuptools.command.build import build

PTH = "draftrl_gym.pth"


class build_pth(Command):
    """Copy ``draftrl_gym.pth`` to the root of the wheel being built."""

    description = "ship draftrl_gym.pth (registers draftrl's gymnasium ids at gymnasium import)"
    user_options: list = []

    def initialize_options(self) -> None:
        self.build_lib = None
        self.editable_mode = False

    def finalize_options(self) -> None:
        self.set_undefined_options("build_py", ("build_lib", "build_lib"))

    def run(self) -> None:
        root = self.get_finalized_command("install").install_lib if self.editable_mode else self.build_lib
        self.mkpath(root)
        self.copy_file(PTH, os.path.join(root, PTH))

    def get_source_files(self) -> list:
        return [PTH]

    def get_outputs(self) -> list:
        return [os.path.join(self.build_lib, PTH)]

    def get_output_mapping(self) -> dict:
        return {os.path.join(self.build_lib, PTH): PTH}


class build_with_pth(build):
    sub_commands = build.sub_commands + [("build_pth", None)]


setup(cmdclass={"build": build_with_pth, "build_pth": build_pth})
