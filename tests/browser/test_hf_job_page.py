"""A Hugging Face model from the browser: its config.json uploaded on the launch form (stored as a model of the
knowledge base), its weights and a local corpus named by path, a rank killed mid-run and recovered from a
snapshot, the validation loss charted beside the training loss, and the trained model downloaded as a
Hugging Face directory that transformers loads."""

from __future__ import annotations

import json
import uuid
import zipfile
from pathlib import Path

import pytest
from django.conf import settings

from tests.browser.test_job_pages import log_in
from tests.engines.training.hf.corpus import documents, train_tokenizer, write_jsonl
from tests.engines.training.hf.tiny import save_tiny
from tests.integration.test_jobs import wait_for_state

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]


def test_a_hugging_face_model_launched_from_the_page_recovers_charts_validation_and_exports(
    live_stack, page, alice, tmp_path
):
    from transformers import AutoModelForCausalLM

    from controlplane.jobs.models import TrainingJob

    root = Path(settings.DATA_ROOTS[0]) / f"test-{uuid.uuid4().hex[:8]}"
    docs = documents(300)
    save_tiny("qwen2", root / "qwen2", std=0.02)
    train_tokenizer(docs, root / "qwen2")
    write_jsonl(root / "corpus" / "docs.jsonl", docs)

    log_in(page, live_stack.base_url, "alice")
    page.goto(live_stack.base_url + "/jobs/")
    page.fill("#launch-form input[name=name]", "qwen2 from the page")
    page.select_option("#launch-form select[name=strategy]", "dp2")
    page.fill("#launch-form input[name=steps]", "30")
    page.fill("#launch-form input[name=profile_every]", "0")
    page.fill("#launch-form input[name=snapshot_every]", "10")
    page.fill("#launch-form input[name=inject]", "kill-rank@step=15")
    page.fill("#launch-form input[name=seq_length]", "32")
    page.set_input_files("#hf-config", str(root / "qwen2" / "config.json"))
    page.wait_for_function("() => document.getElementById('hf-model-summary').dataset.family === 'qwen2'")
    assert "stored as model #" in page.inner_text("#hf-model-summary")
    page.fill("#launch-form input[name=hf_model]", str(root / "qwen2"))
    page.fill("#launch-form input[name=data]", str(root / "corpus"))
    page.fill("#launch-form input[name=val_fraction]", "0.1")
    page.fill("#launch-form input[name=val_every]", "10")
    page.click("#launch-button")
    page.wait_for_function(
        "() => location.pathname !== '/jobs/' || document.getElementById('launch-errors').children.length",
        timeout=30000,
    )
    if page.url.endswith("/jobs/"):  # still on the form: what it refused
        assert page.inner_text("#launch-errors") == ""
    page.wait_for_url(f"{live_stack.base_url}/jobs/*/", timeout=30000)
    job = TrainingJob.objects.get(name="qwen2 from the page")
    assert (
        job.config["hf_model"] == str(root / "qwen2")
        and job.config["model"]["architecture"]["family"] == "qwen2"
    )

    job = wait_for_state(job.pk, {"succeeded", "failed"}, timeout=300)
    assert job.state == "succeeded", (job.human_readable_error, job.log_tail)
    page.wait_for_selector("#job-state[data-state=succeeded]", timeout=60000)
    assert page.inner_text("#job-family").startswith("qwen2")
    assert str(root / "corpus") in page.inner_text("#job-data")
    assert page.inner_text("#job-tokens-seen") == str(30 * job.config["training"]["global_batch_size"] * 32)
    # the fault, recovered from the step-10 snapshot
    assert job.faults.get().kind == "rank-killed"
    # the validation loss: a trace of its own on the loss chart, with the steps it was measured at
    val = page.evaluate(
        "() => document.getElementById('chart-loss').data.filter(t => t.name.endsWith('validation') && t.showlegend)"
        ".map(t => t.x.filter((x, i) => t.y[i] != null))"
    )
    assert [20, 30] == sorted({x for xs in val for x in xs})[-2:], val
    assert page.inner_text("#job-val-loss") != "—"
    # the export: downloaded from the page, loaded by transformers
    with page.expect_download() as download:
        page.click("#export-link")
    path = tmp_path / "export.zip"
    download.value.save_as(path)
    zipfile.ZipFile(path).extractall(tmp_path / "export")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "export")
    assert model.config.model_type == "qwen2"
    assert json.loads((tmp_path / "export" / "config.json").read_text())["num_hidden_layers"] == 4
    assert page.js_errors == []
