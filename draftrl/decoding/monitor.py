"""Streaming exactness monitor: raise when emitted tokens are not drawn from the target's p.

Pure numpy/scipy, no models. The engine hands every round's :class:`TokenStats` to
:meth:`ExactnessMonitor.update`; the monitor keeps O(1) state per statistic plus one float per
informative token (for the KS test) and raises :class:`ExactnessViolation` when a test fails.

Under exactness, x_t given everything before it is drawn from p_t. Four tests check this:

``pit_chi2``, ``pit_ks``  randomised probability integral transform
    u_t = mass_before_t + V_t * p_t(x_t), V_t ~ U(0, 1) from the monitor's own seeded
    ``numpy.random.Generator`` (never the sampler's). Under exactness the u_t are i.i.d. U(0, 1)
    whatever the p_t are. ``pit_chi2`` bins them (``bins`` equal bins, streaming counts) and uses
    the Cressie-Read power-divergence statistic with lambda = 2/3 against chi2(bins - 1): it is a
    chi-square-type statistic like Pearson's X^2 but its chi2 tail stays calibrated at 10 tokens
    per bin out to p = 1e-5, where Pearson's X^2 fires 1.3-1.6x too often (measured by
    simulation; Pearson's value is still reported). ``pit_ks`` is the one-sample
    Kolmogorov-Smirnov test with the exact finite-n null (``scipy.stats.kstwo``).
``entropy``  surprisal martingale S = sum_t (log p_t(x_t) + H(p_t)), mean zero under exactness.
    Its variance is sum_t Var_t(log p) = E[(log p)^2] - H^2, and TokenStats carries no
    E[(log p)^2], so z = S / sqrt(sum_t s_t^2) is self-normalised by the empirical squared
    increments (an asymptotic N(0, 1) under exactness). The test is ONE-SIDED: it fires only on
    z << 0 (emitted tokens more surprising than H(p) allows: sampling flatter than p). The upper
    side cannot be tested honestly without E[(log p)^2]: surprisal is right-skewed, so in a
    short stream the rare high-surprisal tokens are often simply absent, S > 0 and the
    self-normalised z is huge. Simulated null streams from peaked p (one token at 1 - eps, eps
    in [1e-3, 0.1] over a Zipf tail) fire the upper side ~600x too often at 1e-4, Dirichlet(0.3)
    over 50 tokens ~3.6x; the lower side is conservative in all of them. "Too sharp" samplers
    are left to the PIT tests. Increments with |s_t| < 1e-5 (1 + H_t) are set to 0, so float32
    rounding in p and H on (near-)uniform distributions is not read as evidence.
``agreement``  draft-agreement martingale D = sum over drafted positions of
    (agree_t - agree_expected_t), the test aimed at the known bug class (too much or too little
    mass on drafted tokens). agree_t is Bernoulli(a_t = agree_expected_t) given the proposals,
    so exp(lam * D - sum_t log E[exp(lam * (agree_t - a_t))]) is an exact martingale for every
    lam; the test is the uniform mixture over lam in +-[0.05, 3.2] (26 values) and fires when it
    reaches 1/alpha_agreement (Ville's inequality). The normal z = D / sqrt(sum a(1 - a)) is
    reported but not used: at high acceptance (a ~ 0.97) the Bernoulli sum is so skewed that the
    two-sided z-test at 1e-4 fires ~11x too often at 200 drafted tokens.

Tokens with p_t(x_t) == 1 carry no information (greedy decoding or a one-hot p: u_t = V_t,
s_t = 0, agree_t = a_t) and are skipped; at temperature 0 the monitor tests nothing, and greedy
exactness is checked by token identity elsewhere. A token with p_t(x_t) == 0 is impossible under
exactness and raises at once (statistic ``impossible_token``; no alpha is spent on it).

False alarms (the stated rate is the probability of ever raising on an exact decoder, over the
whole stream however long): ``alpha`` is split equally (Bonferroni) over the four tests.
``pit_chi2``, ``pit_ks`` and ``entropy`` are tested only at the checkpoints n_k = min_tokens * 2^k
informative tokens (200, 400, 800, ...), on exactly the first n_k informative tokens even when
a round straddles a checkpoint, with alpha spending: checkpoint k (k = 0, 1, ...) gets
alpha_k = (alpha / 4) * 6 / (pi^2 (k + 1)^2), which sums to alpha / 4 over an unbounded stream.
``agreement`` is time-uniform (Ville), checked after every token at no extra cost. Apart from
impossible tokens nothing is raised before ``min_tokens`` informative tokens. ``check_every``
only delays evaluation; it never changes what is tested, so the rate does not depend on it.
Measured with the simulated samplers of tests/decoding/test_monitor.py (3000 exact streams of 3200
tokens, alpha = 0.05): P(any raise) = 0.027; pit_chi2 0.009, pit_ks 0.009, entropy 0.004, agreement
0.006, each against a share of 0.0125.

Cost: per ``update`` a few dozen vectorised numpy calls on the round's arrays (no per-token
Python); at a checkpoint one sort of the stored PIT values (geometric checkpoints make that
O(n log n) in total). Memory: 8 bytes per informative token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from draftrl.decoding.stats import TokenStats

TESTS = ("pit_chi2", "pit_ks", "entropy", "agreement")
_LAMBDAS = np.concatenate([-(0.05 * 2.0 ** (np.arange(13) / 2)), 0.05 * 2.0 ** (np.arange(13) / 2)])
_EXPM1_LAMBDAS = np.expm1(_LAMBDAS)
_BELOW_ONE = float(np.nextafter(1.0, 0.0))
_CR_LAMBDA = 2.0 / 3.0
_TOL = 1e-4  # tolerance on float32-computed probabilities in the inputs

_HINTS = {
    ("pit", "sharp"): "emitted tokens rank too high in p (sampling sharper than p: temperature/top-k/top-p "
    "applied to the sampler but not to the reported p, or extra mass on drafted tokens)",
    ("pit", "flat"): "emitted tokens rank too low in p (sampling flatter than p: temperature, top-k/top-p or "
    "the mask missing in the sampler, or a residual that is not norm(max(p - q, 0)))",
    ("entropy", "flat"): "emitted tokens are more surprising than H(p) allows (sampling flatter than p)",
    ("agreement", "high"): "drafted tokens are emitted more often than the exact rule allows (resampling "
    "from p after a rejection, the draft's softmax used as q for greedy proposals, or acceptance "
    "without the min(1, p/q) coin)",
    ("agreement", "low"): "drafted tokens are emitted less often than the exact rule allows (rejecting "
    "too much, e.g. deterministic rejection when p < q, or agree_expected computed from a different p or q)",
}


@dataclass
class MonitorConfig:
    alpha: float = 1e-3
    """probability of ever raising on an exact decoder, whole stream, all four tests together"""
    min_tokens: int = 200
    """informative tokens (p(x) < 1) before the first checkpoint; nothing is raised earlier"""
    check_every: int = 1
    """evaluate the tests on every check_every-th update() call (does not change the rate)"""
    bins: int = 20
    """equal-width PIT bins for the chi-square-type test"""
    seed: int = 0
    """seed of the monitor's own Generator for the PIT randomisation (separate from sampling)"""
    enabled: bool = True
    """False makes update() a no-op"""

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"MonitorConfig.alpha={self.alpha} must be in (0, 1), e.g. 1e-3.")
        if self.bins < 2:
            raise ValueError(f"MonitorConfig.bins={self.bins} must be at least 2.")
        if self.min_tokens < 5 * self.bins:
            raise ValueError(
                f"MonitorConfig.min_tokens={self.min_tokens} is below 5 * bins={5 * self.bins}; the chi-square "
                f"approximation needs about 5 tokens per bin: raise min_tokens or lower bins."
            )
        if self.check_every < 1:
            raise ValueError(f"MonitorConfig.check_every={self.check_every} must be at least 1.")


