"""A Hugging Face model through the control plane: its config.json stored as a model of the knowledge base,
a job that fine-tunes it from its checkpoint on a local corpus (paths under the directories the operator
allows), a killed rank recovered from a snapshot, the validation loss on the job's stream, and the trained
model downloaded as a Hugging Face directory that transformers loads."""

from __future__ import annotations

import io
import json
import os
import uuid
import zipfile
from pathlib import Path

import pytest
from django.conf import settings

from tests.engines.training.hf.corpus import documents, train_tokenizer, write_jsonl
from tests.engines.training.hf.tiny import save_tiny
from tests.integration.test_jobs import wait_for_state

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def allowed_dir():
    """A directory of this test's own under the first allowed data root (settings.DATA_ROOTS)."""
    root = Path(settings.DATA_ROOTS[0]) / f"test-{uuid.uuid4().hex[:8]}"
    root.mkdir(parents=True)
    yield root


def test_a_hugging_face_model_fine_tunes_recovers_and_exports(live_stack, alice_api, allowed_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    docs = documents(300)
    model_dir = allowed_dir / "tiny-llama"
    save_tiny("llama", model_dir, std=0.02)
    train_tokenizer(docs, model_dir)
    write_jsonl(allowed_dir / "corpus" / "docs.jsonl", docs)

    # the knowledge base: the pasted config.json becomes a model with its family and parameter count
    config = json.loads((model_dir / "config.json").read_text())
    r = alice_api.post(
        "/api/models/from-hf-config/",
        {"config": config, "name": "tiny llama", "seq_length": 32},
        format="json",
    )
    assert r.status_code == 201, r.content
    stored = r.json()
    assert (
        stored["name"] == "tiny llama"
        and stored["architecture"]["family"] == "llama"
        and stored["seq_length"] == 32
    )
    r = alice_api.post(
        "/api/models/from-hf-config/", {"config": {**config, "model_type": "deepseek_v3"}}, format="json"
    )
    assert r.status_code == 400 and "multi-head latent attention" in json.dumps(r.json())

    body = {
        "name": "fine-tune tiny llama",
        "model": {k: v for k, v in stored.items() if k not in ("id", "team", "created_at", "updated_at")},
        "hf_model": str(model_dir),
        "data": str(allowed_dir / "corpus"),
        "val_fraction": 0.1,
        "val_every": 10,
        "strategy": {"dp": 2, "micro_batch_size": 2},
        "training": {"global_batch_size": 4},
        "steps": 30,
        "lr": 0.02,
        "device": "cpu",
        "snapshot_every": 10,
        "inject": "kill-rank@step=15",
    }
    r = alice_api.post("/api/jobs/", body, format="json")
    assert r.status_code == 201, r.content
    job_id = r.json()["id"]
    job = wait_for_state(job_id, {"succeeded", "failed"}, timeout=300)
    assert job.state == "succeeded", (job.human_readable_error, job.log_tail)

    detail = alice_api.get(f"/api/jobs/{job_id}/").json()
    [fault] = detail["faults"]
    # recovered from its newest published snapshot: step 10's (or the start, had the kill come while that
    # asynchronous snapshot was still being written)
    assert (
        fault["kind"] == "rank-killed" and fault["resumed_from_step"] in (None, 0, 10) and fault["rto_s"] > 0
    )
    source = detail["model_source"]
    assert source["family"] == "llama" and source["hf_model"] == str(model_dir)
    assert source["data"] == str(allowed_dir / "corpus") and source["tokens_seen"] == 30 * 4 * 32
    assert source["val_loss"] is not None and source["export_ready"] is True
    events = alice_api.get(f"/api/jobs/{job_id}/events/").json()
    val_steps = [e["step"] for e in events if e["kind"] == "train" and "val_loss" in e["values"]]
    assert val_steps[-2:] == [20, 30], val_steps  # every 10 steps (10 again after the restart) and the end

    r = alice_api.get(f"/api/jobs/{job_id}/export/")
    assert r.status_code == 200 and r["Content-Type"] == "application/zip"
    out = tmp_path / "exported"
    zipfile.ZipFile(io.BytesIO(b"".join(r.streaming_content))).extractall(out)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(out))
    from workers.planner.specs import ModelSpec

    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.num_parameters() == ModelSpec.from_dict(body["model"]).parameter_count()["total"]


def test_paths_outside_the_allowed_directories_are_refused(live_stack, alice_api, allowed_dir, tmp_path):
    save_tiny("llama", tmp_path / "outside")
    (allowed_dir / "link").symlink_to(tmp_path / "outside")
    base = {"name": "x", "strategy": {"dp": 1}, "steps": 2, "device": "cpu"}
    for hf_model, words in (
        (str(tmp_path / "outside"), "outside the directories this deployment allows"),
        (str(allowed_dir / ".." / "elsewhere"), "must not contain '..'"),
        (str(allowed_dir / "link"), "a symlink out of them is followed"),
        ("relative/model", "must be an absolute path"),
        (str(allowed_dir / "missing"), "does not exist"),
    ):
        r = alice_api.post("/api/jobs/", {**base, "hf_model": hf_model}, format="json")
        assert r.status_code == 400, (hf_model, r.content)
        assert any(words in m for m in r.json()["hf_model"]), r.json()
    r = alice_api.get("/api/jobs/999999/export/")
    assert r.status_code == 404
