"""Stand-ins for what a user brings (a target of their own, an EAGLE-3 head, a draft model) and
policies trained with them, small enough for CPU tests and loadable by vLLM's CPU build.

- :func:`tiny_target`: a random 4-layer Llama saved with ``save_pretrained`` and SmolLM2's
  tokenizer (vocabulary 49,152), head size 64 (vLLM's CPU attention needs it), that writes a
  newline at about a third of its greedy positions on the training prompts (its output row for
  the newline points along its mean last hidden state) and varied tokens elsewhere;
- :func:`tiny_draft`: a 2-layer Llama, the target's embeddings, first two layers and output
  layer: its greedy drafts agree with the target's at about 70% of positions (the target's last
  two layers write at a tenth of their scale);
- :func:`tiny_head`: an EAGLE-3 head in the speculators format (``Eagle3Head.save_pretrained``)
  whose one-token draft vocabulary is the newline: drafts accepted where the target writes one;
- :func:`train_policy`: traces collected with the drafter, then PPO on ``TraceReplay-v0`` (seconds).

Test modules import the fixtures they need (``from tiny_byo import byo_models, head_run, draft_run``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

#: the workload the policies are trained on: two prompts, 24 tokens, depths 1, 2, 4 (a policy that always
#: drafts, so its bundle always speculates)
WORKLOAD = dict(languages=("en",), tasks=("code_edit",), limit_per_group=2, max_new_tokens=24,
                depths=(1, 2, 4), seed=0)


def _config(layers: int):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=49152, hidden_size=128, intermediate_size=256, num_hidden_layers=layers,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=2048,
                       bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, initializer_range=0.1)


def training_prompts(tokenizer) -> list[list[int]]:
    """The workload's prompts as draftrl encodes them (the chat template)."""
    from draftrl.models.chat import user_message_ids
    from draftrl.prompts import load_prompts

    prompts = [p for p in load_prompts(None, split="tune") if p.language == "en" and p.task == "code_edit"]
    return [user_message_ids(tokenizer, p.prompt) for p in prompts[: WORKLOAD["limit_per_group"]]]


def newline(tokenizer) -> int:
    return tokenizer("\n", add_special_tokens=False)["input_ids"][0]


def tiny_target(folder: Path, tokenizer_source: Path, seed: int = 0) -> Path:
    """A random 4-layer Llama with SmolLM2's tokenizer, saved to ``folder`` (module docstring)."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(_config(4)).eval()
    with torch.no_grad():
        for layer in model.model.layers[2:]:
            layer.self_attn.o_proj.weight.mul_(0.1)
            layer.mlp.down_proj.weight.mul_(0.1)
        hidden = torch.cat([model.model(torch.tensor([ids])).last_hidden_state[0]
                            for ids in training_prompts(tokenizer)]).mean(0)
        scale = 0.3 * 3 * model.lm_head.weight.norm(dim=1).mean()
        model.lm_head.weight[newline(tokenizer)] = scale * hidden / hidden.norm()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def tiny_draft(folder: Path, target: Path) -> Path:
    """A 2-layer draft model of the target's family: its embeddings, first two layers, norm and output layer."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    full = LlamaForCausalLM.from_pretrained(target)
    draft = LlamaForCausalLM(_config(2)).eval()
    state = {k: v for k, v in full.state_dict().items()
             if not k.startswith("model.layers.") or int(k.split(".")[2]) < 2}
    draft.load_state_dict(state)
    draft.save_pretrained(folder)
    AutoTokenizer.from_pretrained(target).save_pretrained(folder)
    return folder


def tiny_head(folder: Path, target: Path) -> Path:
    """A speculators-format EAGLE-3 head for the target (aux layers 1, 2, 3) whose one-token draft
    vocabulary is the newline: every draft is a newline."""
    from transformers import AutoConfig, AutoTokenizer

    from draftrl.drafters.eagle3 import Eagle3Config, Eagle3Head

    torch.manual_seed(0)
    head = Eagle3Head(Eagle3Config.for_target(AutoConfig.from_pretrained(target), 1, (1, 2, 3), str(target)))
    head.set_draft_vocab(torch.tensor([newline(AutoTokenizer.from_pretrained(target))]))
    return head.save_pretrained(folder, speculative_tokens=3)


def train_policy(out: Path, traces: Path, target: Path, drafter: str) -> Path:
    """Collect greedy traces of ``target`` with ``drafter`` and a cost table, then train PPO on them."""
    from draftrl.config import from_dict
    from draftrl.config.env import EnvConfig
    from draftrl.decoding.build import build_engine
    from draftrl.replay.traces import collect
    from draftrl.train import ppo_size
    from draftrl.train.config import TrainConfig

    config = EnvConfig(target=str(target), drafter=drafter, **WORKLOAD)
    engine, tokenizer = build_engine(config)
    collect(config, engine, tokenizer).save(traces)
    _cost_table().save(traces / "cost_table.json")
    cfg = from_dict(TrainConfig, {
        "env": {"id": "draftrl/TraceReplay-v0", "traces": str(traces), "target": str(target), "drafter": drafter,
                **WORKLOAD},
        "total_timesteps": 2048, "ppo": {"n_steps": 64, "batch_size": 64}, "checkpoint_every": 256,
        "eval_episodes": 2, "baselines": [], "progress_bar": False,
    })
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "disabled")
        ppo_size.train(cfg, out)
    return out


def _cost_table():
    """Step costs of the shape ``draftrl calibrate`` writes (verification at 1..16 tokens, two contexts)."""
    from draftrl.signals.costs import CostTable

    return CostTable(
        num_tokens=[1, 2, 4, 8, 16], context_lens=[64, 512],
        verify_seconds=[[0.02, 0.021, 0.024, 0.03, 0.045], [0.025, 0.026, 0.03, 0.037, 0.055]],
        draft_widths=[1, 2, 4], draft_level_seconds=[1e-3, 1.5e-3, 2e-3], draft_base_seconds=2e-4,
        sample_base_seconds=1e-3, sample_token_seconds=2e-4, noise=0.05,
    )


@pytest.fixture(scope="session")
def byo_models(tmp_path_factory) -> dict[str, Path]:
    """``{"target", "head", "draft"}``: the user's own target, EAGLE-3 head and draft model folders."""
    from draftrl.models.fetch import fetch_model

    root = tmp_path_factory.mktemp("byo")
    target = tiny_target(root / "my-target", fetch_model("smollm2-135m", quiet=True))
    return {"target": target, "head": tiny_head(root / "my-head", target), "draft": tiny_draft(root / "my-draft", target)}


@pytest.fixture(scope="session")
def head_run(byo_models, tmp_path_factory) -> Path:
    """A policy trained with the EAGLE-3 head as its drafter."""
    root = tmp_path_factory.mktemp("head_run")
    return train_policy(root / "run", root / "traces", byo_models["target"], f"eagle3:{byo_models['head']}")


@pytest.fixture(scope="session")
def draft_run(byo_models, tmp_path_factory) -> Path:
    """A policy trained with the 2-layer draft model as its drafter."""
    root = tmp_path_factory.mktemp("draft_run")
    return train_policy(root / "run", root / "traces", byo_models["target"], str(byo_models["draft"]))
