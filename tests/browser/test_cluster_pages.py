"""The cluster knowledge base in a browser: a cluster made in the form (a hardware profile fills its device;
a wrong field shows the planner's own message beside it while the user types), drawn on its page, searched
on from the planner, its best plan opened; then the cluster edited and the plan still costing the figures
it was planned with, from the document it keeps."""

from __future__ import annotations

import re

import pytest

from tests.browser.test_crawl import log_in, wait_search
from tests.integration.test_authorization_matrix import HF_CONFIG

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]


def planner_message(document: dict, field: str) -> str:
    from workers.planner import ClusterSpec, SpecError

    with pytest.raises(SpecError) as refused:
        ClusterSpec.from_dict(document)
    return "; ".join(refused.value.errors[field])


def test_a_cluster_made_in_the_form_is_drawn_searched_on_and_edited_without_moving_its_plan(
    live_stack, page, make_member
):
    from controlplane.clusters.models import Cluster
    from controlplane.planning.models import StoredModelSpec, StoredPlan
    from controlplane.planning.seed import seed_knowledge_base

    alice = make_member("alice", "Team A")
    seed_knowledge_base(team=alice.teams.first())
    base = live_stack.base_url
    log_in(page, base, "alice")
    page.goto(base + "/clusters/")
    page.click("#new-cluster")
    page.wait_for_url(base + "/clusters/new/")
    page.wait_for_selector("#cluster-form[data-ready='1']")

    page.select_option("#start-profile", "A100-SXM4-80GB")  # the device's figures from the profile
    assert page.input_value("input[name='device.peak_tflops']").startswith("bf16=312")
    for name, value in {
        "name": "my pod",
        "num_nodes": "8",
        "devices_per_node": "8",
        "intra_node.kind": "nvswitch",
        "intra_node.latency_us": "3",
        "inter_node.kind": "roce-200ge",
        "inter_node.bandwidth_GBps": "25",
        "inter_node.latency_us": "5",
    }.items():
        page.fill(f"input[name='{name}']", value)
    page.click("#add-tier")
    page.fill("input[name='tiers[0].name']", "leaf")
    page.fill("input[name='tiers[0].nodes']", "4")
    page.fill("input[name='tiers[0].oversubscription']", "2")
    # 8 nodes under 4-node leaves at 2:1: 64 devices / 2 x 25 GB/s / 2 (each keystroke is checked: the last one)
    page.wait_for_function("() => document.getElementById('preview-bisection')?.textContent === '400'")

    # a wrong field: the planner's message, beside the field, as the user types
    page.fill("input[name='device.memory_GiB']", "0")
    beside = ".field-error[data-for='device.memory_GiB']"
    page.wait_for_function(f"() => document.querySelector(\"{beside}\").textContent !== ''")
    cluster_doc = {
        "name": "my pod",
        "num_nodes": 8,
        "devices_per_node": 8,
        "device": {
            "name": "A100-SXM4-80GB",
            "peak_tflops": {"bf16": 312},
            "memory_GiB": 0,
            "memory_bandwidth_GBps": 2039,
        },
        "intra_node": {"kind": "nvswitch", "bandwidth_GBps": 300, "latency_us": 3},
        "inter_node": {"kind": "roce-200ge", "bandwidth_GBps": 25, "latency_us": 5},
    }
    assert page.inner_text(beside) == planner_message(cluster_doc, "device.memory_GiB")
    page.click("#save-cluster")  # refused as well, the message stays beside the field
    page.wait_for_function("() => document.getElementById('check-state').textContent.startsWith('not saved')")
    assert not Cluster.objects.filter(name="my pod").exists()
    page.fill("input[name='device.memory_GiB']", "80")
    page.wait_for_function(f"() => document.querySelector(\"{beside}\").textContent === ''")
    page.click("#save-cluster")
    page.wait_for_url(re.compile(r".*/clusters/\d+/$"))
    cluster = Cluster.objects.get(name="my pod")
    assert cluster.spec["tiers"] == [{"name": "leaf", "nodes": 4, "oversubscription": 2}]

    # its page: the totals and the drawing (two leaves under the "beyond" box, the first opened)
    page.wait_for_selector("#topology g.box")
    assert page.inner_text("#bisection") == "400"
    labels = page.locator("#topology g.box .box-label").all_text_contents()  # SVG: no innerText
    assert {"leaf 0", "leaf 1", "node 0"} <= set(labels), labels
    assert page.locator("#topology rect.device").count() == 8

    # searched on from the planner page; the best plan's page links back to the cluster
    page.goto(base + "/planning/")
    page.select_option("#new-search select[name=cluster]", str(cluster.pk))
    model = StoredModelSpec.objects.get(team=alice.teams.first(), name="llama3-70b-like")
    page.select_option("#new-search select[name=model]", str(model.pk))
    page.fill("#new-search input[name=global_batch_size]", "256")
    page.fill("#new-search input[name=top_k]", "3")
    page.click("#new-search button[type=submit]")
    page.wait_for_url(re.compile(r".*/planning/searches/\d+/$"), timeout=15_000)
    search = wait_search(int(page.url.rstrip("/").rsplit("/", 1)[1]))
    assert search.state == "succeeded", search.human_readable_error
    best = StoredPlan.objects.get(search=search, rank=1)
    page.goto(f"{base}/planning/plans/{best.pk}/")
    assert page.get_attribute("#plan-cluster", "href") == f"/clusters/{cluster.pk}/"
    assert "the same" in page.inner_text("#plan-reproduced")
    assert page.locator("#plan-cluster-changed").count() == 0

    # the cluster edited (a slower network): the plan keeps its document and reproduces its figures
    page.goto(f"{base}/clusters/{cluster.pk}/")
    page.click("#edit-cluster")
    page.wait_for_selector("#cluster-form[data-ready='1']")
    page.fill("input[name='inter_node.bandwidth_GBps']", "12.5")
    page.wait_for_function("() => document.getElementById('preview-bisection')?.textContent === '200'")
    page.click("#save-cluster")
    page.wait_for_url(f"{base}/clusters/{cluster.pk}/")
    assert page.inner_text("#bisection") == "200"
    row = page.locator("#cluster-plans tr", has=page.locator(f"a[href='/planning/plans/{best.pk}/']"))
    assert "planned on an earlier version" in row.inner_text()
    page.goto(f"{base}/planning/plans/{best.pk}/")
    assert page.locator("#plan-cluster-changed").count() == 1
    reproduced = page.inner_text("#plan-reproduced")
    assert "the same" in reproduced and f"{best.predicted['step_time_s']:.4f}" in reproduced
    best.refresh_from_db()
    cluster.refresh_from_db()
    assert (
        best.cluster_doc["inter_node"]["bandwidth_GBps"],
        cluster.spec["inter_node"]["bandwidth_GBps"],
    ) == (25, 12.5)
    assert page.js_errors == []


