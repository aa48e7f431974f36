"""The round track of evaluation: one request at a time on a ``RoundEngine`` (draftrl's engine or
its trace replay), configured by ``EnvConfig`` (``draftrl grid``, ``draftrl eval``, ``draftrl demo``).
It shares ``draftrl.eval``'s metrics, bootstrap and reports with the serve track and never imports it."""
