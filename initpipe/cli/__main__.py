"""``python -m initpipe.cli``: the same as the ``initpipe`` command."""

from __future__ import annotations

import sys

from .app import main

sys.exit(main())
