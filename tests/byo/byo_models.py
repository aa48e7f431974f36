"""Builders of a GPU user's own models, shrunk to CPU size (imported by ``tests/byo/conftest.py``).

Each writes a folder the way a user's checkpoint looks: ``save_pretrained`` for models and their
tokenizer, the published layouts for EAGLE-3 heads. No download: the tokenizer is a byte-level BPE
trained here, in milliseconds, on draftrl's shipped prompts (four languages and code).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from draftrl.distill.train import init_head
from draftrl.drafters.eagle3 import Eagle3Config, Eagle3Head
from draftrl.prompts import load_prompts

#: BPE vocabulary (the 256 byte symbols, merges, then SPECIAL_TOKENS)
TOKENIZER_VOCAB = 1024
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
#: ChatML, as SmolLM2 and Qwen write it
CHAT_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
                 "'<|im_end|>' + '\n' }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
#: the target's shape: hidden size and head_dim 64 (head sizes vLLM's CPU attention supports), two query
#: heads over one KV head (grouped-query attention, as Llama-3.1-8B), 8 layers so that EAGLE-3's default
#: auxiliary layers (2, L // 2, L - 3) = (2, 4, 5) are distinct
TARGET_SHAPE = dict(hidden_size=64, head_dim=64, num_attention_heads=2, num_key_value_heads=1, intermediate_size=128,
                    num_hidden_layers=8, max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=False)
#: the target's layers 2.. write into the residual stream scaled by this, so that the 2-layer draft
#: (the target's first layers) often predicts what the whole target does: its drafts are accepted and
#: rejected, about 0.3-1.7 tokens a depth-3 round (with all layers random, every draft was rejected)
LATE_LAYER_SCALE = 0.1
#: rows "my draft" adds past the tokenizer (``resize_token_embeddings(len + DRAFT_PADDING)``)
DRAFT_PADDING = 64
#: the pipeline suite's workload (``conftest.byo_pipeline``, env keys): two English tasks, copy-heavy and
#: open-ended, one prompt each per split, 24 tokens (the tiny target writes loops of a few tokens there,
#: so the draft model is accepted about half the time)
WORKLOAD = dict(languages=["en"], tasks=["code_edit", "chat"], limit_per_group=1, max_new_tokens=24)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE of ``TOKENIZER_VOCAB`` ids trained on the shipped prompts (any text encodes:
    the 256 bytes are symbols), ChatML specials and template, EOS ``<|im_end|>``. Deterministic."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TOKENIZER_VOCAB, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator([p.prompt for p in load_prompts()], trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        bos_token="<|endoftext|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_target(out: Path, seed: int = 0) -> Path:
    """"My target": a random Llama of ``TARGET_SHAPE`` over :func:`build_tokenizer`'s ids (layers 2..
    scaled by ``LATE_LAYER_SCALE``), saved with its tokenizer (float32 weights: a user's float32 or
    bfloat16 checkpoint loads either way)."""
    tokenizer = build_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **TARGET_SHAPE)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # layers 2.. write less into the residual stream: earlier layers predict the output often
        for layer in model.model.layers[2:]:
            layer.self_attn.o_proj.weight.mul_(LATE_LAYER_SCALE)
            layer.mlp.down_proj.weight.mul_(LATE_LAYER_SCALE)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def build_draft(out: Path, target: Path, layers: int = 2) -> Path:
    """"My draft": the target's first ``layers`` layers, final norm and output rows (so that it agrees
    with the target often), its embedding matrix padded by ``DRAFT_PADDING`` rows past the shared
    tokenizer (``resize_token_embeddings``), as a smaller model of a family can be."""
    big = LlamaForCausalLM.from_pretrained(target)
    config = LlamaConfig(**{**big.config.to_dict(), "num_hidden_layers": layers})
    draft = LlamaForCausalLM(config)
    draft.load_state_dict(big.state_dict(), strict=False)  # layers past `layers` have no place
    tokenizer = AutoTokenizer.from_pretrained(target)
    draft.resize_token_embeddings(len(tokenizer) + DRAFT_PADDING)
    draft.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def frequent_ids(target: Path, count: int) -> torch.Tensor:
    """The ``count`` ids the target predicts most often (greedy, at every position of the shipped tune
    prompts, one forward each), then the lowest ids: a draft vocabulary ranked by frequency in the
    target's own predictions, as EAGLE-3 ranks one."""
    model, tokenizer = LlamaForCausalLM.from_pretrained(target).eval(), AutoTokenizer.from_pretrained(target)
    counts = torch.zeros(model.config.vocab_size)
    for prompt in load_prompts(split="tune", limit_per_group=1):
        ids = torch.tensor([tokenizer(prompt.prompt)["input_ids"][:256]])
        with torch.no_grad():
            counts += torch.bincount(model(ids).logits[0].argmax(-1), minlength=counts.numel()).float()
    order = sorted(range(counts.numel()), key=lambda i: (-float(counts[i]), i))
    return torch.tensor(order[:count])


