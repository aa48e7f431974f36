"""An EAGLE-3 draft head over the target's own hidden states, in the ``speculators`` folder format.

The head (Li et al., EAGLE-3, 2025; the layout vLLM's ``Eagle3LlamaForCausalLM`` loads) is one
Llama decoder layer whose attention reads ``concat(input_layernorm(embed(token)),
hidden_norm(hidden))`` (2H -> heads) where ``hidden`` is, at the first draft step,
``fc(concat(aux_0, aux_1, aux_2))`` (3H -> H) of the target's auxiliary hidden states and, at
later steps, the head's own pre-norm output. Its LM head scores a frequency-ranked *draft
vocabulary* of ``draft_vocab_size`` tokens; ``d2t`` maps a draft id to its target id
(``target = draft + d2t[draft]``). Token embeddings are the target's (shared, never saved).

Auxiliary layer ``l`` is the *input* of the target's decoder layer ``l`` (the output of layer
``l - 1``; ``l = 0`` the embeddings), as vLLM's ``aux_hidden_state_layers`` reads it.

Row convention (vLLM's): draft row ``j`` pairs the target's features at position ``j`` with the
token at ``j + 1``, sits at position ``j`` and predicts the token at ``j + 2``. Drafting after a
history of ``L`` tokens therefore needs the target's features at positions ``0..L-2``, exactly
what the engine's target cache holds between rounds.
"""

from __future__ import annotations

import json
import math
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

from draftrl.drafters.base import LevelDrafter, TreeBuilder
from draftrl.drafters.tree import DraftTree
from draftrl.models.distribution import SamplingParams, logits_to_probs, sample

#: file names of the speculators format
CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's (and vLLM's) default auxiliary layers: (2, n // 2, n - 3); (2, 15, 27) for 30 layers."""
    if num_layers < 4:
        raise ValueError(f"a {num_layers}-layer target has no default auxiliary layers; set them explicitly")
    return (2, num_layers // 2, num_layers - 3)


@dataclass
class Eagle3Config:
    """What a head is: its Llama layer's shape and how it hangs off its target."""

    layer: LlamaConfig
    """the decoder layer (hidden size, heads, rope, vocab_size = the target's vocabulary)"""
    draft_vocab_size: int
    """tokens the head scores (a frequency-ranked subset of the target's vocabulary)"""
    target_hidden_size: int
    aux_layers: tuple[int, ...]
    """the target layers whose inputs feed ``fc`` (see the module docstring)"""
    verifier: str = ""
    """the target's name or local path (``speculators_config.verifier.name_or_path``)"""
    norm_before_residual: bool = True
    """speculators' default: the hidden input is normed before it becomes the residual"""

    @classmethod
    def for_target(cls, target_config, draft_vocab_size: int, aux_layers: tuple[int, ...] | None = None,
                   verifier: str = "") -> "Eagle3Config":
        """A head shaped like one of the target's layers (same width, heads and rope)."""
        layer = LlamaConfig(**{k: v for k, v in target_config.to_dict().items()
                               if k not in ("architectures", "model_type", "transformers_version")})
        layer.num_hidden_layers = 1
        layer.architectures = ["LlamaForCausalLM"]
        if not 1 <= draft_vocab_size <= target_config.vocab_size:
            raise ValueError(f"draft_vocab_size={draft_vocab_size} must lie in 1..{target_config.vocab_size}")
        layers = tuple(aux_layers) if aux_layers else default_aux_layers(target_config.num_hidden_layers)
        if not all(0 <= l < target_config.num_hidden_layers for l in layers):
            raise ValueError(f"aux layers {layers} must lie in 0..{target_config.num_hidden_layers - 1}")
        return cls(layer, draft_vocab_size, target_config.hidden_size, layers, verifier)

    @property
    def vocab_size(self) -> int:
        return self.layer.vocab_size

    def to_speculators(self, speculative_tokens: int = 4) -> dict:
        """config.json of the speculators format (what vLLM's ``eagle3`` method loads)."""
        layer = self.layer.to_dict()
        layer.update(model_type="llama", architectures=["LlamaForCausalLM"], num_hidden_layers=1)
        return {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "speculators_version": "0.9.0",
            "transformer_layer_config": layer,
            "draft_vocab_size": self.draft_vocab_size,
            "target_hidden_size": self.target_hidden_size,
            "eagle_aux_hidden_state_layer_ids": list(self.aux_layers),
            "norm_before_residual": self.norm_before_residual,
            "speculators_config": {
                "algorithm": "eagle3",
                "default_proposal_method": "greedy",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens}],
                "verifier": {"name_or_path": self.verifier, "architectures": ["LlamaForCausalLM"]},
            },
        }

    @classmethod
    def from_speculators(cls, data: dict) -> "Eagle3Config":
        if data.get("speculators_model_type") != "eagle3":
            raise ValueError(f"speculators_model_type is {data.get('speculators_model_type')!r}, not 'eagle3'")
        layer = LlamaConfig(**{k: v for k, v in data["transformer_layer_config"].items()
                               if k not in ("model_type", "transformers_version")})
        return cls(layer, int(data["draft_vocab_size"]), int(data.get("target_hidden_size") or layer.hidden_size),
                   tuple(data["eagle_aux_hidden_state_layer_ids"]),
                   data["speculators_config"]["verifier"].get("name_or_path", ""),
                   bool(data.get("norm_before_residual", True)))


