"""The step-level action of the per-level envs, shared by the envs and the policies that play them.

``SpecDecodeDepth-v2`` and ``TraceReplayDepth-v1`` take ``Discrete(2)``: after every draft level
the agent verifies now (``STOP``) or drafts one more level (``CONTINUE``); ``Policy.act_step``
returns these values. A size policy chooses the verification size when a round stops.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

#: Action values of the per-level envs.
STOP, CONTINUE = 0, 1

#: ``size_policy(observation, tree) -> verify_size``, asked when a round is verified.
SizePolicy = Callable[[np.ndarray, Any], int]
