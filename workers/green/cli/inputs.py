"""What every ``cann-train green`` command shares: its exit codes, the error for bad input, and reading a
JSON file named by a flag."""

from __future__ import annotations

import json
from pathlib import Path

EXIT_OK, EXIT_INVALID, EXIT_NO_ROOM = 0, 2, 3


class InputError(ValueError):
    """Bad command-line input; the message names the flag or the file and line."""


def read_json(path: str, flag: str):
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{flag}: cannot read {path}: {exc.strerror or exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{flag}: {path} is not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
