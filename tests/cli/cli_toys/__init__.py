"""Toy stage modules for the CLI tests (importable with ``tests/cli`` on PYTHONPATH)."""
