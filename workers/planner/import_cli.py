"""``cann-train import-model``: a Hugging Face ``config.json`` (or the model directory holding it) as the
``model.json`` the planner searches and the runtime trains, with its parameter count. Exit 2 when the config
is not one of the families read (the message names the key and what is supported)."""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "import-model", help="a Hugging Face config.json as model.json", description=__doc__.splitlines()[0]
    )
    p.add_argument("source", metavar="DIR_OR_CONFIG", help="a model directory or its config.json")
    p.add_argument(
        "--seq-length", type=int, help="the training sequence (default: the context, at most 4096)"
    )
    p.add_argument("--name", help="the model's name (default: the directory's)")
    p.add_argument("--json", action="store_true", help="print the model document as JSON")
    p.set_defaults(func=import_command)


def import_command(args: argparse.Namespace) -> int:
    from workers.planner.specs import SpecError
    from workers.planner.specs.hf import spec_from_hf_config

    try:
        spec = spec_from_hf_config(args.source, seq_length=args.seq_length, name=args.name)
    except SpecError as exc:
        print(f"cann-train import-model: {exc}", file=sys.stderr)
        return 2
    counts = spec.parameter_count()
    doc = {**spec.to_dict(), "parameters": int(counts["total"])}
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    arch, moe = spec.arch, spec.moe
    rows = [
        f"{spec.name}: {arch.family}, {int(counts['total']):,} parameters",
        f"  layers {spec.num_layers} · hidden {spec.hidden_size} · heads {spec.num_attention_heads} "
        f"(kv {spec.num_kv_heads}, width {spec.head_dim}) · ffn {spec.ffn_hidden_size} · vocab {spec.vocab_size:,}",
        f"  rope theta {arch.rope_theta:g}"
        + (f", {arch.rope_scaling['rope_type']} scaling" if arch.rope_scaling else "")
        + f" · norm eps {arch.norm_eps:g}"
        + (" · q/k/v bias" if arch.qkv_bias else "")
        + (" · q/k norm" if arch.qk_norm else "")
        + (" · tied embeddings" if spec.tied_embeddings else ""),
        f"  training sequence {spec.seq_length} tokens",
    ]
    if moe is not None:
        rows.append(
            f"  experts {moe.num_experts} (top {moe.top_k}, width {moe.expert_ffn_hidden_size}"
            + (f", shared {moe.shared_ffn_hidden_size}" if moe.num_shared_experts else "")
            + f") on {spec.num_moe_layers} of {spec.num_layers} layers"
        )
    print("\n".join(rows))
    return 0
