"""draftrl: learn when and how far to speculate in speculative decoding.

Importing ``draftrl`` imports nothing else: a serving process that only runs an exported policy
(``draftrl.export.controller``: numpy + onnxruntime) never loads gymnasium or torch. The layers
and the one rule their imports keep are in ``docs/architecture.md``. The gymnasium ids are
registered by ``import draftrl.envs`` (or name the module in the id:
``gym.make("draftrl.envs:draftrl/SpecDecode-v2")``), so that this import stays free of gymnasium.
"""

__version__ = "0.1.0"
