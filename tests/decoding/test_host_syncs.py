"""Host syncs per round: a small constant, at every temperature, shape, drafter and depth (issue 40).

On a GPU each device-to-host read (``.item()``, ``.tolist()``, ``bool(t)``, data-dependent shapes)
and each upload of host data waits for the device's queue: tens of microseconds, where a round of
an 8B target costs a few milliseconds. ``draftrl.decoding.syncs.SyncCounter`` recognises those
operations on the CPU; the first tests check that it catches each kind and counts nothing else
(and that a deliberately sync-heavy loop is counted once per element), the last ones hold the real
engine's rounds to ``MAX_DEVICE_TO_HOST`` reads and ``MAX_UPLOADS`` uploads, from depth 1 to 8.

The engine runs on a tiny Llama (transformers' own forward, so the syncs inside it are counted
too) built as a bigram model with a periodic output: the n-gram drafter's chains are accepted to full
depth, at temperature 1 as well. The draft model is a copy of the target, so every draft is
accepted and each round walks the deepest path (the worst case of a walk that syncs per level).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from draftrl.decoding.engine import EngineConfig, SpeculativeDecoder
from draftrl.decoding.syncs import SyncCounter, round_syncs
from draftrl.drafters.model import ModelDrafter
from draftrl.drafters.ngram import NgramDrafter

VOCAB = 32
PERIOD = 5  # the target's output repeats with this period
DEPTHS = (1, 2, 4, 8)
ROUNDS = 4  # rounds counted per setting
#: reads per round: the draft features (shared with the env's observation), the draft tree (one
#: transfer for all its levels), the walk (one for every row's outcome), the emitted tokens' statistics
MAX_DEVICE_TO_HOST = 4
#: uploads per round: the drafter's new history tokens, the verified tokens (with a tree's ancestor
#: table), the walk's rows and children, the statistics' rows, both caches' kept positions
MAX_UPLOADS = 6

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# --------------------------------------------------------------------------- the counter itself

def _kinds(fn, *args) -> tuple[int, int, int]:
    with SyncCounter(cuda=False) as c:
        fn(*args)
    return c.reads, c.shapes, c.uploads


@pytest.mark.parametrize("name, fn, kinds", [
    ("item", lambda x: x[0].item(), (1, 0, 0)),
    ("tolist", lambda x: x.tolist(), (1, 0, 0)),
    ("bool", lambda x: bool(x[0] > 0), (1, 0, 0)),
    ("if", lambda x: 1 if x[1] == 1 else 0, (1, 0, 0)),
    ("int", lambda x: int(x[1]), (1, 0, 0)),
    ("float", lambda x: float(x[1]), (1, 0, 0)),
    ("index", lambda x: [0, 1, 2][x[1].long()], (1, 0, 0)),
    ("cpu", lambda x: x.cpu(), (1, 0, 0)),
    ("to cpu", lambda x: x.to("cpu"), (1, 0, 0)),
    ("numpy", lambda x: x.numpy(), (1, 0, 0)),
    ("np.asarray", lambda x: np.asarray(x), (1, 0, 0)),
    ("format", lambda x: f"{x[0]}", (1, 0, 0)),
    ("equal", lambda x: torch.equal(x, x), (1, 0, 0)),
    ("nonzero", lambda x: torch.nonzero(x), (0, 1, 0)),
    ("bool mask", lambda x: x[x > 1], (0, 1, 0)),
    ("masked_select", lambda x: x.masked_select(x > 1), (0, 1, 0)),
    ("unique", lambda x: x.unique(), (0, 1, 0)),
    ("where(cond)", lambda x: torch.where(x > 1), (0, 1, 0)),
    ("repeat_interleave", lambda x: x.repeat_interleave(x.long()), (0, 1, 0)),
    ("tensor(device=)", lambda x: torch.tensor([1, 2], device=x.device), (0, 0, 1)),
    ("list index", lambda x: x[[0, 2]], (0, 0, 1)),
    ("host.to(device)", lambda x: torch.zeros(3).to(x.device), (0, 0, 1)),
    ("from_numpy.to(device)", lambda x: torch.from_numpy(np.zeros(3)).to(x.device), (0, 0, 1)),
    ("as_tensor(numpy, device=)", lambda x: torch.as_tensor(np.zeros(3), device=x.device), (0, 0, 1)),
    ("host index", lambda x: x[torch.tensor([0, 2])], (0, 0, 1)),
])
def test_the_counter_catches_each_kind_of_sync(name, fn, kinds):
    assert _kinds(fn, torch.arange(4.0)) == kinds, name


def test_the_counter_ignores_what_stays_on_the_device_or_on_the_host():
    """Device work that a GPU queues without waiting, and host work on host data, count nothing."""
    def device_only(x):
        y = torch.softmax(x * 2 + 1, dim=-1)
        top = torch.topk(y, 2)
        z = y.gather(-1, top.indices).sum() + torch.where(x > 1, x, 0.0).argmax()
        w = torch.full((3,), 2.0, device=x.device) + torch.arange(3, device=x.device)
        x[torch.arange(2, device=x.device)] = y[:2]
        return z, w, torch.cat([x, w]).to(torch.float64), x.to(x.device)

    def host_only(_):
        h = torch.tensor([3, 1, 2])
        return h.tolist(), int(h[0]), bool((h > 1).any()), h[h > 1], h.nonzero(), np.asarray(h + 1)

    assert _kinds(device_only, torch.arange(4.0)) == (0, 0, 0)
    assert _kinds(host_only, torch.arange(4.0)) == (0, 0, 0)


def test_a_sync_heavy_loop_is_counted_once_per_element():
    """Negative control: a per-element Python loop over a device tensor (what a per-level walk does)."""
    def walk(x):
        total = 0.0
        for i in range(x.shape[0]):
            if x[i] > 0:  # one read
                total += float(x[i])  # one more
        return total

    x = torch.arange(1.0, 9.0)
    assert _kinds(walk, x) == (16, 0, 0)
    with SyncCounter(cuda=False) as batched:
        values = x.tolist()
        sum(v for v in values if v > 0)
    assert batched.device_to_host == 1


# --------------------------------------------------------------------------- the engine's rounds

@pytest.fixture(scope="module")
def bigram():
    """A tiny Llama (random attention and MLP weights, transformers' own forward) whose layers add
    nothing to the residual stream and whose embeddings and output layer make token t predict
    (t + 1) mod PERIOD with probability 1 - 1e-100: a bigram model with a periodic output. Returns
    it and a prompt of a few periods, one of them with a detour, so that the n-gram drafter's trie
    has two branches from depth 4 on."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=VOCAB, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.copy_(torch.eye(VOCAB))  # the final norm scales it by sqrt(VOCAB)
        model.lm_head.weight.zero_()
        model.lm_head.weight[(torch.arange(VOCAB) + 1) % PERIOD, torch.arange(VOCAB)] = 50.0
    cycle = list(range(PERIOD))
    return model, cycle * 2 + [0, 1, 2, 9, 9] + cycle * 2  # one detour: the n-gram trie branches


def _engine(bigram, drafter: str, temperature: float, sampled: bool, token_stats: bool = True):
    target, _ = bigram
    draft = ModelDrafter(copy.deepcopy(target), sampled=sampled) if drafter == "model" else NgramDrafter()
    config = EngineConfig(max_new_tokens=9 * ROUNDS + 1, temperature=temperature, seed=1, token_stats=token_stats)
    return SpeculativeDecoder(target, draft, config)


def _rounds(bigram, drafter: str, temperature: float, width: int, depth: int, **kwargs):
    """(counter, result) of each of ROUNDS rounds after the prompt."""
    engine = _engine(bigram, drafter, temperature, sampled=temperature > 0, **kwargs)
    engine.start(bigram[1])
    return [round_syncs(engine, depth, None, width, cuda=False) for _ in range(ROUNDS)]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("width", [1, 2], ids=["chain", "tree"])
@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_a_round_syncs_a_constant_number_of_times_at_every_depth(bigram, drafter, width, temperature):
    counts = {}
    for depth in DEPTHS:
        rounds = _rounds(bigram, drafter, temperature, width, depth)
        counts[depth] = [(c.device_to_host, c.uploads) for c, _ in rounds]
        worst = max(rounds, key=lambda r: r[0].total)[0]
        assert max(c.device_to_host for c, _ in rounds) <= MAX_DEVICE_TO_HOST, (depth, worst.summary())
        assert max(c.uploads for c, _ in rounds) <= MAX_UPLOADS, (depth, worst.summary())
    assert max(r.num_accepted for _, r in rounds) == DEPTHS[-1], counts  # the walk went deepest


def test_without_token_stats_a_sampled_round_reads_once_less(bigram):
    """``EngineConfig.token_stats=False`` (``--no-monitor``): no statistics, one transfer fewer."""
    with_stats = _rounds(bigram, "model", 1.0, 2, 4)
    without = _rounds(bigram, "model", 1.0, 2, 4, token_stats=False)
    assert all(r.token_stats is not None and len(r.token_stats) == r.num_emitted for _, r in with_stats)
    assert all(r.token_stats is None for _, r in without)
    assert [r.tokens for _, r in with_stats] == [r.tokens for _, r in without]  # the same draws
    assert [c.device_to_host for c, _ in without] == [c.device_to_host - 1 for c, _ in with_stats]


def test_input_checks_read_with_the_results_still_refuse_bad_input():
    """The walk and the draft model defer their input checks into their one transfer: bad logits
    still raise the same one-line ValueError (at the transfer, before any result is used)."""
    from draftrl.decoding.acceptance import accept_tree
    from draftrl.drafters.tree import DraftTree
    from draftrl.models.distribution import DeferredChecks, SamplingParams, logits_to_probs

    tree = DraftTree()
    tree.add(1, -1, 0.0)
    logits = torch.zeros(2, 4)
    logits[1, 2] = float("nan")
    with pytest.raises(ValueError, match="contain NaN"):
        accept_tree(tree, logits, SamplingParams(temperature=1.0), torch.Generator())
    checks = DeferredChecks()
    with checks.collecting():
        logits_to_probs(logits, SamplingParams(temperature=1.0))  # recorded, not read
    assert len(checks.pending) == 1
    with pytest.raises(ValueError, match="contain NaN"):
        checks.raise_failed(checks.flags("cpu").tolist())

    class NanModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, input_ids, **kwargs):
            return type("Out", (), {"logits": torch.full((1, input_ids.shape[1], 4), float("nan"))})()

    drafter = ModelDrafter(NanModel(), sampled=True)
    with pytest.raises(ValueError, match="contain NaN"):
        drafter.propose([0, 1], 2, 2, SamplingParams(temperature=1.0), torch.Generator())
