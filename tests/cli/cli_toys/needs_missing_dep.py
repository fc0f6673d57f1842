"""A module whose own import fails: it needs a package that is not installed."""

import initpipe_no_such_dependency  # noqa: F401
