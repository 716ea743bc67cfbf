"""``python -m native_ops build``: compile the extension ahead of time and say where and how long."""

from __future__ import annotations

import argparse
import sys

import native_ops


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m native_ops")
    parser.add_argument("command", choices=["build", "where"])
    parser.add_argument("-v", "--verbose", action="store_true", help="show the compiler command lines")
    args = parser.parse_args(argv)
    if args.command == "where":
        print(native_ops.build_dir())
        return 0
    try:
        _, directory, seconds = native_ops.build(verbose=args.verbose)
    except Exception as exc:
        print(f"native_ops: build failed, the pure-torch reference will be used: {exc}", file=sys.stderr)
        return 1
    print(f"native_ops: built {native_ops.EXTENSION_NAME} in {directory} ({seconds:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