class Eagle3Attention(nn.Module):
    """Llama attention whose q/k/v read 2H inputs; keys and values are returned for the caller's cache."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        hidden = config.hidden_size
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or hidden // self.num_heads
        self.q_proj = nn.Linear(2 * hidden, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * hidden, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * hidden, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=False)

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
    """The draft head's weights, named as the speculators format stores them (``fc``, ``midlayer.*``,
    ``norm``, ``lm_head``, ``d2t``, ``t2d``). Embeddings come from the target at call time."""

    def __init__(self, config: Eagle3Config):
        super().__init__()
        self.config = config
        layer, hidden = config.layer, config.layer.hidden_size
        if config.target_hidden_size != hidden:
            raise ValueError(f"the head's hidden size {hidden} must equal the target's {config.target_hidden_size}")
        self.fc = nn.Linear(len(config.aux_layers) * config.target_hidden_size, hidden, bias=False)
        self.midlayer = nn.Module()
        self.midlayer.input_layernorm = LlamaRMSNorm(hidden, eps=layer.rms_norm_eps)
        self.midlayer.hidden_norm = LlamaRMSNorm(hidden, eps=layer.rms_norm_eps)
        self.midlayer.self_attn = Eagle3Attention(layer)
        self.midlayer.post_attention_layernorm = LlamaRMSNorm(hidden, eps=layer.rms_norm_eps)
        self.midlayer.mlp = LlamaMLP(layer)
        self.norm = LlamaRMSNorm(hidden, eps=layer.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, config.draft_vocab_size, bias=False)
        self.rotary = LlamaRotaryEmbedding(layer)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))

    def set_draft_vocab(self, target_ids: torch.Tensor) -> None:
        """Use ``target_ids`` [draft_vocab_size] (sorted ascending, as vLLM's d2t offsets assume) as the draft vocabulary."""
        ids = torch.as_tensor(target_ids, dtype=torch.long).sort().values
        if ids.numel() != self.config.draft_vocab_size or ids.unique().numel() != ids.numel():
            raise ValueError(f"the draft vocabulary needs {self.config.draft_vocab_size} distinct ids, got {ids.numel()}")
        self.d2t.copy_(ids - torch.arange(ids.numel()))
        self.t2d.zero_()
        self.t2d[ids] = True

    @property
    def draft_to_target(self) -> torch.Tensor:
        """[draft_vocab_size] target id of every draft id."""
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

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
        """Second half: (pre-norm output [B, T, H], draft logits [B, T, draft_vocab_size])."""
        mid = self.midlayer
        h = residual + mid.self_attn.attend(q, keys, values, mask)
        out = h + mid.mlp(mid.post_attention_layernorm(h))
        return out, self.lm_head(self.norm(out))

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
        hidden = self.fc(features)
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

    # ------------------------------------------------------------------ the speculators folder
    def save_pretrained(self, path: str | Path, speculative_tokens: int = 4, dtype: torch.dtype = torch.float32) -> Path:
        """Write config.json and model.safetensors (weights in ``dtype``, float32 unless a smaller file
        is wanted; embeddings omitted: shared with the target)."""
        from safetensors.torch import save

        from draftrl.io import atomic_write_bytes, atomic_write_text

        path = Path(path)
        atomic_write_text(path / CONFIG_FILE, json.dumps(self.config.to_speculators(speculative_tokens), indent=2) + "\n")
        tensors = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items() if not k.startswith("rotary.")}
        atomic_write_bytes(path / WEIGHTS_FILE, save({k: (v.to(dtype) if v.is_floating_point() else v)
                                                     for k, v in tensors.items()}))
        return path

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> "Eagle3Head":
        from safetensors.torch import load_file

        path = Path(path)
        head = cls(head_config(path))
        weights = {k.replace("layers.0.", "midlayer."): v for k, v in load_file(str(path / WEIGHTS_FILE)).items()
                   if not k.startswith("embed_tokens")}
        head.load_state_dict(weights, strict=False)
        missing = set(head.state_dict()) - set(weights) - {k for k in head.state_dict() if k.startswith("rotary.")}
        if missing:
            raise ValueError(f"{path / WEIGHTS_FILE} lacks {sorted(missing)}")
        return head.to(device=device, dtype=dtype).eval()


