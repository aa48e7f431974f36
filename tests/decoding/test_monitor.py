"""Exactness monitor on simulated streams: exact samplers stay quiet, wrong ones are caught.

Streams are simulated in numpy: per position a random target p over 50 tokens and a draft q
correlated with it (:func:`target_and_draft`). Chain speculative decoding is simulated round by
round (depth 4, stop at the first rejection, bonus token after a fully accepted chain), so
drafted, recovered and bonus tokens appear in realistic proportions. Wrong samplers: resampling
from p after a rejection (docs/design.md), sampling at temperature 0.8 (or 1.25) while reporting p,
and always accepting a greedy draft d when p(d) > 0.5. ``tools/monitor_power.py`` reuses
these samplers to measure detection delays.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.special import xlogy

from draftrl.decoding.monitor import TESTS, ExactnessMonitor, ExactnessViolation, MonitorConfig
from draftrl.decoding.stats import TokenStats

VOCAB = 50
DEPTH = 4
TEMPERATURE_BUG = {"temperature": 0.8, "temperature_hot": 1.25}  # samples p^(1/T), reports p
ACCEPT_THRESHOLD_BUG = 0.5  # the buggy sampler always accepts a greedy draft d when p(d) > 0.5

SAMPLERS = ("exact", "exact_greedy_draft", "resample_from_p", "temperature", "threshold_accept", "temperature_hot")
WRONG_SAMPLERS = SAMPLERS[2:]


def _sample(probs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One draw per row of probs [N, V] (rows need not be normalised) -> [N] ids."""
    cdf = np.cumsum(probs, axis=-1)
    u = rng.random(probs.shape[:-1])[..., None] * cdf[..., -1:]
    return np.minimum((cdf <= u).sum(axis=-1), probs.shape[-1] - 1)


def _take(a: np.ndarray, ids: np.ndarray) -> np.ndarray:
    return np.take_along_axis(a, ids[..., None], axis=-1)[..., 0]


