"""The core tests: toy stage modules are importable as ``coretoys.<name>`` (pytest's
``pythonpath`` setting in pyproject.toml puts this folder on ``sys.path``)."""
