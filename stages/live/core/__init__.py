"""The core of the live package: what every change to a running engine shares.

The driver (:mod:`.txn`), the engine-core entry (:mod:`.entry`), the rank side
(:mod:`.rank`, :mod:`.records`), the state on the engine core (:mod:`.state`), the shared
steps and their context (:mod:`.steps`), the replays of vLLM's planning (:mod:`.replay`),
the per-rank report (:mod:`.report`) and a test facility (:mod:`.hold`). Nothing here
imports a room.
"""