def token_stats_rows(p: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """p [N, V], x [N] -> p(x), mass ranked strictly before x (ties by id), entropy (nats)."""
    px = _take(p, x)
    ids = np.arange(p.shape[-1])
    before = (p > px[:, None]) | ((p == px[:, None]) & (ids < x[:, None]))
    return px, (p * before).sum(axis=-1), -xlogy(p, p).sum(axis=-1)


def target_and_draft(rng: np.random.Generator, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Target p and draft q, both [*shape, VOCAB].

    p ~ Dirichlet(c) with c log-uniform in [0.02, 1] per position (peaked and flat positions
    mixed); q = softmax(log p / 0.8 + N(0, 1)), an overconfident, noisy draft (acceptance ~0.68).
    """
    c = np.exp(rng.uniform(np.log(0.02), 0.0, size=(*shape, 1)))
    p = rng.gamma(np.broadcast_to(c, (*shape, VOCAB))) + 1e-300
    p /= p.sum(axis=-1, keepdims=True)
    logits = np.log(p) / 0.8 + rng.normal(size=p.shape)
    q = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return p, q / q.sum(axis=-1, keepdims=True)


def simulate_rounds(
    sampler: str, num_rounds: int, rng: np.random.Generator, bank: tuple[np.ndarray, np.ndarray] | None = None
) -> TokenStats:
    """``num_rounds`` rounds of chain speculative decoding with one of SAMPLERS.

    ``bank`` (p [N, V], q [N, V]) reuses pre-drawn pairs (faster for many streams); otherwise
    fresh pairs come from :func:`target_and_draft`.
    """
    r, g = num_rounds, DEPTH
    if bank is None:
        p, q = target_and_draft(rng, (r, g + 1))  # [R, depth + 1, V]; slot depth is the bonus slot
    else:
        rows = rng.integers(0, bank[0].shape[0], size=(r, g + 1))
        p, q = bank[0][rows], bank[1][rows]
    p_run = p  # the distribution the sampler really uses
    if sampler in TEMPERATURE_BUG:
        p_run = p ** (1.0 / TEMPERATURE_BUG[sampler])
        p_run /= p_run.sum(axis=-1, keepdims=True)
    y = _sample(p_run, rng)  # [R, depth + 1] a plain target draw per slot
    if sampler in ("exact_greedy_draft", "threshold_accept"):
        d = q.argmax(axis=-1)  # deterministic proposals: q is one-hot
        pd = _take(p, d)
        accept = y == d  # exact rule: sample y ~ p, accept iff y == d, else emit y
        if sampler == "threshold_accept":
            accept |= pd > ACCEPT_THRESHOLD_BUG
        x = np.where(accept, d, y)
        a = pd
    else:
        d = _sample(q, rng)
        qd = _take(q, d)
        accept = rng.random((r, g + 1)) * qd < _take(p_run, d)
        if sampler == "resample_from_p":
            recovered = y  # the bug: after a rejection draw again from p
        else:
            recovered = _sample(np.maximum(p_run - q, 0.0), rng)
        x = np.where(accept, d, recovered)
        a = np.minimum(1.0, _take(p, d) / qd)  # reported with the p the engine believes in
    slot = np.arange(g + 1)
    rejected = np.where(~accept[:, :g], slot[:g], g)
    first_reject = rejected.min(axis=1)  # [R] == depth when every draft was accepted
    emitted = slot[None, :] <= first_reject[:, None]
    drafted = np.broadcast_to(slot < g, (r, g + 1))
    x = np.where(drafted, x, y)  # the bonus slot is a plain draw from the sampler's p
    pm, xm = p[emitted], x[emitted]
    p_token, mass_before, entropy = token_stats_rows(pm, xm)
    dm = drafted[emitted]
    return TokenStats(
        token=xm,
        p_token=p_token,
        mass_before=mass_before,
        entropy=entropy,
        drafted=dm,
        agree=np.where(dm, x[emitted] == d[emitted], 0.0),
        agree_expected=np.where(dm, a[emitted], 0.0),
    )


def simulate_stream(
    sampler: str, num_tokens: int, rng: np.random.Generator, bank: tuple[np.ndarray, np.ndarray] | None = None
) -> TokenStats:
    """Exactly ``num_tokens`` emitted tokens from ``sampler`` (the last round may be cut)."""
    parts, n = [], 0
    while n < num_tokens:
        part = simulate_rounds(sampler, max(64, int((num_tokens - n) / 2.3)), rng, bank)
        parts.append(part)
        n += len(part)
    return TokenStats.concat(parts).slice(0, num_tokens)


def run_monitor(stream: TokenStats, config: MonitorConfig, chunk: int = 0) -> tuple[ExactnessMonitor, list]:
    """Feed ``stream`` (in chunks when chunk > 0); returns the monitor and every violation raised."""
    monitor = ExactnessMonitor(config)
    raised = []
    step = chunk or len(stream)
    for start in range(0, len(stream), step):
        try:
            monitor.update(stream.slice(start, start + step))
        except ExactnessViolation as err:
            raised.append(err)
    return monitor, raised


# ---------------------------------------------------------------------------------- TokenStats


def test_token_stats_concat_empty_len_slice():
    rng = np.random.default_rng(0)
    a = simulate_rounds("exact", 10, rng)
    b = simulate_rounds("exact", 5, rng)
    both = TokenStats.concat([a, TokenStats.empty(), b])
    assert len(both) == len(a) + len(b) and len(TokenStats.empty()) == 0
    assert len(TokenStats.concat([])) == 0
    assert both.token.dtype == np.int64 and both.drafted.dtype == np.bool_ and both.agree.dtype == np.float64
    np.testing.assert_array_equal(both.slice(len(a), len(both)).mass_before, b.mass_before)
    with pytest.raises(ValueError, match="differ in length"):
        TokenStats([1, 2], [0.5], [0.0], [1.0], [True], [1.0], [0.5])


def test_simulated_stats_follow_the_contract():
    rng = np.random.default_rng(1)
    st = simulate_stream("exact", 2000, rng)
    assert np.all((st.p_token > 0) & (st.mass_before + st.p_token <= 1 + 1e-12))
    assert 0.5 < st.drafted.mean() < 0.97  # bonus tokens are the rest
    # the exact sampler's agreement matches its conditional expectation on average
    dm = st.drafted
    assert abs((st.agree[dm] - st.agree_expected[dm]).mean()) < 0.05


# ---------------------------------------------------------------------------------- behaviour


@pytest.mark.parametrize("sampler", ["exact", "exact_greedy_draft"])
def test_exact_samplers_stay_quiet(sampler):
    for seed in range(3):
        stream = simulate_stream(sampler, 6000, np.random.default_rng(seed))
        monitor, raised = run_monitor(stream, MonitorConfig(seed=seed), chunk=97)
        assert not raised and monitor.passed, raised
        rep = monitor.report()
        assert rep["num_tokens"] == 6000 and rep["tests"]["pit_ks"]["checkpoints"] == 5


@pytest.mark.parametrize("sampler", WRONG_SAMPLERS)
def test_wrong_samplers_are_caught(sampler):
    for seed in range(3):
        stream = simulate_stream(sampler, 6000, np.random.default_rng(100 + seed))
        monitor, raised = run_monitor(stream, MonitorConfig(seed=seed), chunk=97)
        assert raised and not monitor.passed, f"{sampler} seed {seed} not caught: {monitor.report()['tests']}"
        first = raised[0]
        assert first.num_tokens <= 6000 and first.p_value <= first.threshold
        assert first.statistic in TESTS and first.statistic in str(first)


def test_resample_from_p_is_caught_by_agreement_as_too_much_agreement():
    stream = simulate_stream("resample_from_p", 4000, np.random.default_rng(7))
    monitor, raised = run_monitor(stream, MonitorConfig())
    agreement = [f for err in raised for f in err.failures if f["statistic"] == "agreement"]
    assert agreement and "more often" in agreement[0]["hint"]
    assert monitor.report()["tests"]["agreement"]["d"] > 0


def test_impossible_token_raises_at_once():
    st = simulate_rounds("exact", 4, np.random.default_rng(0))
    p = st.p_token.copy()
    p[1] = 0.0
    bad = TokenStats(st.token, p, st.mass_before, st.entropy, st.drafted, st.agree, st.agree_expected)
    monitor = ExactnessMonitor()
    with pytest.raises(ExactnessViolation, match="impossible_token"):
        monitor.update(bad)
    assert not monitor.passed


def test_detection_does_not_depend_on_round_boundaries():
    stream = simulate_stream("temperature", 3000, np.random.default_rng(3))
    reports = []
    for chunk in (0, 1, 7, 250):
        monitor, _ = run_monitor(stream, MonitorConfig(seed=5), chunk=chunk)
        rep = monitor.report()
        reports.append({k: rep["tests"][k].get("failed_at_tokens") for k in TESTS} | {"h": rep["pit_histogram"]})
    assert all(r == reports[0] for r in reports), reports
    assert any(v is not None for k, v in reports[0].items() if k != "h")


def test_check_every_defers_evaluation_only():
    stream = simulate_stream("resample_from_p", 3000, np.random.default_rng(4))
    eager, raised_eager = run_monitor(stream, MonitorConfig(), chunk=50)
    lazy, raised_lazy = run_monitor(stream, MonitorConfig(check_every=10), chunk=50)
    assert raised_eager and raised_lazy
    assert eager.report()["failures"] == lazy.report()["failures"]


def test_greedy_stream_tests_nothing():
    st = simulate_rounds("exact", 100, np.random.default_rng(0))
    n = len(st)
    one = np.ones(n)
    greedy = TokenStats(st.token, one, np.zeros(n), np.zeros(n), st.drafted, st.agree, np.where(st.drafted, 1.0, 0.0))
    monitor = ExactnessMonitor()
    for _ in range(10):
        monitor.update(greedy)
    rep = monitor.report()
    assert monitor.passed and rep["num_informative"] == 0 and rep["num_tokens"] == 10 * n


@pytest.mark.parametrize("num_tokens", [1, 11, 199])
def test_verdict_is_inconclusive_before_the_first_check(num_tokens):
    """Finding 10: on a few tokens (a negative control that stopped at EOS) the report said
    ``passed``; the verdict waits for the informative tokens its stated power needs."""
    config = MonitorConfig()
    monitor, raised = run_monitor(simulate_stream("resample_from_p", num_tokens, np.random.default_rng(1)), config)
    rep = monitor.report()
    assert not raised and rep["num_informative"] < config.min_tokens
    assert rep["verdict"] == "inconclusive" and f"of the {config.min_tokens}" in rep["verdict_reason"]
    full, _ = run_monitor(simulate_stream("exact", 400, np.random.default_rng(2)), config)
    assert full.report()["num_informative"] >= config.min_tokens and full.report()["verdict"] == "passed"
    wrong, raised = run_monitor(simulate_stream("resample_from_p", 6000, np.random.default_rng(100)), config, chunk=97)
    assert raised and wrong.report()["verdict"] == "failed"


def test_float32_rounding_on_flat_distributions_is_not_evidence():
    """Uniform p over k tokens: log p + H = 0 exactly, float32 rounding must not fire the entropy test."""
    rng = np.random.default_rng(0)
    n = 20000
    k = rng.integers(2, 40, size=n)
    x = (rng.random(n) * k).astype(np.int64)
    p = np.float32(1.0) / k.astype(np.float32)
    h = (np.log(k.astype(np.float32)) * np.float32(1.0 + 3e-7)).astype(np.float64)  # biased float32 entropy
    st = TokenStats(x, p.astype(np.float64), x * p.astype(np.float64), h, np.zeros(n, bool), np.zeros(n), np.zeros(n))
    monitor, raised = run_monitor(st, MonitorConfig(), chunk=1000)
    assert not raised, raised
    assert monitor.report()["tests"]["entropy"]["statistic"] == 0.0


def test_disabled_monitor_is_a_no_op():
    monitor = ExactnessMonitor(MonitorConfig(enabled=False))
    monitor.update(simulate_stream("resample_from_p", 3000, np.random.default_rng(0)))
    assert monitor.passed and monitor.report()["num_tokens"] == 0


def test_report_is_json_and_carries_the_evidence():
    stream = simulate_stream("threshold_accept", 3000, np.random.default_rng(2))
    monitor, raised = run_monitor(stream, MonitorConfig(), chunk=64)
    rep = json.loads(json.dumps(monitor.report()))
    assert rep["passed"] is False and sum(rep["pit_histogram"]) == rep["num_informative"]
    for name in TESTS:
        assert "passed" in rep["tests"][name]
    msg = str(raised[0])
    for word in ("p=", "threshold", "emitted tokens", raised[0].statistic):
        assert word in msg


def test_config_and_input_errors_name_the_fix():
    with pytest.raises(ValueError, match="min_tokens"):
        MonitorConfig(min_tokens=50, bins=20)
    with pytest.raises(ValueError, match="alpha"):
        MonitorConfig(alpha=0.0)
    st = simulate_rounds("exact", 4, np.random.default_rng(0))
    bad = TokenStats(st.token, st.p_token, st.mass_before + 1.0, st.entropy, st.drafted, st.agree, st.agree_expected)
    with pytest.raises(ValueError, match="mass_before"):
        ExactnessMonitor().update(bad)


# ---------------------------------------------------------------------------------- calibration


def _binomial_upper(rate: float, trials: int) -> float:
    """rate plus three binomial standard errors."""
    return rate + 3.0 * np.sqrt(rate * (1.0 - rate) / trials)


def test_false_alarm_rate_is_at_most_alpha():
    """Many exact streams through 4 checkpoints (200..1600): P(any raise) <= alpha, per test <= alpha/4."""
    alpha, streams, length = 0.05, 400, 1800
    bank = target_and_draft(np.random.default_rng(99), (8192,))
    fired = {name: 0 for name in TESTS}
    any_fired = 0
    for i in range(streams):
        stream = simulate_stream("exact", length, np.random.default_rng(10_000 + i), bank)
        monitor, raised = run_monitor(stream, MonitorConfig(alpha=alpha, seed=i))
        names = {f["statistic"] for err in raised for f in err.failures}
        any_fired += bool(names)
        for name in names:
            fired[name] += 1
    assert any_fired / streams <= _binomial_upper(alpha, streams), (any_fired, fired)
    for name in TESTS:
        assert fired[name] / streams <= _binomial_upper(alpha / 4, streams), (name, fired)


def test_agreement_test_calibrated_at_high_acceptance():
    """agree ~ Bernoulli(a), a ~ Beta(40, 1) (mean 0.976): the normal z would fire ~10x too often here."""
    alpha, streams, n = 0.05, 400, 2000
    rng = np.random.default_rng(0)
    fired = 0
    base = simulate_stream("exact", n, rng)
    for i in range(streams):
        a = rng.beta(40.0, 1.0, size=n)
        st = TokenStats(
            base.token, base.p_token, base.mass_before, base.entropy,
            np.ones(n, bool), (rng.random(n) < a).astype(float), a,
        )
        monitor, raised = run_monitor(st, MonitorConfig(alpha=alpha, seed=i))
        fired += any(f["statistic"] == "agreement" for err in raised for f in err.failures)
    assert fired / streams <= _binomial_upper(alpha / 4, streams), fired


def test_entropy_test_calibrated_on_peaked_heavy_tailed_targets():
    """LLM-like peaked p (one token at 1 - eps, a Zipf tail over 2000 ids): the one-sided test stays quiet."""
    alpha, streams, n, v = 0.05, 300, 1600, 2000
    rng = np.random.default_rng(0)
    bank = []
    for _ in range(100):
        eps = 10 ** rng.uniform(-3, -1)
        tail = np.arange(1, v) ** -1.1
        bank.append(np.concatenate([[1 - eps], tail / tail.sum() * eps]))
    bank = np.array(bank)  # [100, v]
    h_bank = -xlogy(bank, bank).sum(axis=1)
    cdf = np.cumsum(bank, axis=1)
    flat = (cdf + np.arange(len(bank))[:, None]).ravel()  # row i's cdf shifted to [i, i + 1]
    fired = 0
    for i in range(streams):
        rows = rng.integers(0, len(bank), size=n)
        x = np.minimum(np.searchsorted(flat, rows + rng.random(n), side="right") - rows * v, v - 1)
        p_token = bank[rows, x]  # ids are ranked by decreasing p, so mass_before is the cdf before x
        mass_before = np.where(x == 0, 0.0, cdf[rows, np.maximum(x - 1, 0)])
        st = TokenStats(x, p_token, mass_before, h_bank[rows], np.zeros(n, bool), np.zeros(n), np.zeros(n))
        monitor, raised = run_monitor(st, MonitorConfig(alpha=alpha, seed=i))
        fired += any(f["statistic"] == "entropy" for err in raised for f in err.failures)
    assert fired / streams <= _binomial_upper(alpha / 4, streams), fired
