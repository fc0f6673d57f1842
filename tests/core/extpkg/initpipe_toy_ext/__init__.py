"""A toy extension package for the core tests (used with tests/core/coretoys/linear.py)."""

from initpipe import Extension, stage


@stage(needs="model", provides="b")
def double_b(a):
    """Replacement for linear.b: quadruple instead of double."""
    return a * 4


DOUBLE = Extension(name="toy_double", replace={"b": double_b})


@stage(needs="kv_cache_config", after="d")
def audit(d):
    """An added stage that runs after d."""
    return f"audited {d}"


@stage(needs="model", provides="b2")
def needs_nothing_known(no_such_key):
    return 0


BROKEN = Extension(name="toy_broken", add=[needs_nothing_known])
