"""Test-only extension: a binding stage that always fails (after the KV allocation)."""

from initpipe import stage


@stage(needs="kv_cache_config", provides="runner_kv_caches")
def runner_kv_caches(kv_caches, attn_groups):
    raise RuntimeError("binding refused by initpipe-fail-ext")
