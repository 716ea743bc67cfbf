"""The hardware profiles' pages (figures with their sources, how they were measured, two side by side) and
the plan list with its filters, without a browser; the crawl (tests/browser/test_crawl.py) walks them."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.conftest import import_tiny_cpu_plan

pytestmark = pytest.mark.django_db


@pytest.fixture
def seeded(alice):
    from controlplane.planning.seed import seed_knowledge_base

    seed_knowledge_base(team=alice.teams.first())
    client = Client()
    client.force_login(alice)
    return client


def test_a_profiles_figures_carry_their_sources_and_compare_side_by_side(seeded):
    from controlplane.clusters.models import Cluster, HardwareProfile

    a100 = HardwareProfile.objects.get(name="A100-SXM4-80GB")
    h100 = HardwareProfile.objects.get(name="H100-SXM5-80GB")
    page = seeded.get(f"/hardware/{a100.pk}/")
    rows = {r["field"]: r for r in page.context["rows"]}
    assert rows["peak_tflops.bf16"]["value"] == 312 and "Narayanan" in rows["peak_tflops.bf16"]["source"]
    assert rows["memory_GiB"]["value"] == 80
    assert page.context["profile"].confidence == "published"
    # the seeded clusters of this device are listed (by its name or an alias)
    a100_clusters = {
        c.pk for c in Cluster.objects.filter(team=a100.team) if c.device_name.upper().startswith("A100")
    }
    assert a100_clusters and {c.pk for c in page.context["clusters"]} == a100_clusters
    listing = seeded.get("/hardware/").content.decode()
    assert f'href="/hardware/{a100.pk}/"' in listing and "Ascend-910B" in listing

    compare = seeded.get(f"/hardware/compare/?a={a100.pk}&b={h100.pk}")
    ratio = {r["label"]: r["ratio"] for r in compare.context["rows"]}
    assert ratio["peak bf16"] == pytest.approx(h100.spec["peak_tflops"]["bf16"] / 312)
    assert ratio["memory"] == pytest.approx(1.0)
    assert seeded.get("/hardware/compare/?a=x&b=1").status_code == 400


def test_the_cluster_page_links_its_device_to_the_teams_profile(seeded):
    from controlplane.clusters.models import Cluster, HardwareProfile

    cluster = Cluster.objects.get(name="h100-sxm5-128n")
    profile = HardwareProfile.objects.get(name="H100-SXM5-80GB")
    assert seeded.get(f"/clusters/{cluster.pk}/").context["device"]["profile_id"] == profile.pk


def test_the_plan_list_shows_every_plan_and_filters_them(seeded, alice_api):
    from controlplane.planning.models import StoredPlan

    imported = import_tiny_cpu_plan(alice_api, "imported here")
    every = seeded.get("/planning/plans/")
    shown = {p.pk for p in every.context["page"]}
    assert imported["id"] in shown and len(shown) == min(50, StoredPlan.objects.count())
    only = seeded.get("/planning/plans/?source=imported").context["page"]
    assert {p.pk for p in only} == set(
        StoredPlan.objects.filter(source="imported").values_list("pk", flat=True)
    )
    measured = seeded.get("/planning/plans/?source=measured&device=A100-SXM4-80GB").context["page"]
    assert measured and all(p.source == "measured" and p.device_name == "A100-SXM4-80GB" for p in measured)
    odd = seeded.get("/planning/plans/?cluster=abc")
    assert odd.status_code == 200 and "cluster must be an id" in odd.content.decode()
