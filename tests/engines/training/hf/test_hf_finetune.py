"""A Hugging Face model fine-tuned by ``cann-train train`` on a local corpus with a tokenizer trained in the
test: the corpus tokenized once into cached shards, the loss falls over 30 steps, a validation loss on the
held-out documents, and the exported directory loads in ``transformers`` with the runtime's final model:
its loss on the same validation batches is the runtime's own validation loss."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.engines.training.hf.corpus import documents, train_tokenizer, write_jsonl
from tests.engines.training.hf.tiny import save_tiny

pytestmark = pytest.mark.slow

SEQ = 32
GBS = 4


def cann_train(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def validation_loss_of(model_dir, val_shards) -> float:
    """transformers' own loss on the batches the runtime validates on (its loader, one data-parallel rank:
    the global batch the ranks' slices make up)."""
    from transformers import AutoModelForCausalLM

    from workers.training.data import ShardedTokenLoader, TokenCorpus
    from workers.training.validation import VAL_BATCHES

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    corpus = TokenCorpus(val_shards)
    loader = ShardedTokenLoader(corpus, SEQ, GBS, dp_rank=0, dp_size=1, seed=0, consumed_samples=0)
    batches = min(VAL_BATCHES, corpus.num_tokens // (SEQ + 1) // GBS)
    losses = []
    with torch.no_grad():
        for _ in range(batches):
            inputs, labels = loader.next_batch()
            logits = model(inputs).logits.float()
            losses.append(torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten()))
    return float(torch.stack(losses).mean())


@pytest.mark.parametrize(
    "family, strategy", [("llama", {"dp": 2}), ("qwen3", {"tp": 2})], ids=["llama-dp2", "qwen3-tp2"]
)
def test_a_fine_tune_on_a_local_corpus_exports_what_it_trained(family, strategy, tmp_path):
    docs = documents(400)
    model_dir = tmp_path / "model"
    save_tiny(family, model_dir, std=0.02)
    train_tokenizer(docs, model_dir)  # the model's own tokenizer: beside its weights
    data = tmp_path / "corpus"
    write_jsonl(data / "part-0.jsonl", docs[:250])
    write_jsonl(data / "part-1.jsonl", docs[250:])
    (tmp_path / "strategy.json").write_text(json.dumps({**strategy, "micro_batch_size": 2}))
    out = tmp_path / "exported"
    run = cann_train(
        "train", "--hf-model", str(model_dir), "--data", str(data), "--seq-length", str(SEQ),
        "--strategy", str(tmp_path / "strategy.json"), "--global-batch-size", str(GBS), "--steps", "30",
        "--lr", "0.02", "--val-fraction", "0.1", "--val-every", "10", "--save-hf", str(out), "--json",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout)
    assert summary["steps"] == 30
    first, last = sum(summary["losses"][:5]) / 5, sum(summary["losses"][-5:]) / 5
    assert last < first - 0.5, summary["losses"]  # ln(320) = 5.77 at the start
    assert summary["val_loss"] is not None and summary["val_loss"] < summary["losses"][0]
    # tokenized once, beside the data: the cache's manifest says what it holds
    [manifest] = list((data / ".cann-tokens").glob("*/manifest.json"))
    held = json.loads(manifest.read_text())
    assert held["documents"] == 400 and held["val_documents"] == 40 and held["val_tokens"] > 0
    # the export: transformers' loss on the runtime's validation batches is the runtime's validation loss
    assert {p.name for p in out.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json"}
    val_shards = [manifest.parent / n for n in held["val_shards"]]
    assert validation_loss_of(out, val_shards) == pytest.approx(summary["val_loss"], abs=1e-4)


def test_bad_corpus_input_is_refused_before_any_rank_starts(tmp_path):
    docs = documents(40)
    model_dir = tmp_path / "model"
    save_tiny("llama", model_dir)
    (tmp_path / "strategy.json").write_text(json.dumps({"dp": 1}))
    base = [
        "train",
        "--hf-model",
        str(model_dir),
        "--seq-length",
        str(SEQ),
        "--strategy",
        str(tmp_path / "strategy.json"),
    ]

    big = tmp_path / "big"
    train_tokenizer(docs + [" ".join(f"w{i}" for i in range(3000))], big, vocab_size=600)
    write_jsonl(tmp_path / "c" / "a.jsonl", docs)
    run = cann_train(*base, "--tokenizer", str(big), "--data", str(tmp_path / "c"))
    assert run.returncode == 2 and "tokenizer" in run.stderr and "more than the model's 320" in run.stderr, (
        run.stderr
    )

    train_tokenizer(docs, model_dir)
    run = cann_train(*base, "--data", str(tmp_path / "c"), "--data-field", "body")
    assert run.returncode == 2 and "has no field 'body'" in run.stderr and "a.jsonl:1" in run.stderr, (
        run.stderr
    )

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "ids.npy").write_bytes(b"garbage")
    run = cann_train(*base, "--data", str(tmp_path / "d"))
    assert run.returncode == 2 and "not a readable .npy token shard" in run.stderr, run.stderr

    (model_dir / "model.safetensors").unlink()
    run = cann_train(*base, "--data", str(tmp_path / "c"))
    assert run.returncode == 2 and "no model.safetensors" in run.stderr, run.stderr

    run = cann_train("import-model", str(tmp_path))
    assert run.returncode == 2 and "no config.json" in run.stderr


