"""Ship a head trained by ``draftrl distill`` with the package: ``draftrl/drafters/heads/TARGET/``.

Copies the head in float16 (half the bytes; drafting upcasts to the target's dtype, and
verification keeps every output exact whatever the draft's precision), its model card, and the
distillation's manifest, config and acceptance, so the head can be rebuilt from the card's
command. The card's ``verifier`` becomes ``--verifier`` (a hub id: the folder must not point at a
path on the machine that trained it).

    python tools/package_head.py runs/heads/smollm2 smollm2-135m --verifier HuggingFaceTB/SmolLM2-135M-Instruct
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

from draftrl.drafters.eagle3 import CONFIG_FILE, Eagle3Head
from draftrl.drafters.packaged import HEADS_DIR
from draftrl.io import atomic_write_text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", help="the folder draftrl distill wrote (--out)")
    parser.add_argument("target", help="the known target name the head is for, e.g. smollm2-135m")
    parser.add_argument("--verifier", required=True, help="the target's hub id, for the folder's config")
    args = parser.parse_args()
    source, dest = Path(args.source), HEADS_DIR / args.target
    head = Eagle3Head.from_pretrained(source)
    head.config.verifier = args.verifier
    head.save_pretrained(dest, json.loads((source / CONFIG_FILE).read_text())["speculators_config"]
                         ["proposal_methods"][0]["speculative_tokens"], dtype=torch.float16)
    card = (source / "README.md").read_text().replace("`work/manifest.json`", "`distill_manifest.json`")
    atomic_write_text(dest / "README.md", card)
    for name in ("manifest.json", "config.json", "acceptance.json", "training.json"):
        shutil.copyfile(source / "work" / name, dest / f"distill_{name}")
    print(f"packaged {source} -> {dest} ({sum(p.stat().st_size for p in dest.iterdir()) / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
