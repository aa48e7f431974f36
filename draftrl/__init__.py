"""draftrl: learn when and how far to speculate in speculative decoding.

Layers, imported one way only: models -> decoding -> envs -> policies -> train -> eval,
with export depending on policies and decoding.
"""

__version__ = "0.1.0"
