"""A small MLP trained under DDP with a comm hook: the scenario the comm-hook tests
(``test_comm_hooks``) and the compression kernels' device-path tests (``tests/unit/test_compression_device``)
run in their spawned ranks."""

from __future__ import annotations

import torch

STEPS = 4
BUCKET_CAP_MB = 0.02  # ~5k floats per bucket: several buckets, exercising DDP's bucket rebuild


def small_mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 96),
        torch.nn.ReLU(),
        torch.nn.Linear(96, 96),
        torch.nn.ReLU(),
        torch.nn.Linear(96, 10),
    )


def mlp_batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 32, generator=g), torch.randn(16, 10, generator=g)


def train_small_ddp(
    hook=None, options=None, *, steps=STEPS, start_step=0, model_state=None, hook_state=None, stats=None
):
    """SGD on :func:`small_mlp` under DDP; returns (flat parameters, hook state, model)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from workers.training.comm import register_comm_hook

    model = small_mlp()
    if model_state is not None:
        model.load_state_dict(model_state)
    ddp = DDP(model, bucket_cap_mb=BUCKET_CAP_MB)
    state = register_comm_hook(ddp, hook, options) if hook else None
    if state is not None and hook_state is not None:
        state.load_state_dict(hook_state)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for step in range(start_step, start_step + steps):
        x, y = mlp_batch(dist.get_rank(), step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        if stats is not None and state is not None:
            stats.append(state.comm_stats())
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return flat, state, model
