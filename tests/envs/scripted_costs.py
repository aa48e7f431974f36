"""Seconds the scripted engine of ``tests/envs/conftest.py`` charges (a module with a unique name,
so test files can import it: every test folder has its own ``conftest``)."""

PLAIN_STEP = 0.010
PER_NODE = 0.001
PER_LEVEL = 0.002
