"""Tokens per second of cann-train's runtime against transformers' own training loop, on the same tiny Llama,
the same batch and the same tokens, on this machine's CPUs: one process, and data parallel over two (DDP
over gloo on both sides), measured side by side in one run.

transformers' side is the loop its documentation writes (``model(input_ids, labels=...)``, ``loss.backward()``,
``AdamW.step()``, ``zero_grad``), under ``torch.nn.parallel.DistributedDataParallel`` for two ranks;
ours is ``cann-train train --hf-model`` on the same checkpoint (``workers.training.cli.run_local``: torchrun,
the runtime's DDP, AdamW, gradient clipping, metrics). Both skip their first ``--warmup`` steps. Same
micro-batch, same global batch, same sequence length, fp32, one torch thread per rank.

    .venv/bin/python bench/hf_train.py [--steps 30] [--hidden 256] [--layers 4] [--json]
"""

from __future__ import annotations

import json
import os
import statistics
import time

from harness import bench_parser, scratch_dir

from workers.training.launch import free_port


def tiny_llama(directory, args) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 8 // 3 // 8 * 8,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64,
        num_key_value_heads=max(1, args.hidden // 128),
        vocab_size=args.vocab,
        max_position_embeddings=args.seq,
    )
    LlamaForCausalLM(cfg).save_pretrained(directory)


def tokens_file(directory, args) -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    np.save(directory / "tokens.npy", rng.integers(0, args.vocab, size=200_000, dtype=np.int64))


def _hf_rank(rank: int, world: int, model_dir: str, data: str, args, port: int, out: str) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    model = AutoModelForCausalLM.from_pretrained(model_dir).train()
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95))
    tokens = np.load(data)
    per_rank = args.batch // world
    micro = args.micro
    times = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        for m in range(per_rank // micro):
            start = ((step * args.batch + rank * per_rank + m * micro) * (args.seq + 1)) % (
                len(tokens) - 10_000
            )
            batch = torch.from_numpy(
                tokens[start : start + micro * (args.seq + 1)].reshape(micro, args.seq + 1)
            )
            inputs, labels = batch[:, :-1], batch[:, 1:]
            no_sync = model.no_sync() if world > 1 and m < per_rank // micro - 1 else _null()
            with no_sync:
                logits = model(input_ids=inputs).logits
                loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
                (loss / (per_rank // micro)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(times, f)
    if world > 1:
        dist.destroy_process_group()


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def transformers_loop(model_dir, data, args, world: int, tmp) -> list[float]:
    import torch.multiprocessing as mp

    out = tmp / f"hf-{world}.json"
    os.environ["OMP_NUM_THREADS"] = "1"
    mp.spawn(
        _hf_rank,
        args=(world, str(model_dir), str(data), args, free_port(), str(out)),
        nprocs=world,
        join=True,
    )
    return json.loads(out.read_text())


def ours(model_dir, data, args, world: int) -> list[float]:
    from workers.planner.specs.hf import spec_from_hf_config
    from workers.training.cli import run_local
    from workers.training.config import JobConfig

    cfg = JobConfig.from_dict(
        {
            "model": spec_from_hf_config(model_dir, seq_length=args.seq).to_dict(),
            "strategy": {"dp": world, "micro_batch_size": args.micro},
            "training": {"global_batch_size": args.batch},
            "steps": args.steps,
            "hf_model": str(model_dir),
            "data": str(data),
            "lr": 1e-4,
            "energy": {"enabled": False},
        }
    )
    return run_local(cfg, world, timeout=1800)["step_times_s"]


def main() -> None:
    parser = bench_parser(__doc__, json_flag=True)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8, help="global batch (sequences)")
    parser.add_argument("--micro", type=int, default=2, help="micro-batch (sequences)")
    args = parser.parse_args()
    rows = []
    with scratch_dir("cann-hf-train-") as tmp:
        model_dir, data = tmp / "llama", tmp / "data"
        data.mkdir()
        tiny_llama(model_dir, args)
        tokens_file(data, args)
        tokens_per_step = args.batch * args.seq
        for world in (1, 2):
            hf = transformers_loop(model_dir, data / "tokens.npy", args, world, tmp)[args.warmup :]
            us = ours(model_dir, data, args, world)[args.warmup :]
            hf_tps, our_tps = tokens_per_step / statistics.median(hf), tokens_per_step / statistics.median(us)
            rows.append(
                {
                    "ranks": world,
                    "transformers_tokens_per_s": round(hf_tps),
                    "cann_train_tokens_per_s": round(our_tps),
                    "ratio": round(our_tps / hf_tps, 3),
                }
            )
    if args.json:
        print(json.dumps({"config": vars(args), "rows": rows}))
        return
    print(
        f"tiny Llama ({args.hidden} hidden, {args.layers} layers, vocab {args.vocab}), batch {args.batch} x {args.seq} tokens, fp32, CPU"
    )
    print(f"{'ranks':>5} {'transformers tok/s':>19} {'cann-train tok/s':>17} {'ratio':>7}")
    for r in rows:
        print(
            f"{r['ranks']:>5} {r['transformers_tokens_per_s']:>19,} {r['cann_train_tokens_per_s']:>17,} {r['ratio']:>7.2f}"
        )


if __name__ == "__main__":
    main()
