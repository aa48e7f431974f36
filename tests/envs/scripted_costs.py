"""Seconds the scripted engine of ``tests/envs/conftest.py`` charges, and the target features its rounds
report (a module with a unique name, so test files can import it: every test folder has its own ``conftest``)."""

PLAIN_STEP = 0.010
PER_NODE = 0.001
PER_LEVEL = 0.002


def scripted_target_features(round_index: int, num_accepted: int) -> dict[str, float]:
    """The scripted engine's ``RoundResult.target_features`` for its round ``round_index`` (0-based, within a
    request): values that change every round, so a test can tell which round an observation read them from."""
    return {"target_top1_prob": 0.5 + 0.1 * (round_index % 4), "target_entropy": 0.25 * (round_index + 1),
            "accepted_mean_p": 0.9 - 0.05 * num_accepted if num_accepted else 0.0}
