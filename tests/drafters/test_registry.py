"""The drafter registry: every kind builds from its spec and proposes through the one contract;
bad specs fail with one line that names what is known."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from draftrl.drafters.base import Drafter, LevelDrafter
from draftrl.drafters.registry import DRAFTERS, build_drafter, check_drafter_spec, known_usages, serving_usages
from draftrl.drafters.tree import DraftTree
from draftrl.models import LoadedModel
from draftrl.models.distribution import SamplingParams, generator_for

VOCAB = 32
IDS = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2]  # "1 2" recurs: the n-gram drafter has a match


class Vocab:
    """A tokenizer as far as ``check_same_vocab`` reads one."""

    eos_token_id = None

    def get_vocab(self) -> dict[str, int]:
        return {f"t{i}": i for i in range(VOCAB)}


def tiny(seed: int) -> LoadedModel:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    return LoadedModel(LlamaForCausalLM(config).eval(), Vocab(), f"tiny{seed}")


@pytest.fixture(scope="module")
def target() -> LoadedModel:
    return tiny(0)


def load(spec: str, dtype: str, device: str) -> LoadedModel:
    if spec != "tiny-draft":
        raise FileNotFoundError(f"model directory {spec!r} does not exist")
    return tiny(1)


@pytest.fixture(scope="module")
def eagle3_dir(target: LoadedModel, tmp_path_factory) -> str:
    """A random EAGLE-3 head for ``target`` saved in the speculators format (``eagle3:PATH``'s PATH)."""
    from draftrl.drafters.eagle3 import Eagle3Config, Eagle3Head

    head = Eagle3Head(Eagle3Config.for_target(target.model.config, 16, aux_layers=(0, 1)))
    head.set_draft_vocab(torch.arange(0, VOCAB, 2))
    return str(head.save_pretrained(tmp_path_factory.mktemp("eagle3")))


@pytest.mark.parametrize("spec", [entry.example for entry in DRAFTERS.values()] + ["ngram", "tiny-draft"])
def test_every_entry_builds_and_proposes_through_the_one_contract(spec: str, target: LoadedModel,
                                                                  eagle3_dir: str) -> None:
    drafter = build_drafter(spec.replace(":PATH", f":{eagle3_dir}"), target, load=load)
    if spec == "none":
        assert drafter is None
        return
    assert isinstance(drafter, Drafter)
    drafter.reset(IDS)
    with torch.no_grad():  # as the engine's prefill: a target forward, then the rows it kept
        target.model(torch.tensor([IDS]))
    drafter.keep_target_rows(list(range(len(IDS))))
    tree = drafter.propose(IDS, 3, 2, SamplingParams(), generator_for("cpu", 0))
    assert isinstance(tree, DraftTree) and 1 <= max(tree.depths) <= 3
    assert all(0 <= t < VOCAB for t in tree.tokens)


@pytest.mark.parametrize("kind", [k for k, entry in DRAFTERS.items() if not entry.needs_target and k != "none"])
def test_target_free_kinds_build_without_a_target(kind: str) -> None:
    """What vLLM's proposer builds: token ids only."""
    drafter = build_drafter(DRAFTERS[kind].example)
    assert drafter.propose(IDS, 2, 1, SamplingParams(), None).tokens == [3, 5]  # the latest "1 2" went on "3 5"


def test_a_drafter_needs_only_propose() -> None:
    """The minimal contract: ``propose``; the rest has defaults (no features, stateless)."""

    class Repeat(Drafter):
        def propose(self, ids, depth, width, params, generator):
            tree = DraftTree()
            for level in range(depth):
                tree.add(ids[-1], level - 1, -float(level))
            return tree

    drafter = Repeat()
    assert drafter.propose([7, 8], 2, 1, SamplingParams(), None).tokens == [8, 8]
    assert drafter.features([7, 8]) == {} and not isinstance(drafter, LevelDrafter)
    with pytest.raises(TypeError):
        type("NoPropose", (Drafter,), {})()


def test_level_drafters_propose_what_their_builder_grows(target: LoadedModel) -> None:
    drafter = build_drafter("ngram:1:3", target)
    builder = drafter.begin(IDS, 2, SamplingParams(), None)
    while builder.step():
        pass
    assert drafter.propose(IDS, 16, 2, SamplingParams(), None).tokens == builder.tree.tokens


def test_an_unknown_spec_fails_with_one_line_listing_the_known_ones(monkeypatch, target: LoadedModel) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for error in (lambda: check_drafter_spec("ngramm"), lambda: build_drafter("ngramm", target, load=load)):
        with pytest.raises(ValueError) as info:
            error()
        message = str(info.value)
        assert "\n" not in message and "'ngramm' is unknown" in message
        assert all(usage in message for usage in known_usages())


@pytest.mark.parametrize("spec, needle", [("ngram:1", "ngram:1:3"), ("ngram:1:3:first", "earliest or latest"),
                                          ("layerskip:x", "layerskip:8"), ("none:1", "takes no arguments")])
def test_a_malformed_spec_names_its_grammar(spec: str, needle: str, target: LoadedModel) -> None:
    with pytest.raises(ValueError, match=needle):
        build_drafter(spec, target)


@pytest.mark.parametrize("spec", ["layerskip:1", "self", "tiny-draft", "eagle3:PATH", "sam:2:PATH"])
def test_without_a_target_the_kinds_that_need_one_are_refused(spec: str) -> None:
    with pytest.raises(ValueError, match="needs the target model") as info:
        build_drafter(spec, load=load)
    assert all(usage in str(info.value) for usage in serving_usages())
