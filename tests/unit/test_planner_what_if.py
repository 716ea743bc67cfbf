"""What-if in the engine, shared by the web and the CLI: lose N nodes, and fall back to the largest node
count that admits a layout when none uses every node (the others are reported idle)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.planner_helpers import a100_cluster
from workers.planner import ClusterSpec, ModelSpec, SpecError, TrainingConfig, search
from workers.planner.search import search_allowing_idle_nodes, without_nodes

ROOT = Path(__file__).resolve().parents[2]
MODEL = {
    "name": "gpt-1.3b-like",
    "num_layers": 24,
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "num_kv_heads": 16,
    "ffn_hidden_size": 8192,
    "seq_length": 2048,
    "vocab_size": 51200,
}


def test_losing_nodes_keeps_the_cluster_and_names_the_loss():
    cluster = ClusterSpec.from_dict(a100_cluster(8, name="pod"))
    smaller = without_nodes(cluster, 3)
    assert smaller.num_nodes == 5 and smaller.devices_per_node == 8
    assert smaller.name == "pod minus 3 nodes" and smaller.device == cluster.device
    for bad in (0, 8, -1):
        with pytest.raises(SpecError, match="between 1 and 7") as exc:
            without_nodes(cluster, bad)
        assert exc.value.field == "lose_nodes"


def test_no_layout_on_every_node_falls_back_to_the_largest_node_count_that_has_one():
    # 29 nodes x 8 = 232 devices; a global batch of 32 leaves dp a power of two, 16 heads cannot take a
    # factor of 29 in tp, nor 24 layers in pp (more stages than layers; uneven stages take any pp up to
    # 24): nothing uses all 29 nodes, 28 nodes (pp 7 or 14) work
    model = ModelSpec.from_dict(MODEL)
    training = TrainingConfig.from_dict({"global_batch_size": 32})
    cluster = ClusterSpec.from_dict(a100_cluster(29))
    assert search(model, cluster, training).best is None
    result, used = search_allowing_idle_nodes(model, cluster, training, top_k=3)
    assert result.best is not None and used.num_nodes == result.stats["nodes_used"]
    assert used.num_nodes < 29
    assert (
        search(model, cluster.with_nodes(used.num_nodes + 1), training).best is None or used.num_nodes == 28
    )
    assert f"leaves {29 - used.num_nodes} idle" in result.stats["note"]


def test_a_cluster_that_fits_is_searched_as_is():
    model = ModelSpec.from_dict(MODEL)
    training = TrainingConfig.from_dict({"global_batch_size": 32})
    cluster = ClusterSpec.from_dict(a100_cluster(4))
    result, used = search_allowing_idle_nodes(model, cluster, training, top_k=3)
    assert used is cluster and "note" not in result.stats and result.best is not None


def test_the_cli_runs_the_same_what_if(tmp_path):
    for name, doc in (
        ("model", MODEL),
        ("cluster", a100_cluster(30, name="pod")),
        ("training", {"global_batch_size": 32}),
    ):
        (tmp_path / f"{name}.json").write_text(json.dumps(doc))
    args = [f"--{n}={tmp_path / n}.json" for n in ("model", "cluster", "training")]
    r = subprocess.run(
        [sys.executable, "-m", "workers.cli", "strategy", *args, "--lose-nodes", "1", "--top", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "pod minus 1 node" in r.stdout and "note: no layout uses all 29 nodes" in r.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "workers.cli", "strategy", *args, "--lose-nodes", "30"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "lose_nodes: must be between 1 and 29" in bad.stderr
