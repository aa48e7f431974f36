"""Evaluation, in two tracks that share their measures.

- ``eval/round/`` (the round track: one request at a time on a ``RoundEngine``, ``EnvConfig``):
  ``grid`` (``draftrl grid``: depth x verify_size x width on the tune split -> ``grid.json``),
  ``compare`` (``draftrl eval``: policies on the held-out split, interleaved per request, with the
  exactness monitor and greedy token identity -> ``results.json``, ``report.md``, plots), ``demo``
  (``draftrl demo``), ``anchors`` (stock Hugging Face ``generate``), ``headroom``, ``lookahead``,
  ``policies`` (how the HF engine plays a policy name), ``rollout``, ``config`` (``EvalConfig``).
- ``eval/serve/`` (the serve track: a batch under load on a ``ServingEngine``, ``ServeConfig``):
  ``compare`` (``draftrl eval --engine vllm``), ``demo`` (``draftrl demo --engine vllm``),
  ``policies`` (how vLLM plays a policy name), ``dsd_search``, ``rollout``.
- shared here: ``policy_names`` (the one grammar of policy names), ``records`` (what a timed request
  records), ``metrics``, ``bootstrap``, ``report``, ``plots``, ``wandb_log``, ``memory``,
  ``exactness`` and ``agreement`` (the exactness checks).

The two tracks never import each other, and the shared modules import neither
(``tests/test_architecture.py``). Heavy imports (torch, transformers, matplotlib, wandb) happen
inside the functions.
"""
