"""A Hugging Face model loaded into the runtime under tp2, pp2 and (MoE) ep2 gives ``transformers``' logits:
the runtime's own path (``build_model``, then ``parallelize`` with the checkpoint's ``weights_loader``: each
of a rank's stages read, whole, before anything shards it; a pipeline stage reads only its own layers), and
the sharded model's forward compared with the reference's."""

from __future__ import annotations

import pytest
import torch

from tests.engines.ranks import spawn_ranks
from tests.engines.training.hf.tiny import FAMILIES, MOE, logits, save_tiny

pytestmark = [pytest.mark.slow, pytest.mark.long]  # 7 two-rank runs, ~2 min on two cores

SEQ = 32
TOL = 1e-4


def scenarios(rank: int, world: int, directory: str, strategy: dict, tokens: torch.Tensor) -> dict:
    import torch.distributed as dist

    from workers.training.config import JobConfig
    from workers.training.hf import spec_from_hf_config
    from workers.training.hf.runtime import build_model, weights_loader
    from workers.training.parallelize import parallelize

    spec = spec_from_hf_config(directory, seq_length=SEQ)
    cfg = JobConfig.from_dict(
        {
            "model": spec.to_dict(),
            "strategy": strategy,
            "training": {"global_batch_size": 2 * world},
            "hf_model": directory,
        }
    )
    model = build_model(cfg)
    reads: list[int] = []  # the runtime's own path: each stage of this rank filled once the layout split it
    load = weights_loader(cfg)
    pm = parallelize(
        model, cfg, torch.device("cpu"), world, rank, load_weights=lambda part: reads.append(load(part))
    )
    read_by_stage = sum(reads)
    part = pm.raw_parts[0]
    part.eval()
    with torch.no_grad():
        if strategy.get("pp", 1) > 1:  # the stages by hand: stage 0's hidden states to stage 1
            if rank == 0:
                dist.send(part(tokens).contiguous(), 1)
                return {"read_by_stage": read_by_stage}
            hidden = torch.empty(tokens.shape[0], SEQ, cfg.model.hidden_size)
            dist.recv(hidden, 0)
            return {"logits": part(hidden).float(), "read_by_stage": read_by_stage}
        return {"logits": pm.parts[0](tokens).float()}


def _cases():
    """Every family under tp2 and pp2 (a tied model trains on one stage: tp2 only), the MoE families under
    ep2 too; Qwen3 with sequence parallelism (its per-head q/k norms over sharded heads)."""
    for family in FAMILIES:
        yield family, {"tp": 2, **({"sequence_parallel": True} if family == "qwen3" else {})}
        if "tied" not in family:
            yield family, {"pp": 2, "micro_batch_size": 1}
        if family in MOE:
            yield family, {"dp": 2, "ep": 2}


@pytest.mark.parametrize(
    "family, strategy",
    list(_cases()),
    ids=lambda v: v if isinstance(v, str) else "-".join(f"{k}{v}" for k, v in v.items() if v is not True),
)
def test_a_layout_gives_the_reference_logits(family, strategy, tmp_path):
    ref = save_tiny(family, tmp_path / "hf")
    tokens = torch.randint(0, ref.config.vocab_size, (2, SEQ), generator=torch.Generator().manual_seed(3))
    expected = logits(ref, tokens)
    results = spawn_ranks(scenarios, 2, str(tmp_path / "hf"), strategy, tokens)
    got = [r["logits"] for r in results if "logits" in r]
    assert got, results
    for out in got:
        assert (out - expected).abs().max().item() <= TOL
    if "pp" in strategy:
        from workers.training.hf import spec_from_hf_config
        from workers.training.model import Transformer

        # stage 0 read the embedding and its layers' tensors; stage 1 its layers', the final norm and lm_head
        spec = spec_from_hf_config(tmp_path / "hf", seq_length=SEQ)
        per_layer = [
            len(_checkpoint_tensors(spec, block, i)) for i, block in Transformer(spec).layers.items()
        ]
        half = len(per_layer) // 2
        assert [r["read_by_stage"] for r in results] == [1 + sum(per_layer[:half]), sum(per_layer[half:]) + 2]


def _checkpoint_tensors(spec, block, layer_id: str) -> list[str]:
    from workers.training.hf import checkpoint_names

    return [k for name in block.state_dict() for k in checkpoint_names(spec, f"layers.{layer_id}.{name}")]
