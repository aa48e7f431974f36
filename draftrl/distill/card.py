"""The model card: README.md in the head's folder (target, data, training, measured acceptance)."""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Sequence
from pathlib import Path

#: ``draftrl distill`` options whose value is a path (``--target`` when it names an existing folder).
PATH_OPTIONS = ("--out", "--target", "--config")


def portable_command(argv: Sequence[str], out: str | Path) -> str:
    """``draftrl ARGV`` with the paths it names (``--out``, ``--config``, a ``--target`` or ``--set
    target=`` folder) relative to ``out``, the head's folder: the card's commands then read the same
    on any machine, run from that folder (``--out .``). Known names and hub ids stay as written."""
    from draftrl.models.registry import KNOWN_MODELS

    def relative(value: str, option: str) -> str:
        if option == "--target" and (value in KNOWN_MODELS or not Path(value).expanduser().exists()):
            return value
        return os.path.relpath(os.path.abspath(os.path.expanduser(value)), os.path.abspath(out))

    words, pending = [], None
    for word in argv:
        if pending is not None:
            words.append(relative(word, pending))
            pending = None
            continue
        option, eq, value = word.partition("=")
        if option in PATH_OPTIONS:
            if eq:
                words.append(f"{option}={relative(value, option)}")
            else:
                words.append(word)
                pending = option
        elif words and words[-1] == "--set" and option == "target" and eq:
            words.append(f"target={relative(value, '--target')}")
        else:
            words.append(word)
    return "draftrl " + " ".join(shlex.quote(w) for w in words)


def model_card(config: dict, manifest: dict, training: dict, acceptance: dict, commands: list[str],
               machine: str) -> str:
    """The card; ``commands``: the runs that built the head, in order (a later one raised ``epochs``)."""
    per_pos = acceptance.get("acceptance_per_position") or []
    rows = "\n".join(f"| {i + 1} | {a} | {b} |" for i, (a, b) in
                     enumerate(zip(per_pos, acceptance.get("accepted_at_least") or [])))
    last = training["log"][-1] if training["log"] else {}
    return f"""# EAGLE-3 draft head for {config['target']}

Trained by `draftrl distill` from the target alone; a folder in the `speculators` format.

    LLM(model=TARGET, speculative_config={{"method": "eagle3", "model": THIS_FOLDER, "num_speculative_tokens": 4}})
    draftrl generate --drafter eagle3:THIS_FOLDER ...

## Command{'s, run one after the other' if len(commands) > 1 else ''}

Paths are relative to this folder (`--out .` is the folder itself).

{chr(10).join('    ' + c for c in commands)}

## Data
{manifest['samples']} samples ({', '.join(f'{k}: {v}' for k, v in manifest['sources'].items())}),
{manifest['prompt_tokens']} prompt and {manifest['response_tokens']} response tokens. Responses:
{'; '.join(f'{k}: {v}' for k, v in manifest['responses'].items())} (generator: {manifest['generator']}).
Languages: {json.dumps(manifest['languages'])}; tasks: {json.dumps(manifest['tasks'])}.
The held-out prompt split was not used for training, nor were ShareGPT's held-out conversations
({manifest['sharegpt_heldout']}). Licences: {json.dumps(manifest['licences'])}.
Seed {manifest['seed']}. The full manifest is `work/manifest.json`.

## Head
One Llama decoder layer over fc(concat of the target's layers {config['aux_layers']}), a
{config['draft_vocab_size']}-token frequency-ranked draft vocabulary (`d2t`), embeddings shared with the target.

## Training
{training['step']} steps, {len(training['log'])} epochs, {config['ttt_steps']} unrolled steps (weights
{config['step_weight']}^i), lr {config['lr']}, batch {config['batch_size']}, device {config['device']};
{training['seconds']:.0f} s of training on {machine}. Final epoch: loss {last.get('loss')}, top-1 agreement with the
target per unrolled step {last.get('agree_per_step')}.

## Measured acceptance (draftrl's engine, greedy chains of depth {acceptance.get('depth')})
{len(acceptance.get('prompts', []))} held-out prompts, {acceptance.get('tokens_per_prompt')} tokens each,
{acceptance.get('rounds')} rounds; acceptance length (bonus token included) {acceptance.get('acceptance_length')};
per task {json.dumps(acceptance.get('acceptance_length_per_task'))}.

| position | acceptance given the previous accepted | rounds accepting at least this many |
|---|---|---|
{rows}
"""
