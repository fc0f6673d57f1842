"""Writing files for the user without replacing what already lives at the path.

Every file initpipe writes (``initpipe graph -o``, trace files, failure traces) goes through
:func:`write_file`:

- a regular file, or a path where nothing exists yet, is written atomically: a temporary
  file in the same folder, renamed over the path once complete (readers never see half a
  file; an existing file keeps its permission bits);
- anything else that exists at the path (a character device such as ``/dev/null``, a FIFO)
  is written *through*: opened and written, never renamed over, so the node stays what it
  was (renaming over ``/dev/null`` as root replaces the machine's null device);
- a symlink is followed: the file it points to is written by the same rules and the link
  itself stays a link;
- a folder is refused with :class:`IsADirectoryError`.

:func:`private_dir` gives a per-user folder for files nobody named (failure traces): under
``$XDG_RUNTIME_DIR`` when set, else the system temporary folder, created ``0700`` and
checked to be a real folder owned by this user, never a predictable shared path.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

__all__ = ["private_dir", "write_file"]


def _resolve(path: Path) -> Path:
    """The path to write: the final target of a symlink (chains too), else ``path``."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def write_file(path: str | os.PathLike[str], data: bytes | str) -> Path:
    """Write ``data`` to ``path`` without ever replacing a device, FIFO or symlink.

    Args:
        path: where to write (see the module docstring for what happens per file type).
        data: bytes, or text (written as UTF-8).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        IsADirectoryError: ``path`` is a folder.
        OSError: the write failed; a temporary file is removed, the path is left as it was.
    """
    given = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    target = _resolve(given)
    try:
        st: os.stat_result | None = os.stat(target)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(f"{given} is a folder; give a file path")
    if st is not None and not stat.S_ISREG(st.st_mode):
        with open(target, "wb") as f:  # a device or FIFO: write through, keep the node
            f.write(raw)
        return given
    _write_atomic(target, raw, None if st is None else stat.S_IMODE(st.st_mode))
    return given


def _write_atomic(target: Path, raw: bytes, mode: int | None) -> None:
    folder = target.parent
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        os.chmod(tmp, 0o644 if mode is None else mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def private_dir(name: str = "initpipe") -> Path:
    """A folder only this user can read, created safely on first use.

    ``$XDG_RUNTIME_DIR/<name>`` when ``XDG_RUNTIME_DIR`` is set (already per-user), else
    ``<system tmp>/<name>-<uid>``. The folder is created with mode ``0700``; an existing
    one must be a real folder (not a symlink) owned by this user and closed to others.

    Raises:
        PermissionError: the path exists but is not such a folder (someone else's, a
            symlink, or open to others); the message says what to remove.
    """
    runtime = os.environ.get("XDG_RUNTIME_DIR", "").strip()
    uid = os.getuid() if hasattr(os, "getuid") else None
    if runtime:
        folder = Path(runtime) / name
    else:
        folder = Path(tempfile.gettempdir()) / (f"{name}-{uid}" if uid is not None else name)
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(folder)
    problem = None
    if not stat.S_ISDIR(st.st_mode):
        problem = "is not a folder (or is a symlink)"
    elif uid is not None and st.st_uid != uid:
        problem = f"belongs to uid {st.st_uid}, not to this user (uid {uid})"
    elif st.st_mode & 0o077:
        problem = f"is open to other users (mode {stat.S_IMODE(st.st_mode):o})"
    if problem is not None:
        msg = (
            f"{folder} {problem}; initpipe keeps private files there. Remove it, or set "
            f"XDG_RUNTIME_DIR to a folder of your own."
        )
        raise PermissionError(msg)
    return folder
