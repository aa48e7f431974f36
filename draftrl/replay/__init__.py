"""Record and replay: decoding recorded once, replayed without models at microseconds a step.

Two tracks, one layer, side by side:

- the round track (one request, ``SpecDecode`` envs): :mod:`~draftrl.replay.traces` (greedy traces
  recorded by ``draftrl collect``), :mod:`~draftrl.replay.calibrate` (the round cost table of
  ``draftrl calibrate``), :mod:`~draftrl.replay.round_table` (every round a schedule could play);
- the serve track (a batch under load, ``ServeVLLM`` envs): :mod:`~draftrl.replay.recordings`
  (vLLM's continuations, greedy and seeded sampled ones per sampling class, ``draftrl collect --engine
  vllm``, and the drafters' proposals),
  :mod:`~draftrl.replay.serve_calibrate` (the step cost model of ``draftrl calibrate --engine vllm``),
  :mod:`~draftrl.replay.serve_engine` (``ReplayEngine``, a ``ServingEngine`` over recordings).

It sits between ``decoding`` (whose engines it records and stands in for) and ``envs`` (which drive
a live or a replayed engine alike). Importing the package imports none of its modules.
"""
