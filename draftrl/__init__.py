"""draftrl: learn when and how far to speculate in speculative decoding.

Layers, imported one way only: models -> decoding -> envs -> policies -> train -> eval,
with export depending on policies and decoding.
"""

__version__ = "0.1.0"

import draftrl.envs  # noqa: E402,F401  registers the gymnasium ids (entry-point strings: no torch)
