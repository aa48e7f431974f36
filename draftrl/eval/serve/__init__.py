"""The serve track of evaluation: a batch of requests under load on a ``ServingEngine`` (vLLM or its
replay), configured by ``ServeConfig`` (``draftrl eval --engine vllm``, ``draftrl demo --engine
vllm``). It shares ``draftrl.eval``'s metrics, bootstrap and reports with the round track and never
imports it."""
