"""Start-up hook of draftrl: register its gymnasium ids when gymnasium's registry loads.

gymnasium >= 1.0 loads no plugin entry points, so ``gym.make("draftrl/SpecDecode-v0")`` fails in
an interpreter that has not imported draftrl. An installed draftrl ships ``draftrl_gym.pth``
(site-packages) whose one line, run by Python's ``site`` at start-up, imports this module. At
start-up it only puts :class:`RegisterDraftrlEnvs` on ``sys.meta_path``: it imports nothing else
(no gymnasium, torch or draftrl). When ``gymnasium.envs.registration`` is first imported, the
finder lets the regular loader execute it, then registers the ids of ``draftrl/envs/ids.py``
(loaded by path, so draftrl itself is imported only when an env is made) with entry-point strings.
"""

import sys

#: The module after whose execution the ids are registered.
TARGET = "gymnasium.envs.registration"


class RegisterDraftrlEnvs:
    """A one-shot ``sys.meta_path`` finder: finds nothing itself, wraps the loader of :data:`TARGET`."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != TARGET:
            return None
        sys.meta_path.remove(self)  # one shot; the finders after it locate the real module
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        execute = loader.exec_module

        def exec_module(module):
            execute(module)
            register(module)

        loader.exec_module = exec_module
        return spec


def register(registration) -> None:
    """Register draftrl's ids in the just-executed ``gymnasium.envs.registration`` module.

    A missing or broken draftrl never breaks gymnasium's import: the ids are then left out and
    ``import draftrl.envs`` (or ``gym.make("draftrl.envs:draftrl/...")``) registers them.
    """
    import importlib.util
    import os

    try:
        spec = importlib.util.find_spec("draftrl")  # finds the package without importing it
        if spec is None or not spec.submodule_search_locations:
            return
        path = os.path.join(list(spec.submodule_search_locations)[0], "envs", "ids.py")
        ids_spec = importlib.util.spec_from_file_location("_draftrl_env_registry", path)
        ids = importlib.util.module_from_spec(ids_spec)
        ids_spec.loader.exec_module(ids)
        ids.register_all(registration.registry, registration.register)
    except Exception as err:  # noqa: BLE001  (a start-up hook must not take gymnasium down)
        registration.logger.warn(f"draftrl could not register its env ids at gymnasium import ({err}); "
                                 "import draftrl.envs registers them.")


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once), unless gymnasium's registry is already imported.

    First, so that it sees the import before the path finder does; for any other module it
    returns None after one string comparison."""
    if TARGET in sys.modules:
        register(sys.modules[TARGET])
    elif not any(isinstance(f, RegisterDraftrlEnvs) for f in sys.meta_path):
        sys.meta_path.insert(0, RegisterDraftrlEnvs())


install()
