"""Example extension: add a stage after the binding stage.

It checks that every attention layer in the forward context now holds the KV view the
pipeline produced for it (the binding's effect, ``layer.kv_cache``), and returns a small
report. A single ``@stage`` function as an entry point is added (or replaces a stage of the
same name). Enable with ``INITPIPE_EXTENSIONS=example_audit``.
"""

from __future__ import annotations

from initpipe import stage


@stage(needs="kv_cache_config", after="runner_kv_caches")
def kv_binding_audit(attention_layers, kv_caches, runner_kv_caches):
    """Every layer's bound kv_cache is the pipeline's view for it; report bytes per layer."""
    report = {}
    for name, layer in attention_layers.items():
        if name not in kv_caches:
            continue
        bound = layer.kv_cache
        bound = bound[0] if isinstance(bound, list) else bound
        view = kv_caches[name]
        if bound.untyped_storage().data_ptr() != view.untyped_storage().data_ptr():
            raise RuntimeError(f"layer {name!r} is bound to another storage than its KV view")
        report[name] = view.numel() * view.element_size()
    return report
