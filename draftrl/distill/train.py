"""Training the head: training-time test over cached features, distilled against the target.

Loss (EAGLE-3, with HASS-style soft targets): for each unrolled step ``i`` (``Eagle3Head.unroll``)
the cross-entropy between the target's distribution at the predicted position, restricted to the
draft vocabulary and renormalised, and the head's, over the positions ``loss_mask`` marks (see
``features``), weighted ``step_weight ** i``. Batches hold sequences of similar length
(:func:`epoch_batches`); the learning rate warms up, then decays (:func:`learning_rate`).
Checkpoints (head, optimizer, position in the epoch's seeded order) are written every
``checkpoint_every`` steps and at each epoch's end; a rerun resumes there.
"""

from __future__ import annotations

import io
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from draftrl.distill.config import DistillConfig
from draftrl.drafters.eagle3 import Eagle3Head
from draftrl.io import atomic_write_bytes

CHECKPOINT = "checkpoint.pt"


@torch.no_grad()
def init_head(head: Eagle3Head, target) -> None:
    """Start near the target: its LM head's rows of the draft vocabulary, ``fc`` passing the deepest
    auxiliary layer through, the layer's output projections small (so the block starts near identity)."""
    head.lm_head.weight.copy_(target.lm_head.weight[head.draft_to_target].float())
    hidden = head.config.target_hidden_size
    head.fc.weight.zero_()
    head.fc.weight[:, -hidden:] = torch.eye(hidden)
    for linear in (head.midlayer.self_attn.o_proj, head.midlayer.mlp.down_proj):
        linear.weight.normal_(0.0, 0.02)


def collate(items: list[dict[str, torch.Tensor]], device) -> dict[str, torch.Tensor]:
    """Right-padded batch: ids [B, T], aux [B, T, 3H], final [B, T, H], loss_mask [B, T] (False on padding)."""
    length = max(item["ids"].shape[0] for item in items)
    out = {}
    for key in ("ids", "aux", "final", "loss_mask"):
        rows = [F.pad(item[key], (0, 0) * (item[key].dim() - 1) + (0, length - item[key].shape[0])) for item in items]
        out[key] = torch.stack(rows).to(device)
    out["aux"], out["final"] = out["aux"].float(), out["final"].float()
    return out


def step_losses(head: Eagle3Head, embed, target_rows: torch.Tensor, batch, steps: int):
    """(weighted-ready per-step losses [steps], per-step top-1 agreement with the target [steps])."""
    logits = head.unroll(embed, batch["aux"], batch["ids"], steps)
    with torch.no_grad():  # the target's distribution over the draft vocabulary, once for every step
        targets = torch.softmax(batch["final"] @ target_rows.T, dim=-1)  # [B, T, Vd]
    losses, agree = [], []
    for i, step in enumerate(logits):
        p = F.pad(targets[:, 1 + i :], (0, 0, 0, 1 + i))  # the target at position j + 1 + i
        mask = F.pad(batch["loss_mask"][:, 1 + i :], (0, 1 + i)).float()
        ce = -(p * torch.log_softmax(step, dim=-1)).sum(-1)
        count = mask.sum().clamp_min(1.0)
        losses.append((ce * mask).sum() / count)
        agree.append(((step.argmax(-1) == p.argmax(-1)).float() * mask).sum() / count)
    return torch.stack(losses), torch.stack(agree).detach()


def epoch_batches(lengths: list[int], batch_size: int, seed: int) -> list[list[int]]:
    """One epoch's batches: a seeded shuffle, cut into windows of 16 batches whose sequences are
    sorted by length (little padding), the batches then shuffled (no length order in time)."""
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(lengths), generator=generator).tolist()
    window = 16 * batch_size
    batches = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start : start + window], key=lambda i: lengths[i])
        batches += [chunk[k : k + batch_size] for k in range(0, len(chunk), batch_size)]
    return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]


def learning_rate(config: DistillConfig, step: int, total: int) -> float:
    """Linear warm-up over the first 5% of steps, then a cosine decay to a tenth of ``config.lr``."""
    warmup = max(1, total // 20)
    if step < warmup:
        return config.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return config.lr * (0.1 + 0.45 * (1.0 + math.cos(math.pi * progress)))


def train(head: Eagle3Head, target, features: list[dict[str, torch.Tensor]], config: DistillConfig, work: Path,
          progress=None) -> dict:
    """Train ``head`` in place; returns the log (per epoch: loss, per-step agreement; seconds)."""
    device = torch.device(config.device)
    head.to(device).train()
    embed = target.get_input_embeddings()
    target_rows = (target.lm_head.weight[head.draft_to_target.to(target.lm_head.weight.device)]
                   .detach().float().to(device))
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    lengths = [item["ids"].shape[0] for item in features]
    per_epoch = -(-len(features) // config.batch_size)
    total = per_epoch * config.epochs
    state = {"step": 0, "log": [], "seconds": 0.0}
    path = work / CHECKPOINT
    if path.exists():
        saved = torch.load(path, map_location=device, weights_only=False)
        head.load_state_dict(saved["head"])
        optimizer.load_state_dict(saved["optimizer"])
        state = saved["state"]
    weights = torch.tensor([config.step_weight ** i for i in range(config.ttt_steps)], device=device)

    def save() -> None:
        buffer = io.BytesIO()
        torch.save({"head": head.state_dict(), "optimizer": optimizer.state_dict(), "state": state}, buffer)
        atomic_write_bytes(path, buffer.getvalue())

    started = time.perf_counter() - state["seconds"]
    sums, batches = None, None
    while state["step"] < total:
        epoch, position = divmod(state["step"], per_epoch)
        if position == 0 or batches is None:
            batches = epoch_batches(lengths, config.batch_size, config.seed + epoch)
        if position == 0 or sums is None:
            sums = {"loss": 0.0, "agree": torch.zeros(config.ttt_steps), "batches": 0}
        batch = collate([features[i] for i in batches[position]], device)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(config, state["step"], total)
        losses, agree = step_losses(head, embed, target_rows, batch, config.ttt_steps)
        loss = (losses * weights).sum() / weights.sum()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        state["step"] += 1
        sums["loss"] += float(loss.detach())
        sums["agree"] += agree.cpu()
        sums["batches"] += 1
        state["seconds"] = time.perf_counter() - started
        if progress is not None:
            progress(state["step"], total, f"epoch {epoch + 1} loss {float(loss.detach()):.3f}")
        if state["step"] % per_epoch == 0:
            n = sums["batches"]
            state["log"].append({"epoch": epoch + 1, "loss": round(sums["loss"] / n, 4),
                                 "agree_per_step": [round(float(a) / n, 4) for a in sums["agree"]],
                                 "seconds": round(state["seconds"], 1)})
            save()
        elif state["step"] % config.checkpoint_every == 0:
            save()
    head.eval()
    return state
