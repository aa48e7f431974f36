"""Gone since issue 42: a bundle of an earlier release names ``ServePolicyProposer`` from here in
its ``speculative_config``; vLLM imports this module to build it, and the error says what to do."""

raise ImportError("draftrl.export.vllm_serve_proposer.ServePolicyProposer is gone: re-run draftrl export RUN --format "
                  "vllm --out DIR; bundles now load draftrl.decoding.vllm.proposer.DraftrlProposer, with controller "
                  "draftrl.export.vllm_control:BatchPolicyControl in proposer.json.")
