"""Law of sampled draft children: torch.multinomial (before issue 14) vs draftrl's float64 sampler.

Verification treats the children of a sampled tree node as i.i.d. draws from q normalised in
float64. This script computes, exactly and without sampling, the law each sampler really draws
from and its total variation (TV) from that q:

- ``multinomial``: PyTorch's CPU kernel for more than one sample with replacement (what
  ``ModelDrafter`` used for width >= 2): a float32 running sum, divided by the float32 total, the
  last entry forced to 1, then the first entry >= a float64 uniform. Its law is the difference of
  consecutive float32 CDF entries. (``--check`` compares this model with real draws.)
- ``draftrl``: :func:`draftrl.decoding.sampling.sample` (float64 CDF, searchsorted): the difference
  of consecutive float64 CDF entries over the float64 total.

The reference q is computed in extended precision. Rows: SmolLM2-135M's next-token distributions
at temperature 1 (no top-k / top-p) at the last positions of a few chat prompts, plus the adversarial
row of the issue (one head token, 49151 tail tokens of 1.4 float32 steps below 1 each).

    python benchmarks/children_law.py [--prompts 10] [--rows 50] [--check]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from draftrl.envs.workload import encode
from draftrl.models import load_model
from draftrl.models.distribution import SamplingParams, logits_to_probs
from draftrl.prompts import load_prompts


def multinomial_law(q: np.ndarray) -> np.ndarray:
    """Law of torch.multinomial(q, n >= 2, replacement=True) on the CPU (float32 q)."""
    cdf = np.add.accumulate(q.astype(np.float32), dtype=np.float32)  # sequential, as the kernel's loop
    cdf = (cdf / cdf[-1]).astype(np.float32)
    cdf[-1] = 1.0
    return np.diff(cdf.astype(np.float64), prepend=0.0)


def draftrl_law(q: np.ndarray) -> np.ndarray:
    """Law of draftrl's sample(): float64 cumulative sum, point u * total searched in it."""
    cdf = np.cumsum(q.astype(np.float64))
    return np.diff(cdf.astype(np.longdouble), prepend=0.0) / np.longdouble(cdf[-1])


def tv(law: np.ndarray, q: np.ndarray) -> float:
    ref = q.astype(np.longdouble) / q.astype(np.longdouble).sum()
    return float(0.5 * np.abs(law.astype(np.longdouble) - ref).sum())


def adversarial_row(vocab: int = 49152) -> np.ndarray:
    q = np.full(vocab, 1.4 * 2.0**-24)
    q[0] = 1.0 - (vocab - 1) * 1.4 * 2.0**-24
    return q.astype(np.float32)


def smollm2_rows(num_prompts: int, per_prompt: int) -> np.ndarray:
    model = load_model("smollm2-135m")
    rows = []
    for prompt in load_prompts()[:: max(1, len(load_prompts()) // num_prompts)][:num_prompts]:
        ids = encode(model.tokenizer, prompt.prompt, chat_template=True)
        with torch.inference_mode():
            logits = model.model(input_ids=torch.tensor([ids])).logits[0].float()
        rows.append(logits_to_probs(logits[-per_prompt:], SamplingParams(temperature=1.0)).numpy())
    return np.concatenate(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=10, help="chat prompts whose every position gives a row")
    parser.add_argument("--rows", type=int, default=50, help="rows per prompt: its last positions")
    parser.add_argument("--check", action="store_true", help="compare the multinomial model with 4e6 real draws")
    args = parser.parse_args()

    adv = adversarial_row()
    before, after = multinomial_law(adv), draftrl_law(adv)
    print(
        f"adversarial row: tail mass q={float(adv[1:].astype(np.float64).sum() / adv.astype(np.float64).sum()):.6f}  "
        f"multinomial={before[1:].sum():.6f}  draftrl={float(after[1:].sum()):.6f}  "
        f"tv_multinomial={tv(before, adv):.3e}  tv_draftrl={tv(after, adv):.3e}"
    )
    if args.check:
        draws = torch.multinomial(torch.from_numpy(adv), 4_000_000, replacement=True, generator=torch.Generator().manual_seed(0))
        observed = float((draws != 0).double().mean())
        stderr = (before[1:].sum() * (1 - before[1:].sum()) / 4e6) ** 0.5
        print(f"check: real multinomial tail frequency {observed:.6f} vs model {before[1:].sum():.6f} "
              f"({(observed - before[1:].sum()) / stderr:+.1f} standard errors)")

    rows = smollm2_rows(args.prompts, args.rows)
    tv_before = np.array([tv(multinomial_law(r), r) for r in rows])
    tv_after = np.array([tv(draftrl_law(r), r) for r in rows])
    print(
        f"smollm2-135m rows at temperature 1: n={len(rows)}  tv_multinomial mean={tv_before.mean():.3e} "
        f"max={tv_before.max():.3e}  tv_draftrl mean={tv_after.mean():.3e} max={tv_after.max():.3e}"
    )


if __name__ == "__main__":
    main()
