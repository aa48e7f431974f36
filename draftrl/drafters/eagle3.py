"""An EAGLE-3 draft head over the target's own hidden states, loaded from either published folder layout.

The head (Li et al., EAGLE-3, 2025; the layout vLLM's ``Eagle3LlamaForCausalLM`` loads) is one
Llama decoder layer whose attention reads ``concat(input_layernorm(embed(token)),
hidden_norm(hidden))`` (2H -> heads) where ``hidden`` is, at the first draft step,
``fc(concat(aux_0, aux_1, aux_2))`` (3H -> H) of the target's auxiliary hidden states and, at
later steps, the head's own pre-norm output. Its LM head scores a frequency-ranked *draft
vocabulary* of ``draft_vocab_size`` tokens; ``d2t`` maps a draft id to its target id
(``target = draft + d2t[draft]``). Token embeddings are the target's (shared) unless the folder
carries ``embed_tokens.weight`` (speculators' and SpecForge's heads often do): then the head uses
its own, as vLLM does.

A head folder is ``config.json`` in the speculators or the EAGLE / SpecForge layout
(:mod:`draftrl.drafters.eagle3_config`, which lists each key's default) and one weights file,
``model.safetensors`` or ``pytorch_model.bin`` (read with ``torch.load(weights_only=True)``), or a
hub id (fetched with ``huggingface_hub.snapshot_download``). Weights are named ``fc``,
``midlayer.*`` (or ``layers.0.*``), ``norm``, ``lm_head``, ``d2t``, ``t2d`` (``t2d`` optional, as
vLLM ignores it; ``d2t`` optional when the head scores the whole vocabulary), optionally
``embed_tokens``, and ``input_norm`` / ``fc_norm.i`` for the variants that have them; a missing,
unexpected or misshapen weight is refused in one line naming it.

Auxiliary layer ``l`` is the *input* of the target's decoder layer ``l`` (the output of layer
``l - 1``; ``l = 0`` the embeddings), as vLLM's ``aux_hidden_state_layers`` reads it. A config
without them takes the target's default (2, L // 2, L - 3) when the head is attached to its
target (:func:`check_head_fits`).

Row convention (vLLM's): draft row ``j`` pairs the target's features at position ``j`` with the
token at ``j + 1``, sits at position ``j`` and predicts the token at ``j + 2``. Drafting after a
history of ``L`` tokens therefore needs the target's features at positions ``0..L-2``, exactly
what the engine's target cache holds between rounds.
"""

from __future__ import annotations

import io
import json
import math
import weakref
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

from draftrl.drafters.base import LevelDrafter, TreeBuilder
from draftrl.drafters.eagle3_config import LAYOUTS, Eagle3Config, default_aux_layers, read_config
from draftrl.drafters.tree import DraftTree
from draftrl.models.distribution import SamplingParams, logits_to_probs, sample

__all__ = ["Eagle3Config", "Eagle3Drafter", "Eagle3Head", "check_head_fits", "default_aux_layers", "head_config",
           "head_folder", "random_head"]

#: file names of a head folder: its config and one weights file (safetensors first, as vLLM's loader picks)
CONFIG_FILE, WEIGHTS_FILE, BIN_FILE = "config.json", "model.safetensors", "pytorch_model.bin"
#: ``Eagle3Head.save_pretrained``'s ``weights`` values and the file each writes
WEIGHTS_FORMATS = {"safetensors": WEIGHTS_FILE, "bin": BIN_FILE}
#: weights a head folder may leave out: vLLM ignores ``t2d`` (draftrl rebuilds it from ``d2t``)
OPTIONAL_WEIGHTS = ("t2d",)


