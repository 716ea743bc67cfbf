"""The pieces of a training state the snapshot holds beside model and optimizer: RNG streams, comm-hook
state as tensors, interleaved pipeline stages under the unsplit model's names, per-rank names for expert
chunks."""

from __future__ import annotations

import random

import numpy as np
import torch

from workers.training.checkpoint.state import (
    ModelView,
    capture_rng,
    pack_tensors,
    restore_rng,
    state_module,
    suffix_keys,
    unpack_tensors,
    unsuffix_keys,
)
from workers.training.config import parse_model
from workers.training.examples import example
from workers.training.model import Transformer
from workers.training.parallel.pipeline import pipeline_split


def draws() -> tuple:
    return torch.rand(3).tolist(), random.random(), np.random.rand()


def test_every_rng_stream_continues_where_it_was_captured():
    torch.manual_seed(1), random.seed(2), np.random.seed(3)
    draws()
    saved = capture_rng()
    expected = draws()
    draws()  # the streams move on
    restore_rng(saved)
    assert draws() == expected


def test_comm_hook_state_packs_into_flat_tensors_and_back():
    state = {
        "step": 7,
        "residuals": {"layers.0.attention.wq.weight": torch.randn(4, 4), "output.weight": torch.randn(3)},
        "powersgd": {"error_dict": {0: torch.randn(5)}, "rng": np.random.RandomState(0), "iter": 3},
        "pair": (torch.ones(2), "x"),
    }
    packed = pack_tensors(state, "rank1/")
    assert all("." not in key for key in packed)  # DCP keeps these names as they are
    tensors = {k: v for k, v in packed.items() if isinstance(v, torch.Tensor)}
    assert len(tensors) == 4
    back = unpack_tensors({**packed, "rank0/t0": torch.zeros(1)}, "rank1/")
    assert back["step"] == 7 and back["powersgd"]["iter"] == 3 and back["pair"][1] == "x"
    assert torch.equal(back["residuals"]["output.weight"], state["residuals"]["output.weight"])
    assert torch.equal(back["powersgd"]["error_dict"][0], state["powersgd"]["error_dict"][0])
    assert back["powersgd"]["rng"].rand() == np.random.RandomState(0).rand()


def test_interleaved_stages_of_a_rank_keep_the_unsplit_models_names():
    model = Transformer(parse_model(example("tiny-dense.json")))  # 4 layers
    full = set(model.state_dict())
    seen = set()
    for pp_rank in range(2):  # pp 2 x vpp 2: rank 0 holds stages 0 and 2, rank 1 stages 1 and 3
        parts = [part for _, part in pipeline_split(model, pp_rank, pp=2, vpp=2)]
        names = set(state_module(parts).state_dict())
        assert names <= full
        assert not names & seen  # no two ranks claim the same entry
        seen |= names
        view = ModelView(parts)
        assert {p for p in view.parameters()} == {p for part in parts for p in part.parameters()}
    assert seen == full


def test_expert_chunks_get_the_rank_coordinate_in_their_names_and_lose_it_again():
    fqns = {"layers.1.moe.experts.w1"}
    model_sd = {"layers.1.moe.experts.w1": 1, "layers.1.moe.router.weight": 2}
    optim_sd = {
        "state.layers.1.moe.experts.w1.exp_avg": 3,
        "param_groups.layers.1.moe.experts.w1.lr": 4,
        "state.layers.1.moe.router.weight.exp_avg": 5,
    }
    renamed = suffix_keys(model_sd, fqns, "@ep1of2")
    assert set(renamed) == {"layers.1.moe.experts.w1@ep1of2", "layers.1.moe.router.weight"}
    renamed_optim = suffix_keys(optim_sd, fqns, "@ep1of2")
    assert set(renamed_optim) == {
        "state.layers.1.moe.experts.w1@ep1of2.exp_avg",
        "param_groups.layers.1.moe.experts.w1@ep1of2.lr",
        "state.layers.1.moe.router.weight.exp_avg",
    }
    assert unsuffix_keys(renamed, fqns, "@ep1of2") == model_sd
    assert unsuffix_keys(renamed_optim, fqns, "@ep1of2") == optim_sd
