"""Drafters: everything that proposes tokens for the target to verify, for both engines.

One module per drafter and one registry (imports stay per module, so that ``drafters.tree``
loads without torch models):

- :mod:`~draftrl.drafters.base`: the contract, :class:`Drafter` (``propose`` is the one required
  verb) and the optional level-by-level extension :class:`LevelDrafter` / :class:`TreeBuilder`;
- :mod:`~draftrl.drafters.tree`: :class:`DraftTree`, what ``propose`` returns and verification reads;
- :mod:`~draftrl.drafters.ngram` (prompt lookup), :mod:`~draftrl.drafters.model` (a draft model),
  :mod:`~draftrl.drafters.layerskip` (the target's first layers);
- :mod:`~draftrl.drafters.registry`: ``build_drafter(spec, target)`` from ``ngram``,
  ``ngram:MIN:MAX[:FIRST]``, ``layerskip:N``, ``self``, ``none`` or a draft model.

A new drafter: a module here with a :class:`Drafter` subclass, and one entry in
``registry.DRAFTERS``; both engines then take it by name.
"""