class Eagle3Attention(nn.Module):
    """Llama attention whose q/k/v read 2H inputs; keys and values are returned for the caller's cache."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        hidden = config.hidden_size
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or hidden // self.num_heads
        bias = bool(getattr(config, "attention_bias", False))  # as vLLM's Llama attention reads it
        self.q_proj = nn.Linear(2 * hidden, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(2 * hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(2 * hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=bias)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """(q [B, heads, T, d], k, v [B, kv_heads, T, d]) for x [B, T, 2H], rotated at the rows' positions."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, v

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[B, T, H] from q [B, heads, T, d] over keys/values [B, kv_heads, S, d] under a bool mask [.., T, S]."""
        rep = self.num_heads // self.num_kv_heads
        keys, values = keys.repeat_interleave(rep, dim=1), values.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1))


class Eagle3Head(nn.Module):
    """The draft head's weights, named as both layouts store them (``fc``, ``midlayer.*``, ``norm``,
    ``lm_head``, ``d2t``, ``t2d``; ``embed_tokens`` when the head has its own embeddings, else they
    come from the target at call time; ``input_norm`` / ``fc_norm`` for those variants)."""

    def __init__(self, config: Eagle3Config, embed_tokens: bool = False):
        super().__init__()
        self.config = config
        layer, hidden, eps = config.layer, config.layer.hidden_size, config.layer.rms_norm_eps
        width = config.num_aux * config.target_hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, hidden) if embed_tokens else None
        self.input_norm = LlamaRMSNorm(width, eps=eps) if config.norm_before_fc else None
        self.fc_norm = nn.ModuleList([LlamaRMSNorm(config.target_hidden_size, eps=eps) for _ in range(config.num_aux)]
                                     ) if config.fc_norm else None
        self.fc = nn.Linear(width, hidden, bias=False)
        self.midlayer = nn.Module()
        self.midlayer.input_layernorm = LlamaRMSNorm(hidden, eps=eps)
        self.midlayer.hidden_norm = LlamaRMSNorm(hidden, eps=eps)
        self.midlayer.self_attn = Eagle3Attention(layer)
        self.midlayer.post_attention_layernorm = LlamaRMSNorm(hidden, eps=eps)
        self.midlayer.mlp = LlamaMLP(layer)
        self.norm = LlamaRMSNorm(hidden, eps=eps)
        self.lm_head = nn.Linear(hidden, config.draft_vocab_size, bias=False)
        self.rotary = LlamaRotaryEmbedding(layer)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self.t2d[: config.draft_vocab_size] = True  # d2t = 0: the draft vocabulary is the first ids

    def set_draft_vocab(self, target_ids: torch.Tensor) -> None:
        """Use ``target_ids`` [draft_vocab_size] (sorted ascending, as vLLM's d2t offsets assume) as the draft
        vocabulary."""
        ids = torch.as_tensor(target_ids, dtype=torch.long).sort().values
        if ids.numel() != self.config.draft_vocab_size or ids.unique().numel() != ids.numel():
            raise ValueError(f"the draft vocabulary needs {self.config.draft_vocab_size} distinct ids, "
                             f"got {ids.numel()}")
        self.d2t.copy_(ids - torch.arange(ids.numel()))
        self.t2d.zero_()
        self.t2d[ids] = True

    @property
    def draft_to_target(self) -> torch.Tensor:
        """[draft_vocab_size] target id of every draft id."""
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """``fc`` of the target's auxiliary states [..., num_aux * H_target] -> [..., H] (normed first
        in the ``norm_before_fc`` / ``fc_norm`` variants, as vLLM's ``combine_hidden_states``)."""
        if self.input_norm is not None:
            features = self.input_norm(features)
        if self.fc_norm is not None:
            chunks = features.chunk(len(self.fc_norm), dim=-1)
            features = torch.cat([norm(chunk) for norm, chunk in zip(self.fc_norm, chunks)], dim=-1)
        return self.fc(features)

    def qkv(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor):
        """First half of the layer: (q, k, v, residual) for embeds, hidden [B, T, H] at positions [B, T]."""
        mid = self.midlayer
        if self.config.norm_before_residual:
            hidden = mid.hidden_norm(hidden)
            residual = hidden
        else:
            residual, hidden = hidden, mid.hidden_norm(hidden)
        x = torch.cat([mid.input_layernorm(embeds), hidden], dim=-1)
        cos, sin = self.rotary(x, positions)
        return (*mid.self_attn.project(x, cos, sin), residual)

    def finish(self, q, keys, values, mask, residual) -> tuple[torch.Tensor, torch.Tensor]:
        """Second half: (the next step's hidden input [B, T, H]: the pre-norm output, or the normed one
        with ``norm_output``; draft logits [B, T, draft_vocab_size])."""
        mid = self.midlayer
        h = residual + mid.self_attn.attend(q, keys, values, mask)
        out = h + mid.mlp(mid.post_attention_layernorm(h))
        normed = self.norm(out)
        return (normed if self.config.norm_output else out), self.lm_head(normed)

    def unroll(self, embed: nn.Module, features: torch.Tensor, ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Training-time test: ``steps`` draft steps over whole sequences, teacher-forced tokens.

        Step ``i``, row ``j`` reads the token at ``j + 1 + i`` (0 past the end), the target's
        features at ``j`` (step 0) or its own step ``i - 1`` output, sits at position ``j + i`` and
        sees the rows ``<= j`` of step 0 and row ``j`` of steps 1..i: what drafting ``i`` levels
        deep after a history ending at ``j + 1`` sees. Its logits predict the token at ``j + 2 + i``.

        :param embed: the target's token embedding
        :param features: [B, T, len(aux_layers) * H] the target's auxiliary hidden states
        :param ids: [B, T] token ids
        :return: per step, draft logits [B, T, draft_vocab_size]
        """
        b, t = ids.shape
        hidden = self.project(features)
        positions = torch.arange(t, device=ids.device)[None].expand(b, t)
        causal = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()
        diagonal = torch.eye(t, dtype=torch.bool, device=ids.device)
        keys, values, out = [], [], []
        for i in range(steps):
            tokens = F.pad(ids[:, 1 + i :], (0, min(t, 1 + i)))[:, :t]
            q, k, v, residual = self.qkv(embed(tokens).to(hidden.dtype), hidden, positions + i)
            keys.append(k)
            values.append(v)
            mask = torch.cat([causal] + [diagonal] * i, dim=1)[None, None]
            hidden, logits = self.finish(q, torch.cat(keys, dim=2), torch.cat(values, dim=2), mask, residual)
            out.append(logits)
        return out

    def full_logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """[..., V] logits over the target's vocabulary: the draft vocabulary's, -inf elsewhere."""
        full = draft_logits.new_full((*draft_logits.shape[:-1], self.config.vocab_size), -math.inf)
        return full.index_copy_(-1, self.draft_to_target, draft_logits)

    # ------------------------------------------------------------------ the folder
    def save_pretrained(self, path: str | Path, speculative_tokens: int = 4, dtype: torch.dtype = torch.float32,
                        layout: str = "speculators", weights: str = "safetensors") -> Path:
        """Write config.json in ``layout`` (``speculators``, what vLLM documents and ``draftrl distill``
        writes, or ``eagle``, the EAGLE / SpecForge layout SGLang reads) and the weights (``safetensors``
        or ``bin``: ``pytorch_model.bin``), in ``dtype`` (float32 unless a smaller file is wanted).
        Embeddings are written only when the head has its own; ``d2t`` / ``t2d`` only when the head
        scores a draft vocabulary smaller than the target's (vLLM keeps no table otherwise)."""
        from safetensors.torch import save

        from draftrl.io import atomic_write_bytes, atomic_write_text

        if layout not in LAYOUTS:
            raise ValueError(f"layout={layout!r} is unknown; choose one of {', '.join(LAYOUTS)}")
        if weights not in WEIGHTS_FORMATS:
            raise ValueError(f"weights={weights!r} is unknown; choose one of {', '.join(WEIGHTS_FORMATS)}")
        path = Path(path)
        other = next((name for name in WEIGHTS_FORMATS.values() if name != WEIGHTS_FORMATS[weights]
                      and (path / name).exists()), None)
        if other:
            raise ValueError(f"{path} already holds {other}, which would be read instead of (or beside) the new "
                             "weights; write the head into an empty folder")
        config = self.config.to_speculators(speculative_tokens) if layout == "speculators" else self.config.to_eagle()
        full_vocab = self.config.draft_vocab_size == self.config.vocab_size
        tensors = {k: v.detach().contiguous().cpu().clone() for k, v in self.state_dict().items()
                   if not k.startswith("rotary.") and not (full_vocab and k in ("d2t", "t2d"))}
        tensors = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in tensors.items()}
        if weights == "bin":
            buffer = io.BytesIO()
            torch.save(tensors, buffer)
            data = buffer.getvalue()
        else:
            data = save(tensors)
        atomic_write_text(path / CONFIG_FILE, json.dumps(config, indent=2) + "\n")
        atomic_write_bytes(path / WEIGHTS_FORMATS[weights], data)
        return path

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> Eagle3Head:
        """The head in the folder (or hub id) ``path``, in either layout (module docstring).

        :raises FileNotFoundError: no such folder, or a file is missing; :raises ValueError: the config
            or the weights are no EAGLE-3 head's (one line naming the weights at fault)."""
        folder = head_folder(path)
        config = head_config(folder)
        file = weights_file(folder)
        weights = {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v
                   for k, v in _read_weights(file).items()}
        head = cls(config, embed_tokens="embed_tokens.weight" in weights)
        if head.embed_tokens is None and config.target_hidden_size != config.layer.hidden_size:
            raise ValueError(f"{file} has no embed_tokens.weight, but the head's width {config.layer.hidden_size} "
                             f"differs from its target's {config.target_hidden_size}, so it cannot share the target's "
                             "embeddings; use a folder that includes them")
        _check_weights(head, weights, file)
        head.load_state_dict(_vocab_tables(head, weights, file), strict=True)
        return head.to(device=device, dtype=dtype).eval()


def _names(names: list[str], most: int = 6) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _read_weights(file: Path) -> dict[str, torch.Tensor]:
    if file.name == BIN_FILE:
        try:
            weights = torch.load(file, map_location="cpu", weights_only=True)
        except Exception as err:  # torch raises several kinds for a file that is no safe state dict
            raise ValueError(f"{file} is no state dict torch.load(weights_only=True) reads ({type(err).__name__}: "
                             f"{str(err).strip().splitlines()[0] if str(err).strip() else ''})") from None
        if not isinstance(weights, dict) or not all(isinstance(v, torch.Tensor) for v in weights.values()):
            raise ValueError(f"{file} holds no flat dict of tensors (a state dict)")
        return weights
    from safetensors.torch import load_file

    return load_file(str(file))


def _check_weights(head: Eagle3Head, weights: dict[str, torch.Tensor], file: Path) -> None:
    """Refuse, in one line naming them, weights the config has no place for, places without weights
    and weights of the wrong shape."""
    expected = {k: tuple(v.shape) for k, v in head.state_dict().items() if not k.startswith("rotary.")}
    optional = set(OPTIONAL_WEIGHTS) | ({"d2t"} if head.config.draft_vocab_size == head.config.vocab_size else set())
    problems = []
    missing = sorted(set(expected) - set(weights) - optional)
    unexpected = sorted(set(weights) - set(expected))
    if missing:
        problems.append(f"missing {_names(missing)}")
    if unexpected:
        problems.append(f"unexpected {_names(unexpected)}")
    wrong = [f"{k} {list(weights[k].shape)} (config.json: {list(expected[k])})" for k in sorted(weights)
             if k in expected and tuple(weights[k].shape) != expected[k]]
    if wrong:
        problems.append(f"wrong shape {_names(wrong, 3)}")
    if problems:
        raise ValueError(f"{file} does not hold the head its {CONFIG_FILE} describes: {'; '.join(problems)}; "
                         "check that both files come from the same head")


def _vocab_tables(head: Eagle3Head, weights: dict[str, torch.Tensor], file: Path) -> dict[str, torch.Tensor]:
    """``weights`` with ``d2t`` (zeros when absent: the whole vocabulary) and ``t2d`` (rebuilt from
    ``d2t``) filled in, refused when ``d2t`` maps outside the vocabulary or twice to one id, or a
    stored ``t2d`` disagrees with it."""
    config = head.config
    d2t = weights.get("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long)).long()
    targets = torch.arange(config.draft_vocab_size) + d2t
    if int(targets.min()) < 0 or int(targets.max()) >= config.vocab_size or targets.unique().numel() != targets.numel():
        raise ValueError(f"{file}: d2t maps the draft vocabulary outside 0..{config.vocab_size - 1} or twice to one "
                         "id; the head's vocabulary table is corrupt")
    t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
    t2d[targets] = True
    if "t2d" in weights and not torch.equal(weights["t2d"].bool(), t2d):
        raise ValueError(f"{file}: t2d marks other ids than d2t maps to; the head's vocabulary tables disagree")
    return {**weights, "d2t": d2t, "t2d": t2d}


def head_folder(name: str | Path) -> Path:
    """The local folder of the head ``name``: a directory as given, or a hub id (``ORG/NAME``)
    fetched once with ``huggingface_hub.snapshot_download`` (its cache, ``HF_HUB_OFFLINE``, ...).

    :raises FileNotFoundError: neither exists; offline, one line saying how to bring the folder."""
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    text = str(name)
    if path.exists() or text.startswith(("/", ".", "~")) or text.count("/") != 1 or "\\" in text:
        raise FileNotFoundError(f"{name} is no EAGLE-3 head folder: no such directory (a hub id reads ORG/NAME)")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(text, allow_patterns=[CONFIG_FILE, WEIGHTS_FILE, BIN_FILE]))
    except (OSError, ValueError) as err:  # offline, unknown repository, malformed id
        reason = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise FileNotFoundError(f"EAGLE-3 head {text!r} is no local folder and could not be fetched from the Hugging "
                                f"Face hub ({type(err).__name__}: {reason}); download it where the hub is reachable "
                                f"(hf download {text} --local-dir DIR) and pass DIR") from None


def weights_file(folder: Path) -> Path:
    """The head's weights file in ``folder``: ``model.safetensors``, else ``pytorch_model.bin``."""
    for name in (WEIGHTS_FILE, BIN_FILE):
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(f"{folder} is no EAGLE-3 head folder: it has neither {WEIGHTS_FILE} nor {BIN_FILE} "
                            "(a head's weights are one file)")


def head_config(path: str | Path) -> Eagle3Config:
    """The config of the head folder (or hub id) ``path``, in either layout; its auxiliary layers
    are None when the folder leaves them to the target (:func:`check_head_fits` resolves them).

    :raises FileNotFoundError: a file is missing; :raises ValueError: the config is no EAGLE-3 head's.
    """
    folder = head_folder(path)
    file = folder / CONFIG_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{folder} is no EAGLE-3 head folder: it has no {CONFIG_FILE} (the speculators or "
                                "the EAGLE / SpecForge layout, as draftrl distill or SpecForge write them)")
    weights_file(folder)
    try:
        data = json.loads(file.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{file} is no JSON ({err})") from None
    return read_config(data, str(file))


def random_head(target: str | Path, draft_vocab_size: int, seed: int = 0) -> Eagle3Head:
    """A head shaped for the target model folder ``target`` with random weights and the draft
    vocabulary ``0..draft_vocab_size-1``: its drafts are almost never accepted, but it loads and
    costs what a trained head of that shape costs (plumbing checks, draft-cost timing)."""
    from transformers import AutoConfig

    torch.manual_seed(seed)
    head = Eagle3Head(Eagle3Config.for_target(AutoConfig.from_pretrained(target), draft_vocab_size,
                                              verifier=str(target)))
    head.set_draft_vocab(torch.arange(draft_vocab_size))
    return head


def check_head_fits(config: Eagle3Config, target: nn.Module, head_name: str = "the head") -> Eagle3Config:
    """``config`` attached to ``target`` (its auxiliary layers resolved, :meth:`Eagle3Config.for_layers`);
    refused, in one line naming both, when the head's vocabulary, hidden size or layers do not match."""
    tc = target.config
    num_layers = len(target.model.layers) if hasattr(getattr(target, "model", None), "layers") else None
    if num_layers is None:
        raise ValueError(f"an EAGLE-3 head needs a decoder with model.layers (Llama style); "
                         f"{type(target).__name__} has none")
    problems = []
    if config.vocab_size != tc.vocab_size:
        problems.append(f"vocabulary {config.vocab_size} vs the target's {tc.vocab_size}")
    if config.target_hidden_size != tc.hidden_size:
        problems.append(f"hidden size {config.target_hidden_size} vs the target's {tc.hidden_size}")
    try:
        attached = config.for_layers(num_layers)
    except ValueError as err:
        problems.append(f"{err} ({num_layers} layers)")
    if problems:
        name = getattr(tc, "_name_or_path", "") or type(target).__name__
        raise ValueError(f"{head_name} (for {config.verifier or 'another target'}) does not fit the target {name}: "
                         f"{'; '.join(problems)}; distil a head for this target with draftrl distill")
    return attached


class Eagle3Drafter(LevelDrafter):
    """Drafts with an :class:`Eagle3Head` from the target's hidden states (chains and EAGLE-2 style trees).

    The target's auxiliary hidden states are read by forward pre-hooks on its decoder layers; after
    every target forward the engine names the rows that entered the history
    (:meth:`keep_target_rows`), and the drafter keeps their features. With ``target=None`` (and the
    target's token ``embed``ding) no hooks are set: the caller hands the features over itself
    (:meth:`append_features`), as vLLM's proposer does for each of its requests
    (:mod:`draftrl.decoding.vllm.head_proposer`). Its own KV cache holds one
    row per history position that has target features; tree rows are dropped after each round
    (the accepted positions get the target's features instead).

    Deterministic mode (greedy, or ``sampled=False``) takes each node's top children (q = None:
    one-hot); sampled mode draws ``width`` i.i.d. children from q, the head's distribution over the
    draft vocabulary mapped to the target's ids (zero elsewhere) under the round's sampling
    transform, which verification then uses.
    """

    reads_target_rows = True

    def __init__(self, head: Eagle3Head, target: nn.Module | None, sampled: bool = False, name: str = "eagle3",
                 embed: nn.Module | None = None):
        if target is not None:
            head.config = check_head_fits(head.config, target, name)
            embed = target.get_input_embeddings()
        elif embed is None and head.embed_tokens is None:
            raise ValueError("an Eagle3Drafter without a target needs the target's token embedding (embed=...)")
        embed = head.embed_tokens if head.embed_tokens is not None else embed  # the head's own, as vLLM uses them
        if embed.weight.shape[-1] != head.config.layer.hidden_size:
            raise ValueError(f"{name}: the target's embeddings are {embed.weight.shape[-1]} wide, the head's layer "
                             f"{head.config.layer.hidden_size}; such a head must carry its own embed_tokens")
        self.head, self.target, self.sampled, self.name = head.eval(), target, sampled, name
        self.embed = embed
        self.device = next(head.parameters()).device
        self.dtype = next(head.parameters()).dtype
        self._captured: dict[int, torch.Tensor] = {}
        self._hooks = [] if target is None else [
            target.model.layers[layer].register_forward_pre_hook(_capture(self, layer), with_kwargs=True)
            for layer in head.config.aux_layers]
        for handle in self._hooks:
            weakref.finalize(self, handle.remove)
        self.reset([])

    def close(self) -> None:
        """Remove the hooks on the target (the drafter reads no more of its forwards)."""
        for handle in self._hooks:
            handle.remove()

    # ------------------------------------------------------------------ history
    def reset(self, prompt_ids: list[int]) -> None:
        self.features_store = torch.zeros(0, self.head.config.num_aux * self.head.config.target_hidden_size,
                                          device=self.device, dtype=self.dtype)
        self.keys = self.values = None  # [1, kv_heads, rows, d]: committed rows, then this round's tree rows
        self._rows = 0  # committed draft rows (positions 0.._rows-1)
        self._root = None  # (history length, logits [Vd], pre-norm output [H]) at the root

    def keep_target_rows(self, rows: list[int]) -> None:
        """Rows of the target's last forward that entered the history, in position order."""
        if not rows:
            return
        feats = torch.cat([self._captured[layer] for layer in self.head.config.aux_layers], dim=-1)
        self.append_features(feats[torch.tensor(rows, device=feats.device)])

    def append_features(self, features: torch.Tensor) -> None:
        """The target's auxiliary hidden states [n, len(aux_layers) * H] (concatenated in
        ``aux_layers`` order) of the next ``n`` history positions."""
        self.features_store = torch.cat([self.features_store, features.to(self.device, self.dtype)])

    @property
    def num_features(self) -> int:
        """History positions whose target features the drafter holds (0..num_features-1)."""
        return self.features_store.shape[0]

    def commit(self, ids: list[int], accepted: list[int]) -> None:
        self._drop_tree()
        self._root = None

    def rewind(self, length: int) -> None:
        keep = max(0, length - 1)
        self.features_store = self.features_store[:keep]
        self._rows = min(self._rows, keep)
        self._drop_tree()
        self._root = None

    def _drop_tree(self) -> None:
        if self.keys is not None:
            self.keys, self.values = self.keys[:, :, : self._rows], self.values[:, :, : self._rows]

    # ------------------------------------------------------------------ head calls
    def _embed(self, tokens: list[int]) -> torch.Tensor:
        ids = torch.tensor([tokens], device=self.embed.weight.device)
        return self.embed(ids).to(self.device, self.dtype)

    def _run(self, tokens, hidden, positions, allowed) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed rows (tokens, hidden [1, T, H], positions) under a bool mask [T, cache + T]; their k/v join the
        cache."""
        q, k, v, residual = self.head.qkv(self._embed(tokens), hidden,
                                          torch.tensor([positions], device=self.device))
        if self.keys is not None:
            k, v = torch.cat([self.keys, k], dim=2), torch.cat([self.values, v], dim=2)
        self.keys, self.values = k, v
        out, logits = self.head.finish(q, k, v, allowed.to(self.device)[None, None], residual)
        return out[0], logits[0].float()

    @torch.inference_mode()
    def root(self, ids: list[int]):
        """(logits [Vd], pre-norm output [H]) of the head for the token after ``ids``, or None without features."""
        if self._root is not None and self._root[0] == len(ids):
            return self._root[1:]
        last = len(ids) - 2  # the root's row: features at L-2, token ids[L-1]
        if last < 0 or self.features_store.shape[0] <= last:
            return None
        if self._rows > last:  # the root was forgotten with no new row (a rewind or commit to the same history)
            self._rows = last
        self._drop_tree()  # rows of an uncommitted proposal (vLLM's proposer commits nothing; a lookup round drafted)
        start = self._rows
        hidden = self.head.project(self.features_store[start : last + 1])[None]
        n = last + 1 - start
        allowed = torch.ones(n, last + 1, dtype=torch.bool).tril(start)
        out, logits = self._run(ids[start + 1 : last + 2], hidden, list(range(start, last + 1)), allowed)
        self._rows = last + 1
        self._root = (len(ids), logits[-1], out[-1])
        return self._root[1:]

    def features(self, ids: list[int]) -> dict[str, float]:
        root = self.root(ids)
        if root is None:
            return {}
        probs = torch.softmax(root[0], dim=-1)
        entropy = -(probs * probs.clamp_min(1e-30).log()).sum().item()
        return {"draft_top1_prob": probs.max().item(), "draft_entropy": entropy}

    def children(self, logits: torch.Tensor, width: int, params: SamplingParams, generator):
        """(target ids [W], log q [W], q [V] or None) for one expanded node (logits over the draft vocabulary)."""
        full = self.head.full_logits(logits)
        if self.sampled and not params.greedy:
            q = logits_to_probs(full, params)
            if generator is not None:
                q = q.to(generator.device)
            tokens = sample(q, generator, num_samples=width)
            return tokens, q[tokens].clamp_min(1e-30).log(), q
        top = torch.topk(torch.log_softmax(full, dim=-1), min(width, self.head.config.draft_vocab_size))
        return top.indices, top.values, None

    def begin(self, ids, width, params, generator) -> TreeBuilder:
        self._drop_tree()  # rows of an earlier proposal that was never committed
        return _Eagle3TreeBuilder(self, ids, width, params, generator)


def _capture(drafter: Eagle3Drafter, layer: int):
    """A pre-hook storing layer ``layer``'s input hidden states [rows, H] (batch row 0) on ``drafter``."""
    ref = weakref.ref(drafter)

    def hook(module, args, kwargs):
        owner = ref()
        if owner is not None:
            hidden = args[0] if args else kwargs["hidden_states"]
            owner._captured[layer] = hidden[0].detach()

    return hook


class _Eagle3TreeBuilder(TreeBuilder):
    """One level per step: a batched head forward over the previous level's ``width`` best nodes,
    each row seeing the committed rows and its own ancestors."""

    def __init__(self, drafter: Eagle3Drafter, ids, width, params, generator):
        self.drafter, self.ids, self.width, self.params, self.generator = drafter, ids, width, params, generator
        self.tree = DraftTree(q={} if drafter.sampled and not params.greedy else None)
        self.frontier: list[tuple[int, torch.Tensor, torch.Tensor]] | None = None  # (node, logits, output)
        self.to_feed: list[int] = []
        self.outputs: dict[int, torch.Tensor] = {}  # node -> the pre-norm output of its parent's row
        self.fed: list[int] = []  # tree nodes in the head's cache, in cache order

    @torch.inference_mode()
    def step(self) -> bool:
        drafter, tree = self.drafter, self.tree
        if self.frontier is None:
            tree.features = drafter.features(self.ids)
            root = drafter.root(self.ids)
            if root is None:
                return False
            self.frontier = [(-1, root[0], root[1])]
        elif self.to_feed:
            rows, n = drafter._rows, len(self.to_feed)
            col = {node: rows + k for k, node in enumerate(self.fed + self.to_feed)}
            allowed = torch.zeros(n, rows + len(self.fed) + n, dtype=torch.bool)
            allowed[:, :rows] = True
            for r, node in enumerate(self.to_feed):
                while node >= 0:
                    allowed[r, col[node]] = True
                    node = tree.parents[node]
            hidden = torch.stack([self.outputs[node] for node in self.to_feed])[None]
            positions = [len(self.ids) - 2 + tree.depths[node] for node in self.to_feed]
            out, logits = drafter._run([tree.tokens[node] for node in self.to_feed], hidden, positions, allowed)
            self.fed += self.to_feed
            self.frontier = [(node, logits[r], out[r]) for r, node in enumerate(self.to_feed)]
        candidates = []
        for parent, logits, out in self.frontier:
            tokens, logq, q = drafter.children(logits, self.width, self.params, self.generator)
            if q is not None:
                tree.q[parent] = q
            base = 0.0 if parent < 0 else tree.scores[parent]
            candidates += [(base + lq, tok, parent, out) for tok, lq in zip(tokens.tolist(), logq.tolist())]
        if tree.q is None:
            candidates.sort(key=lambda c: -c[0])
            candidates = candidates[: self.width]
        level = []
        for score, tok, parent, out in candidates:
            node = tree.add(tok, parent, score)
            self.outputs[node] = out
            level.append(node)
        self.to_feed = sorted(sorted(level, key=lambda i: -tree.scores[i])[: self.width])
        return bool(level)
