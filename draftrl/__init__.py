"""draftrl: learn when and how far to speculate in speculative decoding.

Importing ``draftrl`` imports nothing else: a serving process that only runs an exported policy
(``draftrl.export.controller``: numpy + onnxruntime) never loads gymnasium or torch. The layers
and the one rule their imports keep are in ``docs/architecture.md``. The gymnasium ids are
registered by ``import draftrl.envs``, and, in an installed draftrl, as soon as gymnasium loads
(``draftrl_gym.pth``), so ``gym.make("draftrl/SpecDecode-v0")`` needs no ``import draftrl``.
"""

__version__ = "0.1.0"
