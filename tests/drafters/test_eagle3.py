"""The EAGLE-3 head as a drafter: fed the target's hidden states at the right positions, greedy
output identical to the target's, its chains the ones training unrolls, its folder in the
speculators format, and a head for another target refused in one line naming both."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder
from draftrl.drafters.eagle3 import Eagle3Config, Eagle3Drafter, Eagle3Head, default_aux_layers
from draftrl.models.distribution import SamplingParams, generator_for

AUX = (1, 2, 3)
PROMPT = [1, 5, 7, 9, 3, 5, 7]

pytestmark = pytest.mark.usefixtures("one_thread")


def llama(vocab: int = 32, hidden: int = 16, layers: int = 4, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=32, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    return LlamaForCausalLM(config).eval()


def head_for(target, draft_vocab: int = 20, seed: int = 1) -> Eagle3Head:
    torch.manual_seed(seed)
    head = Eagle3Head(Eagle3Config.for_target(target.config, draft_vocab, AUX, verifier="tiny-target"))
    head.set_draft_vocab(torch.randperm(target.config.vocab_size)[:draft_vocab])
    with torch.no_grad():  # spread logits, so that chains and trees vary
        head.lm_head.weight.normal_(0.0, 1.0)
    return head.eval()


@pytest.fixture(scope="module")
def target():
    return llama()


@pytest.mark.parametrize("prefill", [True, False])
@pytest.mark.parametrize("width", [1, 3])
def test_greedy_output_is_the_targets_and_the_drafter_holds_its_features(target, prefill, width):
    drafter = Eagle3Drafter(head_for(target), target)
    engine = SpeculativeDecoder(target, drafter, EngineConfig(max_new_tokens=24))
    engine.start(PROMPT, prefill=prefill)
    proposed = 0
    while not engine.finished:
        proposed += engine.round(3, None, width).num_proposed
    plain = target.generate(torch.tensor([PROMPT]), max_new_tokens=24, min_new_tokens=24, do_sample=False)
    assert engine.output_ids == plain[0, len(PROMPT):].tolist()
    assert proposed > 0
    with torch.no_grad():
        states = target(torch.tensor([engine.ids]), output_hidden_states=True).hidden_states
    expected = torch.cat([states[layer][0] for layer in AUX], dim=-1)
    kept = drafter.features_store
    assert kept.shape[0] >= len(engine.ids) - 1  # every position the target cache holds
    torch.testing.assert_close(kept, expected[: kept.shape[0]], atol=1e-5, rtol=1e-5)


def test_a_drafted_chain_is_what_training_unrolls(target):
    """The chain's cumulative log-probabilities equal ``Eagle3Head.unroll`` on the history plus the
    chain: drafting and training read the same positions, tokens and features."""
    head = head_for(target)
    drafter = Eagle3Drafter(head, target)
    ids = PROMPT + [4, 2, 8]
    drafter.reset(ids)
    with torch.no_grad():
        target(torch.tensor([ids[:-1]]))  # the target cache holds ids[:-1] between rounds
    drafter.keep_target_rows(list(range(len(ids) - 1)))
    tree = drafter.propose(ids, 4, 1, SamplingParams(), generator_for("cpu", 0))
    assert tree.is_chain and len(tree) == 4
    sequence = ids + tree.tokens
    with torch.no_grad():
        states = target(torch.tensor([sequence]), output_hidden_states=True).hidden_states
        features = torch.cat([states[layer] for layer in AUX], dim=-1)
        steps = head.unroll(target.get_input_embeddings(), features, torch.tensor([sequence]), 4)
    row = len(ids) - 2
    logq = [torch.log_softmax(step[0, row], dim=-1) for step in steps]
    draft_ids = {int(t): d for d, t in enumerate(head.draft_to_target.tolist())}
    expected = torch.cumsum(torch.stack([lq[draft_ids[tok]] for lq, tok in zip(logq, tree.tokens)]), 0)
    torch.testing.assert_close(torch.tensor(tree.scores), expected, atol=1e-4, rtol=1e-4)
    assert tree.tokens == [int(head.draft_to_target[lq.argmax()]) for lq in logq]


def test_sampled_q_lives_on_the_draft_vocabulary(target):
    head = head_for(target, draft_vocab=5)
    drafter = Eagle3Drafter(head, target, sampled=True)
    drafter.reset(PROMPT)
    with torch.no_grad():
        target(torch.tensor([PROMPT]))
    drafter.keep_target_rows(list(range(len(PROMPT))))
    tree = drafter.propose(PROMPT, 3, 2, SamplingParams(temperature=1.0), generator_for("cpu", 0))
    allowed = torch.zeros(32, dtype=torch.bool)
    allowed[head.draft_to_target] = True
    for q in tree.q.values():
        assert q.shape == (32,) and float(q[~allowed].sum()) == 0.0 and abs(float(q.sum()) - 1) < 1e-5
    assert set(tree.tokens) <= set(head.draft_to_target.tolist())
    builder = drafter.begin(PROMPT, 1, SamplingParams(), None)
    confidences = []
    for _ in range(4):
        assert builder.step()
        confidences.append(builder.level_features()["level_best_prob"])
    assert confidences == sorted(confidences, reverse=True) and 0 < confidences[-1] <= confidences[0] <= 1


def test_the_folder_is_the_speculators_format_and_loads_back(target, tmp_path):
    head = head_for(target)
    head.save_pretrained(tmp_path, speculative_tokens=3)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3"
    assert config["transformer_layer_config"]["model_type"] == "llama"
    assert config["transformer_layer_config"]["num_hidden_layers"] == 1
    assert config["draft_vocab_size"] == 20 and config["target_hidden_size"] == 16
    assert config["eagle_aux_hidden_state_layer_ids"] == list(AUX)
    assert config["speculators_config"]["verifier"]["name_or_path"] == "tiny-target"
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    names = set(load_file(str(tmp_path / "model.safetensors")))
    assert {"fc.weight", "midlayer.self_attn.q_proj.weight", "midlayer.hidden_norm.weight", "norm.weight",
            "lm_head.weight", "d2t", "t2d"} <= names
    assert not any(n.startswith(("embed_tokens", "rotary")) for n in names)
    again = Eagle3Head.from_pretrained(tmp_path)
    for name, tensor in head.state_dict().items():
        assert torch.equal(tensor, again.state_dict()[name]), name


def test_a_head_for_another_target_is_refused_in_one_line(target, tmp_path):
    for other in (llama(vocab=40), llama(hidden=32), llama(layers=3)):
        with pytest.raises(ValueError) as info:
            Eagle3Drafter(head_for(target), other)
        message = str(info.value)
        assert "\n" not in message and "tiny-target" in message and "does not fit the target" in message
    with pytest.raises(FileNotFoundError, match="no EAGLE-3 head folder"):
        Eagle3Head.from_pretrained(tmp_path)


def test_default_aux_layers_are_eagle3s():
    assert default_aux_layers(30) == (2, 15, 27)
    with pytest.raises(ValueError, match="set them explicitly"):
        default_aux_layers(2)
