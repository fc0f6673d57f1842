"""New weights into a running engine, checked against what a fresh load holds.

The public API (:mod:`.api`), the engine-core side and steps (:mod:`.engine`), the weights'
checks, load and digest on every rank (:mod:`.weights`), the comparison with the engine's
own fresh load (:mod:`.coverage`), the probe (:mod:`.probe`) and the receipt
(:mod:`.receipt`).
"""
