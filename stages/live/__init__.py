"""Changes to a running vLLM engine: the live package.

A running engine changes through one transaction at a time — paused, changed step by step
on every rank, committed, or undone in reverse — driven by one driver in the engine core.
The house has a core and three rooms:

- :mod:`.core` — what every change shares: the driver (:mod:`.core.txn`), the engine-core
  entry that enforces one transaction at a time and patches vLLM's ``EngineCore``
  (:mod:`.core.entry`), the rank side (:mod:`.core.rank`) and its typed records
  (:mod:`.core.records`), the state kept on the engine core (:mod:`.core.state`), the
  shared steps (:mod:`.core.steps`), the replays of vLLM's planning and scheduler set-up
  (:mod:`.core.replay`), and a test facility (:mod:`.core.hold`);
- :mod:`.frontend` — the caller's side of every room's public call, written once;
- the rooms, each with its public API, engine-core side, steps and report:
  :mod:`.resize` (resize, release, resume, inspect the KV cache), :mod:`.carry` (the
  prefix cache kept across a resize: the block pool's plan and the KV bytes' copy) and
  :mod:`.refit` (new weights, checked against a fresh load, with a receipt);
- :mod:`.api` — every room's public names, in one place;
- :mod:`.plugin` — the ``initpipe_resize`` entry point installing every room's methods.

Imports point down: core <- frontend <- carry <- resize, refit (siblings) <- api, plugin.
The public names are :mod:`.api`'s, re-exported at ``initpipe_vllm``'s top level (a room's
name is its package's: ``initpipe_vllm.live.refit`` is the refit room, the function is
``initpipe_vllm.refit``). Importing this package imports neither torch nor vllm.
"""
