"""Gone since issue 42: a bundle of an earlier release names ``PolicyProposer`` from here in its
``speculative_config``; vLLM imports this module to build it, and the error says what to do."""

raise ImportError("draftrl.export.vllm_proposer.PolicyProposer is gone: re-run draftrl export RUN --format vllm "
                  "--out DIR; bundles now load draftrl.decoding.vllm.proposer.DraftrlProposer, with controller "
                  "draftrl.export.vllm_control:RequestPolicyControl in proposer.json.")
