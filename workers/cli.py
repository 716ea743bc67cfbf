"""The ``cann-train`` command.

Each engine registers its own subcommand from a small module (``workers/<engine>/cli.py``) exposing
``register(subparsers)``; the module is imported lazily so that ``cann-train strategy`` never pays for
importing torch. Exit codes: 0 ok, 2 invalid input, 3 nothing fits / cannot run, 1 unexpected failure.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module that defines ``register(subparsers)``
SUBCOMMANDS: dict[str, str] = {
    "strategy": "workers.planner.cli",
    "import-model": "workers.planner.import_cli",
    "calibrate": "workers.training.calibrate_cli",
    "train": "workers.training.cli",
    "export": "workers.training.hf.cli",
    "comm-opt": "workers.training.comm.cli",
    "elastic": "workers.reliability.cli",
    "launch": "workers.reliability.launch_cli",
    "green": "workers.green.cli",
    "faults": "workers.reliability.faults_cli",
    "render": "workers.deploy.cli",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cann-train", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    seen: set[str] = set()
    for name, module_name in SUBCOMMANDS.items():
        if only is not None and name != only:
            continue
        if module_name in seen:
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                continue  # engine not built yet in this checkout
            raise
        module.register(sub)
        seen.add(module_name)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    only = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    parser = build_parser(only)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