def test_a_snapshot_exports_the_weights_the_run_ended_with(tmp_path):
    """An expert-parallel MoE run (dp2 ep2) ends on a snapshot and writes its model; ``cann-train export`` of
    that snapshot, in one process, writes the same tensors (the experts each rank kept joined back)."""
    from safetensors.torch import load_file

    docs = documents(200)
    model_dir = tmp_path / "model"
    save_tiny("qwen2_moe", model_dir, std=0.02)
    train_tokenizer(docs, model_dir)
    write_jsonl(tmp_path / "corpus" / "docs.jsonl", docs)
    (tmp_path / "strategy.json").write_text(json.dumps({"dp": 2, "ep": 2, "micro_batch_size": 2}))
    run = cann_train(
        "train", "--hf-model", str(model_dir), "--data", str(tmp_path / "corpus"), "--seq-length", str(SEQ),
        "--strategy", str(tmp_path / "strategy.json"), "--global-batch-size", str(GBS), "--steps", "10",
        "--snapshot-every", "10", "--snapshot-dir", str(tmp_path / "snap"), "--save-hf", str(tmp_path / "end"),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    run = cann_train(
        "export", "--snapshot", str(tmp_path / "snap" / "step-00000010"), "--out", str(tmp_path / "from-snapshot"),
        "--tokenizer", str(model_dir),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    end = load_file(tmp_path / "end" / "model.safetensors")
    again = load_file(tmp_path / "from-snapshot" / "model.safetensors")
    assert end.keys() == again.keys() and any(".experts.3." in k for k in end)
    assert all(torch.equal(end[k], again[k]) for k in end)
    assert (tmp_path / "from-snapshot" / "tokenizer.json").is_file()
    original = load_file(model_dir / "model.safetensors")
    assert not torch.equal(
        original["model.layers.1.mlp.experts.3.up_proj.weight"],
        end["model.layers.1.mlp.experts.3.up_proj.weight"],
    )

    run = cann_train(
        "export", "--snapshot", str(tmp_path / "snap" / "step-00000099"), "--out", str(tmp_path / "x")
    )
    assert run.returncode == 2 and "there is no snapshot step-00000099" in run.stderr, run.stderr


@pytest.mark.long
def test_a_hugging_face_run_killed_mid_way_recovers_bit_for_bit(tmp_path):
    """A fine-tune on a tokenized corpus whose rank is killed at step 12 recovers from its newest snapshot
    (``cann-train elastic``: torchrun restarts the group) and ends with the very losses of the run that was
    never interrupted (the command runs that reference beside it and compares)."""
    docs = documents(300)
    model_dir = tmp_path / "model"
    save_tiny("qwen3", model_dir, std=0.02)
    train_tokenizer(docs, model_dir)
    write_jsonl(tmp_path / "corpus" / "docs.jsonl", docs)
    (tmp_path / "strategy.json").write_text(json.dumps({"dp": 2, "micro_batch_size": 2}))
    run = cann_train(
        "elastic", "--json", "--hf-model", str(model_dir), "--data", str(tmp_path / "corpus"), "--seq-length",
        str(SEQ), "--strategy", str(tmp_path / "strategy.json"), "--global-batch-size", str(GBS), "--steps", "20",
        "--snapshot-every", "5", "--inject", "kill-rank@step=12",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    # from the newest snapshot published before the kill: step 10's, or step 5's when the kill came while
    # step 10's was still being written (snapshots are asynchronous)
    [fault] = report["faults"]
    assert fault["kind"] == "rank-killed" and fault["resumed_from_step"] in (5, 10), report["faults"]
    assert report["loss_bitwise_equal"] and report["steps_compared"] == 20