def test_a_model_imported_from_a_config_json_and_one_made_in_the_form(
    live_stack, page, make_member, tmp_path
):
    import json

    from controlplane.planning.models import StoredModelSpec
    from workers.planner import ModelSpec

    make_member("alice", "Team A")
    base = live_stack.base_url
    log_in(page, base, "alice")
    page.goto(base + "/models/")
    page.click("#new-model")
    page.wait_for_selector("#model-form[data-ready='1']")

    config = tmp_path / "config.json"
    config.write_text(json.dumps(HF_CONFIG))
    page.set_input_files("#hf-file", str(config))
    page.fill("#hf-form input[name=name]", "tiny llama")
    page.click("#hf-import-button")
    page.wait_for_url(re.compile(r".*/models/\d+/$"))
    model = StoredModelSpec.objects.get(name="tiny llama")
    total = ModelSpec.from_dict(model.spec).parameter_count()["total"]
    # transformers counts this config as 2 x 256 x 64 (embedding, head) + 2 layers + the final norm
    assert total == 2 * 256 * 64 + 2 * (64 * (64 + 2 * 32) + 64 * 64 + 3 * 64 * 128 + 2 * 64) + 64
    assert page.inner_text("#model-params") == f"{total / 1e3:.3g} k"
    assert "llama" in page.inner_text("#model-architecture")

    # the form: a wrong field shows the planner's message beside it as the user types, then it saves
    page.goto(base + "/models/new/")
    page.wait_for_selector("#model-form[data-ready='1']")
    for name, value in {"name": "my gpt", "num_layers": "4", "hidden_size": "256", "num_attention_heads": "8",
                        "num_kv_heads": "3", "ffn_hidden_size": "1024", "vocab_size": "512", "seq_length": "128"}.items():  # fmt: skip
        page.fill(f"#model-form input[name='{name}']", value)
    beside = ".field-error[data-for='num_kv_heads']"
    page.wait_for_function(f"() => document.querySelector(\"{beside}\").textContent !== ''")
    assert page.inner_text(beside) == "must divide num_attention_heads (8), got 3"
    page.fill("#model-form input[name='num_kv_heads']", "4")
    page.wait_for_function("() => document.getElementById('preview-params') !== null")
    page.click("#save-model")
    page.wait_for_url(re.compile(r".*/models/\d+/$"))
    mine = StoredModelSpec.objects.get(name="my gpt")
    assert (mine.spec["num_kv_heads"], mine.spec["activation"]) == (4, "gelu")
    assert page.js_errors == []