def restore_error(cls: type, args: tuple, state: dict) -> Exception:
    """An exception rebuilt from its message and fields: the ``__reduce__`` of draftrl's exactness errors,
    whose constructors take evidence, not a message (so a Ray worker's failure reaches the driver whole)."""
    err = cls.__new__(cls)
    err.args = args
    err.__dict__.update(state)
    return err


class ExactnessViolation(RuntimeError):
    """The output is not drawn from the target's distribution; the message carries the evidence.

    ``failures`` is a list of dicts (statistic, value, p_value, threshold, num_tokens, ...);
    ``statistic``, ``value``, ``p_value``, ``threshold`` and ``num_tokens`` repeat the first one.
    """

    def __init__(self, failures: list[dict], num_tokens: int):
        self.failures = failures
        first = failures[0]
        self.statistic = first["statistic"]
        self.value = first["value"]
        self.p_value = first["p_value"]
        self.threshold = first["threshold"]
        self.num_tokens = num_tokens
        lines = [f"exactness violation after {num_tokens} emitted tokens:"]
        for f in failures:
            lines.append(
                f"  {f['statistic']}: {f['what']}={f['value']:.6g}, p={f['p_value']:.3g} <= threshold "
                f"{f['threshold']:.3g} ({f['rule']}; detected at token {f['num_tokens']}, "
                f"{f['num_informative']} informative): {f['hint']}"
            )
        super().__init__("\n".join(lines))

    def __reduce__(self):
        return restore_error, (type(self), self.args, self.__dict__)


