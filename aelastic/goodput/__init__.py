"""Goodput: where each second of a run went, split into categories that add up to it.

``productive`` (the time of the steps that are kept) and the badput categories
(:data:`BADPUT`: ``startup``, ``restart.<cause>``, ``detection``, ``rollback``,
``checkpoint_save``, ``checkpoint_load``, ``waiting``, ``straggler``, ``unreported``,
``other``), computed from the facts the agent sees (:class:`GoodputRecorder`) by plain
functions (:func:`compute`, :func:`combine` for the whole job; the rules they apply are
plain functions in ``_ledger``: ``new_count``, ``silent_share``, ``job_charge``,
``job_steps``). See
``docs/goodput.md`` for the definitions.
Imports nothing but the standard library.
"""

from ._ledger import combine as combine

__all__ = ("combine",)
