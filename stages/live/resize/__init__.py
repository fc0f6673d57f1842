"""Resize, release, resume and inspect a running engine's KV cache.

The public API (:mod:`.api`), the engine-core side (:mod:`.engine`: check, plan, drive),
the transactions (:mod:`.steps`) and the records (:mod:`.report`).
"""
