"""``cann-train export``: a run's snapshot as a Hugging Face directory (config.json, safetensors and, with
``--tokenizer``, the tokenizer's files) that ``transformers.AutoModelForCausalLM.from_pretrained`` loads. Exit 2
when the snapshot cannot be exported (the message says why)."""

from __future__ import annotations

import argparse
import sys


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "export", help="a snapshot as a Hugging Face model directory", description=__doc__.splitlines()[0]
    )
    p.add_argument("--snapshot", required=True, help="the snapshot directory (<snapshot_dir>/step-00000020)")
    p.add_argument("--out", required=True, help="the directory to write")
    p.add_argument("--tokenizer", help="a tokenizer.json's directory to copy beside the weights")
    p.set_defaults(func=export_command)


def export_command(args: argparse.Namespace) -> int:
    from workers.training.hf.snapshot_export import ExportError, export_snapshot

    try:
        out = export_snapshot(args.snapshot, args.out, tokenizer_dir=args.tokenizer)
    except ExportError as exc:
        print(f"cann-train export: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0
