"""What a drafting controller observes and what a round costs: pure numpy, no env, no model.

The envs build their observations with it while training, ``draftrl.export`` rebuilds the very
same observations in a serving engine, and the analytic env, the baselines and the engine-config
derivation evaluate the same cost model:

- ``features``: ``FeatureBuilder`` (feature names, order and bounds) and ``RoundSummary``;
- ``costs``: ``CostTable``, the measured cost of a round on one machine (``draftrl calibrate``);
- ``speedup``: the article's expected tokens per round and expected speedup;
- ``batch_scaling``: the same model at batch size B (best depth per batch, alpha fitted to a policy).
"""
