"""Small file helpers: atomic writes, reading length lists, bundled data."""

from __future__ import annotations

import json
import os
import re
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import InvalidArgument

__all__ = ["atomic_write_text", "atomic_write_bytes", "read_lengths_input", "read_json_objects", "DATA_DIR",
           "EXAMPLE_GROUP"]

DATA_DIR = Path(__file__).with_name("data")
EXAMPLE_GROUP = DATA_DIR / "example_group.json"


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` so that readers see the old file or the whole new one, never a
    part: :func:`atomic_write_bytes`."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never a part
    (a hidden temporary file beside it, synced, then renamed over it).

    The new file gets the old file's permissions, or those a plain ``open`` gives (umask applies).
    An ``OSError`` names ``path`` (never the hidden temporary file next to it) and keeps its type.
    """
    if not os.fspath(path).strip():
        raise FileNotFoundError("cannot write '': an empty path, expected a file path")
    target = Path(path)
    if not target.name or target.is_dir():
        raise IsADirectoryError(f"cannot write {str(path)!r}: it is a directory, expected a file path")
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "xb") as handle:  # "x": never clobber another writer's file
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if target.exists():
            os.chmod(tmp, target.stat().st_mode & 0o7777)
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        reason = exc.strerror or str(exc)
        raise type(exc)(f"cannot write {str(path)!r}: {reason}") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_json_objects(path: str | os.PathLike, argument: str) -> Iterator[tuple[int, dict]]:
    """(line number, object) for every non-blank line of a JSON-lines file. An unreadable file, a line
    that is not JSON or not a JSON object raises :class:`InvalidArgument` naming ``argument`` and, for
    a line, ``"<path> line <n>"``. ``"-"`` reads standard input."""
    try:
        text = sys.stdin.read() if os.fspath(path) == "-" else Path(path).read_text(encoding="utf-8")
        path = "<stdin>" if os.fspath(path) == "-" else path
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgument(argument, str(path), f"a readable JSON-lines file ({exc.__class__.__name__})") from None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidArgument(argument, f"{path} line {number}", f"a JSON object per line ({exc.msg})") from None
        if not isinstance(record, dict):
            raise InvalidArgument(argument, f"{path} line {number}",
                                  f"a JSON object per line, not {type(record).__name__}")
        yield number, record


def read_lengths_input(source: str | None) -> dict[str, Any]:
    """Read predicted lengths from a file, ``-`` (stdin) or the bundled example (None).

    Returns a dict with at least ``lengths``; a JSON object may also carry ``reserve_lengths``,
    ``prompt_tokens``, ``max_new_tokens``, ``slots``, ``budget`` and a ``source`` note.
    """
    if source is None:
        name, text = str(EXAMPLE_GROUP), EXAMPLE_GROUP.read_text(encoding="utf-8")
    elif source == "-":
        name, text = "<stdin>", sys.stdin.read()
    else:
        name = source
        try:
            text = Path(source).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidArgument("lengths", source, f"a readable text file ({exc.__class__.__name__})") from None
    stripped = text.strip()
    if stripped.startswith(("[", "{")):
        try:
            data = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise InvalidArgument("lengths", name, f"valid JSON ({exc.msg} at line {exc.lineno})") from None
        data = {"lengths": data} if isinstance(data, list) else data
        if not isinstance(data, dict) or "lengths" not in data:
            raise InvalidArgument("lengths", name, "a JSON list, or an object with a 'lengths' list")
        return data
    tokens = [t for t in re.split(r"[\s,]+", stripped) if t]
    try:
        values = [float(t) for t in tokens]
    except ValueError:
        bad = next(t for t in tokens if not _is_number(t))
        raise InvalidArgument("lengths", name,
                              f"numbers separated by spaces, commas or newlines (found {bad!r})") from None
    return {"lengths": values}


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
