"""A plan whose training document leaves flash attention and the overlapped gradient reduction to its
framework (issue 37) says on its page which values it was costed with, and why."""

from __future__ import annotations

import pytest

from tests.conftest import import_tiny_cpu_plan

pytestmark = [pytest.mark.django_db]


def test_the_plan_page_shows_the_defaults_the_prediction_assumed(alice_api, alice_pages):
    plan = import_tiny_cpu_plan(alice_api)
    assumed = plan["predicted"].get("assumed_defaults")
    assert assumed and assumed["framework"] == "cann-train", plan["predicted"].keys()
    assert assumed["flash_attention"]["value"] is True and assumed["overlap_grad_reduce"]["value"] is True
    html = alice_pages.get(f"/planning/plans/{plan['id']}/").content.decode()
    shown = html.split('id="plan-assumed-defaults"')[1].split("</dd>")[0]
    assert "<code>flash_attention</code> on" in shown and "<code>overlap_grad_reduce</code> on" in shown
    assert (
        "(cann-train's defaults: not set in the training document)" in shown
        and assumed["flash_attention"]["source"][:40] in html
    )