def head_config(path: str | Path) -> Eagle3Config:
    """The config of the head folder ``path`` (``config.json`` + ``model.safetensors``, speculators format).

    :raises FileNotFoundError: a file is missing; :raises ValueError: the config is no EAGLE-3 head's.
    """
    path = Path(path)
    if not (path / CONFIG_FILE).is_file() or not (path / WEIGHTS_FILE).is_file():
        raise FileNotFoundError(f"{path} is no EAGLE-3 head folder: it needs {CONFIG_FILE} and {WEIGHTS_FILE} "
                                "(the speculators format that draftrl distill writes)")
    try:
        return Eagle3Config.from_speculators(json.loads((path / CONFIG_FILE).read_text()))
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path / CONFIG_FILE} is no EAGLE-3 head's config ({type(err).__name__}: {err}); "
                         "point at a folder written by Eagle3Head.save_pretrained or draftrl distill") from None


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


def check_head_fits(config: Eagle3Config, target: nn.Module, head_name: str = "the head") -> None:
    """Refuse, in one line naming both, a head whose vocabulary, hidden size or layers do not match ``target``."""
    tc = target.config
    num_layers = len(target.model.layers) if hasattr(getattr(target, "model", None), "layers") else None
    if num_layers is None:
        raise ValueError(f"an EAGLE-3 head needs a decoder with model.layers (Llama style); {type(target).__name__} has none")
    problems = []
    if config.vocab_size != tc.vocab_size:
        problems.append(f"vocabulary {config.vocab_size} vs the target's {tc.vocab_size}")
    if config.target_hidden_size != tc.hidden_size:
        problems.append(f"hidden size {config.target_hidden_size} vs the target's {tc.hidden_size}")
    if max(config.aux_layers) >= num_layers:
        problems.append(f"aux layers {list(config.aux_layers)} vs the target's {num_layers} layers")
    if problems:
        name = getattr(tc, "_name_or_path", "") or type(target).__name__
        raise ValueError(f"{head_name} (for {config.verifier or 'another target'}) does not fit the target {name}: "
                         f"{'; '.join(problems)}; distil a head for this target with draftrl distill")


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
            check_head_fits(head.config, target, name)
            embed = target.get_input_embeddings()
        elif embed is None:
            raise ValueError("an Eagle3Drafter without a target needs the target's token embedding (embed=...)")
        self.head, self.target, self.sampled, self.name = head.eval(), target, sampled, name
        self.embed = embed
        self.device = next(head.parameters()).device
        self.dtype = next(head.parameters()).dtype
        self._captured: dict[int, torch.Tensor] = {}
        self._hooks = [] if target is None else [
            target.model.layers[l].register_forward_pre_hook(_capture(self, l), with_kwargs=True)
            for l in head.config.aux_layers]
        for handle in self._hooks:
            weakref.finalize(self, handle.remove)
        self.reset([])

    def close(self) -> None:
        """Remove the hooks on the target (the drafter reads no more of its forwards)."""
        for handle in self._hooks:
            handle.remove()

    # ------------------------------------------------------------------ history
    def reset(self, prompt_ids: list[int]) -> None:
        self.features_store = torch.zeros(0, len(self.head.config.aux_layers) * self.head.config.target_hidden_size,
                                          device=self.device, dtype=self.dtype)
        self.keys = self.values = None  # [1, kv_heads, rows, d]: committed rows, then this round's tree rows
        self._rows = 0  # committed draft rows (positions 0.._rows-1)
        self._root = None  # (history length, logits [Vd], pre-norm output [H]) at the root

    def keep_target_rows(self, rows: list[int]) -> None:
        """Rows of the target's last forward that entered the history, in position order."""
        if not rows:
            return
        feats = torch.cat([self._captured[l] for l in self.head.config.aux_layers], dim=-1)
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
        """Feed rows (tokens, hidden [1, T, H], positions) under a bool mask [T, cache + T]; their k/v join the cache."""
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
        hidden = self.head.fc(self.features_store[start : last + 1])[None]
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
