"""The command line of hot swap's processes: ``python -m workers.reliability.hotswap replica|lighthouse``
(started by :func:`~workers.reliability.hotswap.run_hot_swap`, not by hand)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from workers.reliability.hotswap.lighthouse import lighthouse_main
from workers.reliability.hotswap.replica import replica_main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.reliability.hotswap")
    sub = parser.add_subparsers(dest="role", required=True)
    r = sub.add_parser("replica", help="one replica process (started by run_hot_swap)")
    r.add_argument("--spec", required=True, type=Path)
    slot = r.add_mutually_exclusive_group(required=True)
    slot.add_argument("--replica", type=int, help="the replica slot this process trains as")
    slot.add_argument("--spare", type=int, help="a warm spare: waits for spare<k>.assign")
    r.add_argument("--attempt", type=int, default=1)
    lh = sub.add_parser("lighthouse", help="the torchft Lighthouse (started by run_hot_swap)")
    lh.add_argument("--bind", required=True)
    lh.add_argument("--heartbeat-timeout-ms", type=int, default=1000)
    lh.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    if args.role == "lighthouse":
        return lighthouse_main(args.bind, args.heartbeat_timeout_ms, args.out)
    code = replica_main(args.spec, args.replica, args.attempt, args.spare)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the gloo group and torchft's threads need no teardown: the peers expect us gone