def workload_prompts(tokenizer) -> list[tuple[str, list[int]]]:
    """``(id, ids)`` of :data:`WORKLOAD`'s prompts of both splits, as draftrl encodes them (the chat template)."""
    from draftrl.models.chat import user_message_ids

    return [(p.id, user_message_ids(tokenizer, p.prompt)) for split in ("tune", "heldout")
            for p in load_prompts(split=split, limit_per_group=WORKLOAD["limit_per_group"])
            if p.language in WORKLOAD["languages"] and p.task in WORKLOAD["tasks"]]


def most_written_token(target: Path) -> int:
    """The token ``target`` writes most often in its greedy continuations of :data:`WORKLOAD`'s prompts
    (float32, ``max_new_tokens`` each; the lowest id on ties)."""
    model, tokenizer = LlamaForCausalLM.from_pretrained(target).eval(), AutoTokenizer.from_pretrained(target)
    counts = torch.zeros(model.config.vocab_size)
    for _, ids in workload_prompts(tokenizer):
        out = model.generate(torch.tensor([ids]), max_new_tokens=WORKLOAD["max_new_tokens"], do_sample=False,
                             eos_token_id=None, pad_token_id=tokenizer.pad_token_id)[0, len(ids):]
        counts += torch.bincount(out, minlength=counts.numel()).float()
    return int(counts.argmax())


def build_head(out: Path, target: Path, *, layout: str, weights: str, draft_vocab_size: int | None = None,
               draft_ids: list[int] | None = None, bare: bool = False, seed: int = 0) -> Path:
    """An EAGLE-3 head for ``target`` written in ``layout`` (``eagle`` or ``speculators``) with
    ``weights`` (``bin`` or ``safetensors``): EAGLE-3's default auxiliary layers of the target,
    the target's output rows of its draft vocabulary (``draft_vocab_size`` most frequent ids, or the ids
    ``draft_ids``; neither: the whole vocabulary, written without ``d2t``) and ``fc`` passing the deepest
    auxiliary layer through (``draftrl distill``'s starting point, untrained: its drafts are rarely accepted;
    the head predicts two tokens ahead of the features it reads; a one-id draft vocabulary drafts that id
    every time, accepted wherever the target writes it).
    ``bare`` (speculators only) leaves out the optional keys: ``eagle_aux_hidden_state_layer_ids``,
    ``norm_before_residual`` (then False, speculators' default) and ``target_hidden_size``."""
    if draft_vocab_size and draft_ids:
        raise ValueError("pass draft_vocab_size or draft_ids, not both")
    model = LlamaForCausalLM.from_pretrained(target).eval()
    vocab = draft_vocab_size or (len(draft_ids) if draft_ids else model.config.vocab_size)
    config = Eagle3Config.for_target(model.config, vocab, verifier=str(target), norm_before_residual=not bare)
    torch.manual_seed(seed)
    head = Eagle3Head(config)
    if draft_vocab_size:
        head.set_draft_vocab(frequent_ids(target, draft_vocab_size))
    elif draft_ids:
        head.set_draft_vocab(torch.tensor(draft_ids))
    init_head(head, model)
    head.save_pretrained(out, speculative_tokens=3, layout=layout, weights=weights)
    if bare:
        data = json.loads((out / "config.json").read_text())
        for key in ("eagle_aux_hidden_state_layer_ids", "norm_before_residual", "target_hidden_size"):
            data.pop(key)
        (out / "config.json").write_text(json.dumps(data, indent=2) + "\n")
    return out