class ExactnessMonitor:
    """Accumulates :class:`TokenStats` and tests exactness as it streams; see the module docstring.

    :param config: false-alarm rate, checkpoints, bins, seed; ``None`` means ``MonitorConfig()``.
    """

    def __init__(self, config: MonitorConfig | None = None):
        self.config = config if config is not None else MonitorConfig()
        cfg = self.config
        self._rng = np.random.default_rng(cfg.seed)
        self._alpha_test = cfg.alpha / len(TESTS)
        self._num_tokens = 0  # all emitted tokens seen
        self._num_informative = 0  # tokens with 0 < p(x) < 1
        self._num_drafted_positions = 0  # informative drafted tokens
        self._num_updates = 0
        self._min_tokens_at: int | None = None  # emitted-token count when min_tokens was reached
        # PIT: every informative u (for KS) and streaming bin counts
        self._u = np.empty(1024, dtype=np.float64)
        self._counts = np.zeros(cfg.bins, dtype=np.int64)
        # entropy martingale
        self._s_sum = 0.0
        self._s_sq = 0.0
        # agreement martingale
        self._d_sum = 0.0
        self._d_var = 0.0
        self._log_m = np.zeros(_LAMBDAS.shape[0])
        self._log_e_threshold = math.log(1.0 / self._alpha_test)
        self._agree_cross: dict | None = None  # where the e-process first reached its threshold
        # checkpoints
        self._next_k = 0
        self._pending: list[dict] = []
        self._results: dict[str, dict] = {name: {"passed": True, "checkpoints": 0} for name in TESTS}
        self._failures: list[dict] = []
        self._num_raised = 0
        self._impossible = 0

    # ------------------------------------------------------------------ public API

    @property
    def passed(self) -> bool:
        """No test has failed so far (pending checkpoints are evaluated first)."""
        self._evaluate()
        return not self._failures

    def update(self, stats: TokenStats) -> None:
        """Accumulate one round; raise :class:`ExactnessViolation` if a test fails.

        Each failure is raised once; the monitor keeps accumulating afterwards and ``passed``
        stays False.
        """
        if not self.config.enabled:
            return
        if stats is None:
            raise ValueError("token_stats is None: the engine ran with EngineConfig.token_stats=False (what "
                             "--no-monitor sets); build it with token_stats=True to monitor its rounds.")
        self._num_updates += 1
        n = len(stats)
        if n:
            self._validate(stats)
            self._accumulate(stats)
        if self._num_updates % self.config.check_every == 0 or self._num_raised < len(self._failures):
            self.check()

    def check(self) -> None:
        """Evaluate pending tests now and raise any failure not raised before."""
        self._evaluate()
        if self._num_raised < len(self._failures):
            new = self._failures[self._num_raised :]
            self._num_raised = len(self._failures)
            raise ExactnessViolation(new, self._num_tokens)

    def report(self) -> dict:
        """JSON-able summary: counts, each test's latest value, p-value and threshold, the PIT histogram.

        ``verdict`` is ``"failed"`` once a test failed, ``"inconclusive"`` until the first checkpoint
        (``min_tokens`` informative tokens: the evidence the stated power needs) and ``"passed"``
        after it; ``verdict_reason`` says why in one line. ``passed`` only means "no test failed"
        (True on an inconclusive stream too).

        Per test: ``passed``, ``failed_at_tokens`` (emitted tokens when the evidence was complete),
        the last checkpoint's ``statistic``, ``p_value`` and spent ``threshold``; ``current``
        holds the values on all tokens so far with *nominal* p-values (not alpha-spent: for
        reading, not for deciding). ``agreement`` carries D, its variance, the normal z (for
        reading) and the e-process's log value and log threshold.
        """
        cfg = self.config
        self._evaluate()
        if self._failures:
            verdict, reason = "failed", f"{len(self._failures)} test(s) failed"
        elif self._num_informative < cfg.min_tokens:
            verdict = "inconclusive"
            reason = (f"{self._num_informative} informative tokens (p(x) < 1) of the {cfg.min_tokens} the first check "
                      "needs; decode more (e.g. --ignore-eos, more requests) or at temperature > 0")
        else:
            verdict = "passed"
            reason = f"no test failed on {self._num_informative} informative tokens at alpha={cfg.alpha:g}"
        out = {
            "enabled": cfg.enabled,
            "verdict": verdict,
            "verdict_reason": reason,
            "passed": not self._failures,
            "alpha": cfg.alpha,
            "alpha_per_test": self._alpha_test,
            "num_tokens": self._num_tokens,
            "num_informative": self._num_informative,
            "num_drafted_positions": self._num_drafted_positions,
            "num_impossible": self._impossible,
            "next_checkpoint": self._checkpoint(self._next_k),
            "tests": {name: dict(self._results[name]) for name in TESTS},
            "pit_histogram": self._counts.tolist(),
            "failures": [dict(f) for f in self._failures],
        }
        n = self._num_informative
        cur = out["tests"]
        if n:
            cr, pearson = _power_divergence(self._counts)
            cur["pit_chi2"]["current"] = {"statistic": cr, "pearson": pearson, "nominal_p": _sf_chi2(cr, cfg.bins)}
            d = _ks_d(np.sort(self._u[:n]))
            cur["pit_ks"]["current"] = {"statistic": d, "nominal_p": float(sps.kstwo.sf(d, n))}
            z = self._s_sum / math.sqrt(self._s_sq) if self._s_sq > 0 else 0.0
            cur["entropy"]["current"] = {"z": z, "nominal_p_lower": float(sps.norm.cdf(z))}
        cur["agreement"].update(
            {
                "z": self._d_sum / math.sqrt(self._d_var) if self._d_var > 0 else 0.0,
                "d": self._d_sum,
                "variance": self._d_var,
                "log_e_value": float(_logmeanexp(self._log_m)),
                "crossed_log_e_value": self._agree_cross["log_e"] if self._agree_cross else None,
                "log_threshold": self._log_e_threshold,
                "threshold": self._alpha_test,
            }
        )
        return out

    # ------------------------------------------------------------------ accumulation

    def _checkpoint(self, k: int) -> int:
        return self.config.min_tokens << k

    def _validate(self, st: TokenStats) -> None:
        p, mb, ag, ae = st.p_token, st.mass_before, st.agree, st.agree_expected
        total = mb + p
        if (
            p.min() >= 0.0
            and p.max() <= 1.0 + _TOL
            and mb.min() >= -_TOL
            and total.max() <= 1.0 + _TOL
            and st.entropy.min() >= -_TOL
            and ae.min() >= -_TOL
            and ae.max() <= 1.0 + _TOL
            and not (ag * (1.0 - ag)).any()
        ):
            return
        checks = (
            ("p_token", p, (p >= 0) & (p <= 1 + _TOL)),
            ("mass_before", mb, (mb >= -_TOL) & (total <= 1 + _TOL)),
            ("entropy", st.entropy, st.entropy >= -_TOL),
            ("agree", ag, (ag == 0) | (ag == 1)),
            ("agree_expected", ae, (ae >= -_TOL) & (ae <= 1 + _TOL)),
        )
        for name, value, ok in checks:
            if not ok.all():
                i = int(np.flatnonzero(~ok)[0])
                raise ValueError(
                    f"TokenStats.{name}[{i}]={value[i]!r} is invalid (p_token={p[i]!r}, "
                    f"mass_before={mb[i]!r}); see the TokenStats contract in docs/architecture.md."
                )

    def _impossible_token(self, st: TokenStats) -> None:
        impossible = st.p_token <= 0
        i = int(np.flatnonzero(impossible)[0])
        self._impossible += int(impossible.sum())
        self._failures.append(
            {
                "statistic": "impossible_token",
                "what": "p_token",
                "value": 0.0,
                "p_value": 0.0,
                "threshold": 0.0,
                "rule": "p(x) = 0 cannot be sampled",
                "num_tokens": self._num_tokens + i + 1,
                "num_informative": self._num_informative,
                "hint": f"token {int(st.token[i])} has target probability 0 (masking, top-k or top-p not "
                f"applied to the sampler, or a residual with mass outside p's support)",
            }
        )

    def _accumulate(self, st: TokenStats) -> None:
        bins = self.config.bins
        n = len(st)
        p = st.p_token
        if p.min() <= 0.0:
            self._impossible_token(st)
        mask = (p > 0.0) & (p < 1.0)
        if mask.all():  # the common case: no fancy indexing
            idx = None
            h, mb, drafted = st.entropy, st.mass_before, st.drafted
            m = n
        else:
            idx = np.flatnonzero(mask)
            m = idx.shape[0]
            if m == 0:
                self._num_tokens += n
                return
            p, h, mb, drafted = p[idx], st.entropy[idx], st.mass_before[idx], st.drafted[idx]
        u = self._rng.random(m)
        u *= p
        u += mb
        np.maximum(np.minimum(u, _BELOW_ONE, out=u), 0.0, out=u)
        b = (u * bins).astype(np.int64)
        s = np.log(p) + h
        s[np.abs(s) < 1e-5 * (1.0 + h)] = 0.0

        n0 = self._num_informative
        n1 = n0 + m
        while self._checkpoint(self._next_k) <= n1:
            cut = self._checkpoint(self._next_k) - n0
            sc = s[:cut]
            at = self._num_tokens + (cut if idx is None else int(idx[cut - 1]) + 1)
            if self._next_k == 0:
                self._min_tokens_at = at
            self._pending.append(
                {
                    "k": self._next_k,
                    "n": n0 + cut,
                    "at": at,
                    "counts": self._counts + np.bincount(b[:cut], minlength=bins),
                    "s_sum": self._s_sum + float(sc.sum()),
                    "s_sq": self._s_sq + float(sc @ sc),
                }
            )
            self._next_k += 1
        self._counts += np.bincount(b, minlength=bins)
        self._s_sum += float(s.sum())
        self._s_sq += float(s @ s)
        if n1 > self._u.shape[0]:
            grown = np.empty(max(n1, 2 * self._u.shape[0]), dtype=np.float64)
            grown[:n0] = self._u[:n0]
            self._u = grown
        self._u[n0:n1] = u

        if drafted.any():
            pos = np.flatnonzero(drafted)  # positions among this round's informative tokens
            sel = pos if idx is None else idx[pos]
            a = np.maximum(np.minimum(st.agree_expected[sel], 1.0), 0.0)
            agree = st.agree[sel]
            d_before, var_before, drafted_before = self._d_sum, self._d_var, self._num_drafted_positions
            self._num_drafted_positions += pos.shape[0]
            self._d_sum += float(agree.sum() - a.sum())
            self._d_var += float(a @ (1.0 - a))
            # log of the exact martingale factor exp(lam (agree - a)) / E[exp(lam (agree - a))]
            # for agree ~ Bernoulli(a) is lam * agree - log(1 - a + a e^lam)
            path = np.cumsum(_LAMBDAS[:, None] * agree - np.log1p(_EXPM1_LAMBDAS[:, None] * a), axis=1)
            path += self._log_m[:, None]  # [num_lambdas, num_drafted_positions]
            self._log_m = path[:, -1].copy()
            # the mixture's log e-value is at most the best lam's, so most rounds stop here
            if self._agree_cross is None and path.max() >= self._log_e_threshold:
                log_e = _logmeanexp(path, axis=0)
                hit = np.flatnonzero(log_e >= self._log_e_threshold)
                if hit.shape[0]:
                    j = int(hit[0])
                    self._agree_cross = {
                        "at": self._num_tokens + int(sel[j]) + 1,
                        "informative": n0 + int(pos[j]) + 1,
                        "log_e": float(log_e[j]),
                        "drafted": drafted_before + j + 1,
                        "d": d_before + float(agree[: j + 1].sum() - a[: j + 1].sum()),
                        "variance": var_before + float(a[: j + 1] @ (1.0 - a[: j + 1])),
                    }
        self._num_informative = n1
        self._num_tokens += n

    # ------------------------------------------------------------------ tests

    def _evaluate(self) -> None:
        cfg = self.config
        for snap in self._pending:
            k, n = snap["k"], snap["n"]
            threshold = self._alpha_test * 6.0 / (math.pi**2 * (k + 1) ** 2)
            rule = f"alpha-spending checkpoint k={k} at n={n} informative tokens"
            cr, pearson = _power_divergence(snap["counts"])
            ks_sorted = np.sort(self._u[:n])
            d = _ks_d(ks_sorted)
            sharp = float(ks_sorted.mean()) < 0.5
            z = snap["s_sum"] / math.sqrt(snap["s_sq"]) if snap["s_sq"] > 0 else 0.0
            outcomes = {
                "pit_chi2": ("cressie_read", cr, _sf_chi2(cr, cfg.bins), {"pearson": pearson, "df": cfg.bins - 1}),
                "pit_ks": ("ks_d", d, float(sps.kstwo.sf(d, n)), {"pit_mean": float(ks_sorted.mean())}),
                "entropy": ("z", z, float(sps.norm.cdf(z)), {"s_sum": snap["s_sum"], "sides": "lower"}),
            }
            for name, (what, value, p_value, extra) in outcomes.items():
                res = self._results[name]
                res.update(
                    {
                        "checkpoints": k + 1,
                        "checkpoint_tokens": n,
                        "statistic": value,
                        "p_value": p_value,
                        "threshold": threshold,
                        **extra,
                    }
                )
                if p_value <= threshold and res["passed"]:
                    res["passed"] = False
                    res["failed_at_tokens"] = snap["at"]
                    res["failed_at_informative"] = n
                    hint = _HINTS[("entropy", "flat") if name == "entropy" else ("pit", "sharp" if sharp else "flat")]
                    self._failures.append(
                        {
                            "statistic": name,
                            "what": what,
                            "value": value,
                            "p_value": p_value,
                            "threshold": threshold,
                            "rule": rule,
                            "num_tokens": snap["at"],
                            "num_informative": n,
                            "hint": hint,
                        }
                    )
        self._pending.clear()
        res = self._results["agreement"]
        cross = self._agree_cross
        if cross is not None and self._min_tokens_at is not None and res["passed"]:
            at = max(cross["at"], self._min_tokens_at)
            res["passed"] = False
            res["failed_at_tokens"] = at
            res["failed_at_informative"] = max(cross["informative"], cfg.min_tokens)
            z = cross["d"] / math.sqrt(cross["variance"]) if cross["variance"] > 0 else 0.0
            self._failures.append(
                {
                    "statistic": "agreement",
                    "what": "log_e_value",
                    "value": cross["log_e"],
                    "p_value": math.exp(-cross["log_e"]),
                    "threshold": self._alpha_test,
                    "rule": f"time-uniform e-process (Ville), reached after {cross['drafted']} drafted tokens "
                    f"with D={cross['d']:.4g}, z={z:.3g}",
                    "num_tokens": at,
                    "num_informative": res["failed_at_informative"],
                    "hint": _HINTS[("agreement", "high" if cross["d"] > 0 else "low")],
                }
            )


def _power_divergence(counts: np.ndarray) -> tuple[float, float]:
    """Cressie-Read (lambda = 2/3) and Pearson statistics of equiprobable bin counts."""
    c = counts.astype(np.float64)
    e = c.sum() / c.shape[0]
    lam = _CR_LAMBDA
    cr = 2.0 / (lam * (lam + 1.0)) * float((c * ((c / e) ** lam - 1.0)).sum())
    pearson = float(((c - e) ** 2).sum() / e)
    return cr, pearson


def _sf_chi2(x: float, bins: int) -> float:
    return float(sps.chi2.sf(x, bins - 1))


def _ks_d(sorted_u: np.ndarray) -> float:
    """Two-sided KS distance of sorted samples from U(0, 1)."""
    n = sorted_u.shape[0]
    i = np.arange(1, n + 1) / n
    return float(max((i - sorted_u).max(), (sorted_u - (i - 1.0 / n)).max()))


def _logmeanexp(x: np.ndarray, axis: int = 0) -> np.ndarray:
    top = x.max(axis=axis)
    return top + np.log(np.exp(x - np.expand_dims(top, axis)).mean(axis=axis))
