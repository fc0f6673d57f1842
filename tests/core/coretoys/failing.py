"""Toy: exception classes a stage may raise, importable by name (pickling, subprocesses)."""


class DeviceOutOfMemory(RuntimeError):
    """Stands in for ``torch.OutOfMemoryError`` (a RuntimeError subclass) in core tests."""


class QuotaError(Exception):
    """A custom signature and ``__str__``: neither may leak into the StageError."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(code, detail)
        self.code = code
        self.detail = detail

    def __str__(self) -> str:
        return f"quota {self.code}: {self.detail}"


class DiskError(OSError):
    """An OSError subclass (its C fields: errno, strerror, filename)."""
