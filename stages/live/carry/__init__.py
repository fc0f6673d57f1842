"""The prefix cache kept across a resize.

The scheduler's side (:mod:`.pool`: which cached blocks survive, at which ids), the ranks'
side (:mod:`.kv_copy`: their KV bytes set aside and written back), the steps on the driver
(:mod:`.steps`) and what the report says (:mod:`.report`).
"""
