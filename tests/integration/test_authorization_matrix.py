"""Who may reach what: every API operation, every page and the live websocket, for three callers.

- anonymous: an API operation answers 401/403, a page redirects to /login/, the websocket never
  subscribes (the handshake is refused, or the socket is closed with 4401);
- bob (team B) on alice's (team A) objects: 404 for reads and writes alike, the very answer an id that
  does not exist gets (never a 200, never a 403 that tells the object exists); an object of team A named
  in a request body or query is refused like one that does not exist; lists show none of team A's objects;
- alice on her own objects: 2xx. The operations that launch a job answer 429: team A has as many jobs
  queued as one team may (``CANN_TRAIN_MAX_ACTIVE_JOBS``), so the request passes authentication, finds
  the object and is checked to the end, and no training starts.

The operations are enumerated from the URL resolver (drf-spectacular's endpoint enumerator, the source of
``/api/schema/``) and the pages from Django's URL patterns: a new endpoint or page fails
``test_every_route_is_classified`` (test_authorization_routes.py) until it gets a row here.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field

import pytest
import websockets
from asgiref.sync import sync_to_async
from django.test import Client

from tests.conftest import http
from workers.planner.examples import contract

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

MISSING = 987_654_321  # an id no object has
TINY_TRAINING = {"global_batch_size": 8, "dtype": "fp32", "optimizer": "adam"}
# a carbon-aware schedule on the shipped GB history (controlplane.green)
GREEN_JOB = {"zone": "GB", "now": "2020-06-01T18:00:00Z", "duration_h": 4, "power_kw": 10, "deadline_h": 24}
# an incident list (controlplane.jobs: the failure-pattern knowledge base); team A's own has a kind only it names
INCIDENTS = "node,time,kind\nnode-a,2026-01-01T00:00:00Z,gpu_hbm3\n"
SECRET_KIND = "alice secret kind"
HF_CONFIG = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 64,
}


@dataclass
class Op:
    """How to call an API operation: ``obj`` names the object of team A behind ``{id}`` (``None``: a
    collection), ``body`` makes a valid body for it, ``own`` is what alice gets; ``ref`` = (kind, make) makes
    a body that names team A (``"team"``) or an object of team A (``"cluster"``, ``"plan"``) for bob:
    ``make(world, slug or id)``; ``lists``: the operation lists objects (bob's list holds none of team A's)."""

    obj: str | None = None
    body: object = None
    own: frozenset = frozenset({200})
    ref: tuple | None = None
    lists: bool = False


def _model(w, **extra):
    return {**contract("model.json"), **extra}


def _cluster(w, **extra):
    return {**contract("cluster.json"), **extra}


def _profile(w, **extra):
    return {
        "name": "Ascend-910B-matrix",
        "confidence": "soft",
        "peak_tflops": {"bf16": 313},
        "memory_GiB": 64,
        "sources": {"peak_tflops": "third-party claims range 256-320 TFLOP/s fp16 (soft)"},
        **extra,
    }


def _tiny_job(w, **extra):
    from workers.training.examples import example

    return {
        "name": "matrix job",
        "model": example("tiny-dense.json"),
        "strategy": {"dp": 2},
        "training": TINY_TRAINING,
        "steps": 5,
        "device": "cpu",
        **extra,
    }


def _tiny_plan(w):
    from controlplane.planning.seed import local_cpu_cluster
    from workers.training.examples import example

    cpu, _ = local_cpu_cluster()
    return {
        "name": "tiny on this machine",
        "model": example("tiny-dense.json"),
        "cluster": {**cpu, "num_nodes": 1, "devices_per_node": 2},
        "training": TINY_TRAINING,
        "strategy": example("dp2.json"),
    }


def _search(w):
    return {
        "cluster_doc": contract("cluster.json"),
        "model_doc": contract("model.json"),
        "training": contract("training.json"),
    }


def _scenario(w):
    best = w.facts["best"]
    return {"model": best.model_doc, "cluster": best.cluster_doc, "training": best.training}


CREATED, OK, ACCEPTED, GONE, QUEUE_FULL = (frozenset({c}) for c in (201, 200, 202, 204, 429))

# every API operation (method, path as in /api/schema/) -> how to call it
API: dict[tuple[str, str], Op] = {
    ("GET", "/api/me/"): Op(),
    ("GET", "/api/tokens/"): Op(lists=True),
    ("POST", "/api/tokens/"): Op(body=lambda w: {"name": "laptop"}, own=CREATED),
    ("DELETE", "/api/tokens/{id}/"): Op("token", own=GONE),
    ("GET", "/api/hardware-profiles/"): Op(lists=True),
    ("POST", "/api/hardware-profiles/"): Op(
        body=_profile, own=CREATED, ref=("team", lambda w, team: _profile(w, team=team, name="bob's"))
    ),
    ("GET", "/api/hardware-profiles/{id}/"): Op("hardware-profile"),
    ("PUT", "/api/hardware-profiles/{id}/"): Op("hardware-profile", body=lambda w: _profile(w, name="put")),
    ("PATCH", "/api/hardware-profiles/{id}/"): Op("hardware-profile", body=lambda w: {"memory_GiB": 96}),
    ("DELETE", "/api/hardware-profiles/{id}/"): Op("spare-hardware-profile", own=GONE),
    ("GET", "/api/clusters/"): Op(lists=True),
    ("POST", "/api/clusters/"): Op(
        body=lambda w: _cluster(w, name="copy"),
        own=CREATED,
        ref=("team", lambda w, team: _cluster(w, team=team, name="bob's")),
    ),
    ("GET", "/api/clusters/{id}/"): Op("cluster"),
    ("PUT", "/api/clusters/{id}/"): Op("cluster", body=lambda w: _cluster(w, name="put")),
    ("PATCH", "/api/clusters/{id}/"): Op("cluster", body=lambda w: {"name": "patched"}),
    ("DELETE", "/api/clusters/{id}/"): Op("spare-cluster", own=GONE),
    # the cluster form's live check: a create's validation, nothing stored
    ("POST", "/api/clusters/validate/"): Op(
        body=lambda w: _cluster(w, name="checked"),
        ref=("team", lambda w, team: _cluster(w, team=team, name="bob's")),
    ),
    ("GET", "/api/models/"): Op(lists=True),
    ("POST", "/api/models/"): Op(
        body=lambda w: _model(w, name="copy"),
        own=CREATED,
        ref=("team", lambda w, team: _model(w, team=team, name="bob's")),
    ),
    # the model form's live check: a create's validation, nothing stored
    ("POST", "/api/models/validate/"): Op(
        body=lambda w: _model(w, name="checked"),
        ref=("team", lambda w, team: _model(w, team=team, name="bob's")),
    ),
    # a Hugging Face config.json stored as a model (the family's own keys, a tiny Llama)
    ("POST", "/api/models/from-hf-config/"): Op(
        body=lambda w: {"config": HF_CONFIG, "name": "imported"},
        own=CREATED,
        ref=("team", lambda w, team: {"config": HF_CONFIG, "name": "bob's import", "team": team}),
    ),
    ("GET", "/api/models/{id}/"): Op("model"),
    ("PUT", "/api/models/{id}/"): Op("model", body=lambda w: _model(w, name="put")),
    ("PATCH", "/api/models/{id}/"): Op("model", body=lambda w: {"num_layers": 48}),
    ("DELETE", "/api/models/{id}/"): Op("spare-model", own=GONE),
    ("GET", "/api/plans/"): Op(lists=True),
    ("POST", "/api/plans/"): Op(
        body=_tiny_plan, own=CREATED, ref=("team", lambda w, team: {**_tiny_plan(w), "team": team})
    ),
    ("GET", "/api/plans/{id}/"): Op("plan"),
    ("DELETE", "/api/plans/{id}/"): Op("spare-plan", own=GONE),
    ("GET", "/api/plans/{id}/plan-json/"): Op("plan"),
    ("GET", "/api/plans/{id}/scale-down/"): Op("plan"),
    ("POST", "/api/plans/{id}/scale-down/"): Op("plan", body=lambda w: {"steps": 5}, own=QUEUE_FULL),
    # this machine's calibration: any signed-in user reads it; alice's request is refused for its body
    # (validated after authentication), so that no measuring starts on the test's worker
    ("GET", "/api/calibration/"): Op(),
    ("POST", "/api/calibration/"): Op(body=lambda w: {"quick": "sideways"}, own=frozenset({400})),
    ("POST", "/api/plans/evaluate/"): Op(
        body=lambda w: {**_scenario(w), "strategy": w.facts["best"].strategy}
    ),
    ("GET", "/api/searches/"): Op(lists=True),
    ("POST", "/api/searches/"): Op(
        body=_search, own=CREATED, ref=("cluster", lambda w, pk: {**_search(w), "cluster": pk})
    ),
    ("GET", "/api/searches/{id}/"): Op("search"),
    ("POST", "/api/searches/{id}/cancel/"): Op("queued-search", own=ACCEPTED),
    ("GET", "/api/searches/{id}/candidates/"): Op("search"),
    ("GET", "/api/searches/{id}/page-data/"): Op("search"),
    ("POST", "/api/searches/{id}/save-plan/"): Op(
        "search", body=lambda w: {"strategy": w.facts["best"].strategy}, own=frozenset({200, 201})
    ),
    ("POST", "/api/searches/{id}/what-if/"): Op("search", body=lambda w: {"lose_nodes": 1}, own=CREATED),
    ("GET", "/api/jobs/"): Op(lists=True),
    ("GET", "/api/jobs/rows/"): Op(lists=True),
    ("POST", "/api/jobs/"): Op(
        body=_tiny_job, own=QUEUE_FULL, ref=("plan", lambda w, pk: _tiny_job(w, plan_id=pk))
    ),
    ("GET", "/api/jobs/{id}/"): Op("job"),
    ("PATCH", "/api/jobs/{id}/"): Op("job", body=lambda w: {"tags": ["mine"], "notes": "alice's"}),
    ("POST", "/api/jobs/{id}/cancel/"): Op("new-job", own=ACCEPTED),
    ("POST", "/api/jobs/{id}/relaunch/"): Op("failed-job", own=QUEUE_FULL),
    ("POST", "/api/jobs/{id}/restore/"): Op(
        "failed-job", body=lambda w: {"snapshot": "step-00000005"}, own=QUEUE_FULL
    ),
    ("GET", "/api/jobs/{id}/events/"): Op("job"),
    ("POST", "/api/jobs/{id}/probe/"): Op("job", body=lambda w: {"message": "hello"}, own=ACCEPTED),
    ("GET", "/api/jobs/{id}/comm-compare/"): Op("job"),
    # 400 where this machine cannot build the emulated network (no `ip netns`): past the job's lookup
    ("POST", "/api/jobs/{id}/comm-compare/"): Op(
        "job", body=lambda w: {"steps": 2}, own=frozenset({201, 400})
    ),
    ("POST", "/api/jobs/{id}/comm-compare/{comparison_id}/cancel/"): Op("job", own=ACCEPTED),
    ("GET", "/api/green/schedules/"): Op(lists=True),
    ("POST", "/api/green/schedules/"): Op(
        body=lambda w: GREEN_JOB, own=CREATED, ref=("team", lambda w, team: {**GREEN_JOB, "team": team})
    ),
    ("GET", "/api/green/schedules/{id}/"): Op("green-schedule"),
    ("DELETE", "/api/green/schedules/{id}/"): Op("spare-green-schedule", own=GONE),
    # energy and carbon reports: the succeeded job has one (a POST answers it), found by its code
    ("POST", "/api/jobs/{id}/certificate/"): Op("job"),
    # a job that did not start from a Hugging Face checkpoint has no export: alice is told so (404 with its
    # reason), bob gets the 404 of a job that does not exist
    ("GET", "/api/jobs/{id}/export/"): Op("job", own=frozenset({404})),
    ("GET", "/api/certificates/"): Op(lists=True),
    ("GET", "/api/certificates/{code}/"): Op("certificate"),
    ("GET", "/api/certificates/{code}/pdf"): Op("certificate"),
    ("GET", "/api/certificates/{code}/verify"): Op("certificate"),
    # a JSON body carries no PDF: refused past the report's lookup (415), as a file-less form would be (400)
    ("POST", "/api/certificates/{code}/verify"): Op("certificate", own=frozenset({400, 415})),
    # failure patterns: the published ones are everybody's; a kind only team A's incidents name is team A's
    ("GET", "/api/failure-patterns/"): Op(),
    ("GET", "/api/failure-patterns/{key}/"): Op("failure-pattern"),
    ("GET", "/api/failure-patterns/incidents/"): Op(lists=True),
    ("POST", "/api/failure-patterns/incidents/"): Op(
        body=lambda w: {"csv": INCIDENTS},
        own=CREATED,
        ref=("team", lambda w, team: {"csv": INCIDENTS, "team": team}),
    ),
}
# the OpenAPI schema and its viewers: any signed-in user, no team objects
DOCS = {("GET", "/api/schema/"), ("GET", "/api/docs/"), ("GET", "/api/redoc/")}
# by a report's printed code, with or without a login (the report says anyone holding it may check it): the
# same answer for anyone, holding only what the PDF prints; an unknown code is a 404 (a JSON body carries no
# PDF: 400/415 for anyone)
BY_CODE = {
    ("GET", "/api/public/certificates/{code}/verify"): frozenset({200}),
    ("POST", "/api/public/certificates/{code}/verify"): frozenset({400, 415}),
}
PUBLIC_VERDICT = {
    "code", "job", "issued_at", "valid", "code_matches", "figures_match", "mismatches", "other_differences",
    "checked",
}  # fmt: skip


@dataclass
class Page:
    """A page: its URL (``{job}``, ``{search}``, ``{plan}``, ``{token}`` are team A's objects), the method,
    the form data, what alice gets, and how bob is refused ("404", or "same": the answer a missing id gets)."""

    url: str
    method: str = "GET"
    data: dict = field(default_factory=dict)
    own: int = 200
    bob: str | None = None


PAGES: dict[str, Page] = {
    "dashboard": Page("/"),
    "tokens": Page("/tokens/"),
    "token-revoke": Page("/tokens/{token}/revoke/", method="POST", own=302, bob="404"),
    "job-list": Page("/jobs/"),
    "job-compare": Page("/jobs/compare/?ids={job}", bob="same"),
    "job-detail": Page("/jobs/{job}/", bob="404"),
    "job-eti": Page("/jobs/{job}/eti/", bob="404"),
    "search-list": Page("/planning/"),
    "planning-seed": Page("/planning/seed/", method="POST", data={"team": "team-a"}, own=302, bob="seed"),
    "search-detail": Page("/planning/searches/{search}/", bob="404"),
    "plan-diff": Page("/planning/plans/diff/?a={plan}&b={plan}", bob="404"),
    "plan-detail": Page("/planning/plans/{plan}/", bob="404"),
    "cluster-list": Page("/clusters/"),
    "cluster-new": Page("/clusters/new/"),
    "cluster-detail": Page("/clusters/{cluster}/", bob="404"),
    "cluster-edit": Page("/clusters/{cluster}/edit/", bob="404"),
    "cluster-copy": Page("/clusters/{cluster}/copy/", bob="404"),
    "cluster-document": Page("/clusters/{cluster}/cluster.yaml", bob="404"),
    "cluster-delete": Page(
        "/clusters/{spare-cluster}/delete/", method="POST", data={"confirm": "1"}, own=302, bob="404"
    ),
    "plan-list": Page("/planning/plans/"),
    "hardware-list": Page("/hardware/"),
    "hardware-detail": Page("/hardware/{hardware-profile}/", bob="404"),
    "hardware-compare": Page("/hardware/compare/?a={hardware-profile}&b={hardware-profile}", bob="404"),
    "model-list": Page("/models/"),
    "model-new": Page("/models/new/"),
    "model-detail": Page("/models/{model}/", bob="404"),
    "model-edit": Page("/models/{model}/edit/", bob="404"),
    "model-copy": Page("/models/{model}/copy/", bob="404"),
    "model-document": Page("/models/{model}/model.json", bob="404"),
    "model-delete": Page(
        "/models/{spare-model}/delete/", method="POST", data={"confirm": "1"}, own=302, bob="404"
    ),
    "green": Page("/green/"),
    "green-report": Page("/green/reports/{certificate}/", bob="404"),
    "failure-pattern-list": Page("/failure-patterns/"),
    "failure-pattern-detail": Page("/failure-patterns/{pattern}/", bob="404"),
}
# open to anyone by design; /metrics is for operators: a bearer METRICS_TOKEN or loopback only
# (tests/integration/test_metrics.py)
PUBLIC = {"login", "logout", "healthz", "livez", "readyz", "metrics", "favicon"}


# --- the objects --------------------------------------------------------------------------------------
@dataclass
class World:
    base_url: str
    ws_url: str
    tokens: dict[str, str]  # alice / bob -> API token
    users: dict
    objects: dict[str, int | str]  # team A's objects by kind (a certificate's code, a pattern's key)
    facts: dict


@pytest.fixture
def world(live_stack, make_member, token_for) -> World:
    from datetime import datetime

    from django.utils import timezone

    from controlplane.accounts.services import token_issue
    from controlplane.clusters.models import Cluster, HardwareProfile
    from controlplane.failures import services as failure_services
    from controlplane.green import services as green_services
    from controlplane.green.models import GreenCertificate
    from controlplane.jobs import services as job_services
    from controlplane.jobs.models import CommComparison, JobSnapshot, TrainingJob
    from controlplane.live.models import StreamEvent
    from controlplane.planning import services as planning_services
    from controlplane.planning.models import StoredModelSpec, StoredPlan, StrategySearch
    from workers.reliability.risk.patterns import pattern_key
    from workers.training.examples import example

    alice, bob = make_member("alice", "Team A"), make_member("bob", "Team B")
    team = alice.teams.first()
    objects = {}
    for prefix in ("", "spare-"):
        objects[prefix + "cluster"] = Cluster.objects.create(
            team=team, name=f"{prefix}alice cluster", spec=_cluster(None, name=f"{prefix}alice cluster")
        ).pk
        objects[prefix + "hardware-profile"] = HardwareProfile.objects.create(
            team=team, name=f"{prefix}alice profile", spec=_profile(None, name=f"{prefix}alice profile")
        ).pk
        objects[prefix + "model"] = StoredModelSpec.objects.create(
            team=team, name=f"{prefix}alice model", spec=_model(None, name=f"{prefix}alice model")
        ).pk
    search = StrategySearch.objects.create(
        team=team,
        created_by=alice,
        request={
            "cluster": contract("cluster.json"),
            "model": contract("model.json"),
            "training": contract("training.json"),
            "strategy": {},
            "top_k": 3,
            "allow_fewer_nodes": False,
        },
    )
    assert planning_services.search_run(search_id=search.pk) == "succeeded"
    best, spare = StoredPlan.objects.filter(search=search).order_by("rank")[:2]
    objects.update(
        search=search.pk,
        **{"queued-search": StrategySearch.objects.create(team=team, request=search.request).pk},
        plan=best.pk,
        **{"spare-plan": spare.pk},
    )
    config = job_services.validated_config(
        job_services.job_config_of(
            model=example("tiny-dense.json"),
            strategy={"dp": 2},
            training=TINY_TRAINING,
            steps=5,
            device="cpu",
        )
    )

    def job(name, state, attempts=1):
        return TrainingJob.objects.create(
            team=team,
            name=name,
            config=config,
            nproc_per_node=2,
            attempts=attempts,
            state=state,
            source_plan=best,
        ).pk

    objects.update(
        job=job("alice secret job", "succeeded"),
        **{"failed-job": job("alice failed job", "failed"), "new-job": job("alice new job", "queued", 0)},
    )
    JobSnapshot.objects.create(  # what a restore of the failed job names
        job_id=objects["failed-job"],
        name="step-00000005",
        step=5,
        kind="full",
        created_at=timezone.now(),
        verified=True,
    )
    StreamEvent.objects.create(
        stream=f"job/{objects['job']}",
        seq=1,
        time=timezone.now(),
        kind="event",
        values={"state": "succeeded"},
    )
    objects["comparison"] = CommComparison.objects.create(
        team=team, job_id=objects["job"], request={"methods": ["dense"], "steps": 2}
    ).pk
    # team A's quota of queued work is full: a request that would launch a job answers 429, nothing runs
    for i in range(job_services.MAX_ACTIVE_JOBS_PER_TEAM):
        job(f"waiting {i}", "queued")
    objects["token"] = token_issue(user=alice, name="alice spare token")[0].pk
    for prefix in ("", "spare-"):
        objects[prefix + "green-schedule"] = green_services.schedule_create(
            **{**GREEN_JOB, "now": datetime.fromisoformat(GREEN_JOB["now"])},
            team=team,
            created_by=alice,
            name=f"{prefix}alice schedule",
            env={},
        ).pk
    objects["certificate"] = GreenCertificate.objects.create(  # as issued (its figures play no part here)
        team=team,
        job_id=objects["job"],
        code="AAAA-BBBB-CCCC-DDDD-EEEE",
        digest="0" * 64,
        issued_at=timezone.now(),
        document={"issued_at": timezone.now().replace(microsecond=0).isoformat(), "results": {}},
        pdf=b"%PDF-1.7",
    ).code
    failure_services.incidents_import(
        team=team, text=f"node,time,kind\nnode-a,2026-01-02T00:00:00Z,{SECRET_KIND}\n", source="alice.csv"
    )
    objects["failure-pattern"] = pattern_key(SECRET_KIND)
    return World(
        base_url=live_stack.base_url,
        ws_url=live_stack.ws_url,
        tokens={"alice": token_for(alice), "bob": token_for(bob)},
        users={"alice": alice, "bob": bob},
        objects=objects,
        facts={"best": best, "team_a": team.pk},
    )


# --- the API ------------------------------------------------------------------------------------------
def url_of(path: str, world: World, ids: dict[str, int]) -> str:
    for name, value in ids.items():
        path = path.replace("{" + name + "}", str(value))
    return world.base_url + path


def _same(answer_a, answer_b, a, b) -> bool:
    """Two (status, body) answers that differ in nothing but the id (or slug) they name, ``a`` and ``b``."""

    def masked(body, name) -> str:
        return re.sub(rf"\b{re.escape(str(name))}\b", "#", json.dumps(body))

    return answer_a[0] == answer_b[0] and masked(answer_a[1], a) == masked(answer_b[1], b)


def _cancel_started(world: World, path: str, status: int, body) -> None:
    """Alice's valid search, what-if or comparison was created: cancel it before a worker gets far."""
    token = world.tokens["alice"]
    if status != 201 or not isinstance(body, dict):
        return
    if path in ("/api/searches/", "/api/searches/{id}/what-if/"):
        http("POST", f"{world.base_url}/api/searches/{body['id']}/cancel/", token, {})
    elif path == "/api/jobs/{id}/comm-compare/":
        http("POST", f"{world.base_url}/api/jobs/{body['job']}/comm-compare/{body['id']}/cancel/", token, {})


def test_every_api_operation_is_team_scoped(world):
    problems = []
    for (method, path), op in sorted(API.items(), key=lambda item: (item[0][1], item[0][0])):
        body = op.body(world) if callable(op.body) else (None if method in ("GET", "DELETE") else {})
        name = "code" if "{code}" in path else "key" if "{key}" in path else "id"
        ids = {name: world.objects[op.obj]} if op.obj else {}
        if "{comparison_id}" in path:
            ids["comparison_id"] = world.objects["comparison"]
        url = url_of(path, world, ids)

        status, answer = http(method, url, None, body)
        if status not in (401, 403):
            problems.append(f"anonymous {method} {path}: {status} {answer}")

        if op.obj:  # bob on team A's object: the answer of an id that does not exist
            missing = url_of(path, world, {k: MISSING for k in ids})
            theirs, nothing = (
                http(method, url, world.tokens["bob"], body),
                http(method, missing, world.tokens["bob"], body),
            )
            mine = next(iter(ids.values()))
            if theirs[0] != 404 or not _same(theirs, nothing, mine, MISSING):
                problems.append(f"bob {method} {path} on team A's {op.obj}: {theirs} (missing id: {nothing})")
        if op.ref:  # bob naming team A (or its object) in a body: refused like a name that does not exist
            kind, make = op.ref
            target, other = ("team-a", "no-such-team") if kind == "team" else (world.objects[kind], MISSING)
            theirs = http(method, url, world.tokens["bob"], make(world, target))
            nothing = http(method, url, world.tokens["bob"], make(world, other))
            if theirs[0] != 400 or not _same(theirs, nothing, target, other):
                problems.append(f"bob {method} {path} naming team A's {kind}: {theirs} (missing: {nothing})")
        if op.lists:
            status, answer = http(method, url, world.tokens["bob"], None)
            leaked = {item["id"] for item in _items(answer)} & _team_a_ids(path, world)
            if status != 200 or leaked:
                problems.append(f"bob {method} {path}: {status}, team A's objects listed: {leaked}")

        status, answer = http(method, url, world.tokens["alice"], body)
        _cancel_started(world, path, status, answer)
        if status not in op.own:
            problems.append(f"alice {method} {path} on her {op.obj or 'team'}: {status} {answer}")
        if op.lists and not {item["id"] for item in _items(answer)} & _team_a_ids(path, world):
            problems.append(f"alice {method} {path}: none of her objects listed: {answer}")
    for (method, path), expected in sorted(BY_CODE.items()):
        url = url_of(path, world, {"code": world.objects["certificate"]})
        missing = url_of(path, world, {"code": "ZZZZ-ZZZZ-ZZZZ-ZZZZ-ZZZZ"})
        body = None if method == "GET" else {}
        answers = {
            who: http(method, url, world.tokens.get(who), body) for who in ("anonymous", "bob", "alice")
        }
        for who, (status, answer) in answers.items():
            if status not in expected or (status == 200 and set(answer) != PUBLIC_VERDICT):
                problems.append(f"{who} {method} {path}: {status} {answer}")
            if status == 200 and (answer["code"], answer["job"]) != (
                world.objects["certificate"],
                {"id": None, "name": None},
            ):
                problems.append(f"{who} {method} {path} shows more than the report prints: {answer}")
            if (nothing := http(method, missing, world.tokens.get(who), body))[0] != 404:
                problems.append(f"{who} {method} {path} with an unknown code: {nothing}")
        if len({json.dumps(a, sort_keys=True) for a in answers.values()}) != 1:
            problems.append(f"{method} {path}: not the same answer for everyone: {answers}")
    for method, path in sorted(DOCS):  # the schema and its viewers answer HTML or YAML: the status alone
        if (status := _get(world.base_url + path, None)) not in (401, 403):
            problems.append(f"anonymous {method} {path}: {status}")
        if (status := _get(world.base_url + path, world.tokens["bob"])) != 200:
            problems.append(f"bob {method} {path}: {status}")
    assert not problems, "\n".join(problems)


def _items(answer) -> list[dict]:
    """The objects of a list answer (paginated or not)."""
    return answer.get("results", []) if isinstance(answer, dict) else list(answer or [])


def _team_a_ids(path: str, world: World) -> set[int]:
    from controlplane.accounts.models import ApiToken, Team
    from controlplane.clusters.models import Cluster, HardwareProfile
    from controlplane.failures.models import FailureIncident
    from controlplane.green.models import GreenCertificate, GreenSchedule
    from controlplane.jobs.models import TrainingJob
    from controlplane.planning.models import StoredModelSpec, StoredPlan, StrategySearch

    team = Team.objects.get(slug="team-a")
    model = {
        "tokens": ApiToken,
        "hardware-profiles": HardwareProfile,
        "clusters": Cluster,
        "models": StoredModelSpec,
        "plans": StoredPlan,
        "searches": StrategySearch,
        "jobs": TrainingJob,
        "green": GreenSchedule,
        "certificates": GreenCertificate,
        "failure-patterns": FailureIncident,
    }[path.split("/")[2]]
    if model is ApiToken:
        return set(ApiToken.objects.filter(user=world.users["alice"]).values_list("pk", flat=True))
    return set(model.objects.filter(team=team).values_list("pk", flat=True))


def _get(url: str, token: str | None) -> int:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, headers={"Authorization": f"Token {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


# --- pages --------------------------------------------------------------------------------------------
def _page_url(page: Page, objects: dict[str, int], missing: bool = False) -> str:
    url = page.url
    kinds = {
        "job": "job",
        "search": "search",
        "plan": "plan",
        "cluster": "cluster",
        "spare-cluster": "spare-cluster",
        "model": "model",
        "spare-model": "spare-model",
        "hardware-profile": "hardware-profile",
        "token": "token",
        "pattern": "failure-pattern",
        "certificate": "certificate",
    }
    for kind, obj in kinds.items():
        url = url.replace("{" + kind + "}", str(MISSING if missing else objects[obj]))
    return url


def _form_errors(html: str, pk: int) -> list[str]:
    """The errors the compare page lists (``#compare-errors``), the id they name masked."""
    found = re.findall(r'<ul class="error" id="compare-errors">(.*?)</ul>', html, re.S)
    return [re.sub(rf"\b{pk}\b", "#", e) for e in found]


def test_every_page_is_team_scoped(world):
    from controlplane.clusters.models import Cluster

    problems = []
    people = {}
    for name in ("alice", "bob"):
        people[name] = Client()
        people[name].force_login(world.users[name])
    # names only alice may see
    secrets = [
        "alice secret job",
        "alice cluster",
        "alice model",
        "alice profile",
        "alice spare token",
        SECRET_KIND,
    ]
    for page in PAGES.values():
        url = _page_url(page, world.objects)

        def call(client, u, page=page):
            return client.post(u, page.data) if page.method == "POST" else client.get(u)

        anonymous = call(Client(), url)
        if anonymous.status_code != 302 or not anonymous["Location"].startswith("/login/"):
            problems.append(f"anonymous {page.method} {url}: {anonymous.status_code}")

        before = Cluster.objects.filter(team__slug="team-a").count()
        theirs = call(people["bob"], url)
        if page.bob == "404":
            if theirs.status_code != 404:
                problems.append(f"bob {page.method} {url}: {theirs.status_code}")
        elif page.bob == "same":
            nothing = call(people["bob"], _page_url(page, world.objects, missing=True))
            mine = _form_errors(theirs.content.decode(), world.objects["job"])
            missing = _form_errors(nothing.content.decode(), MISSING)
            if theirs.status_code != 400 or not mine or mine != missing:
                problems.append(f"bob {page.method} {url}: {theirs.status_code}, unlike a missing id")
        elif page.bob == "seed":  # bob cannot load examples into team A
            if Cluster.objects.filter(team__slug="team-a").count() != before:
                problems.append(f"bob {page.method} {url} changed team A's knowledge base")
        else:  # a list: bob's own page, without a name of team A's objects
            shown = [s for s in secrets if s in theirs.content.decode()]
            if theirs.status_code != 200 or shown:
                problems.append(f"bob {page.method} {url}: {theirs.status_code}, shows team A's {shown}")

        mine = call(people["alice"], url)
        if mine.status_code != page.own:
            problems.append(f"alice {page.method} {url}: {mine.status_code}")
    admin = Client().get("/admin/")
    if admin.status_code != 302 or not admin["Location"].startswith("/admin/login/"):
        problems.append(f"anonymous GET /admin/: {admin.status_code}")
    assert not problems, "\n".join(problems)


# --- the websocket ------------------------------------------------------------------------------------
async def _recv(ws, timeout: float = 10.0) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


async def _subscribe(ws, stream: str) -> dict:
    await ws.send(json.dumps({"action": "subscribe", "stream": stream}))
    while True:
        message = await _recv(ws)
        if message.get("type") in ("subscribed", "error"):
            return message


async def _anonymous_never_subscribes(url: str, stream: str, **kwargs) -> str | None:
    """None when the handshake is refused or the socket closed with 4401, else what happened."""
    try:
        async with websockets.connect(url, **kwargs) as ws:
            await ws.send(json.dumps({"action": "subscribe", "stream": stream}))
            return f"answered {await _recv(ws, 5)}"
    except websockets.exceptions.InvalidStatus:
        return None
    except websockets.exceptions.ConnectionClosed as closed:
        return None if closed.rcvd is not None and closed.rcvd.code == 4401 else f"closed with {closed.rcvd}"


async def test_every_live_stream_is_team_scoped(world):
    from controlplane.live.feeds import notify

    streams = {"job": f"job/{world.objects['job']}", "search": f"search/{world.objects['search']}"}
    problems = []
    for stream in streams.values():
        for kwargs in (
            {},
            {"origin": "http://127.0.0.1"},
            {"additional_headers": {"Authorization": "Token x"}},
        ):
            if (outcome := await _anonymous_never_subscribes(world.ws_url, stream, **kwargs)) is not None:
                problems.append(f"anonymous {kwargs} on {stream}: {outcome}")

    def connect(who):
        return websockets.connect(
            world.ws_url, additional_headers={"Authorization": f"Token {world.tokens[who]}"}
        )

    async with connect("bob") as bob, connect("alice") as alice:
        for kind, stream in streams.items():
            theirs, nothing = await _subscribe(bob, stream), await _subscribe(bob, f"{kind}/{MISSING}")
            if theirs.get("code") != "not_found" or (
                theirs["message"].replace(stream, "#") != nothing["message"].replace(f"{kind}/{MISSING}", "#")
            ):
                problems.append(f"bob subscribing to {stream}: {theirs} (missing: {nothing})")
            mine = await _subscribe(alice, stream)
            if mine.get("type") != "subscribed":
                problems.append(f"alice subscribing to {stream}: {mine}")
        # a team feed: a notice about a team A job reaches alice's page, never bob's
        for ws in (alice, bob):
            await ws.send(json.dumps({"action": "watch", "feed": "jobs"}))
            assert (await _recv(ws))["type"] == "watching"
        notice = {"id": world.objects["job"], "state": "running"}
        await sync_to_async(notify)("jobs", world.facts["team_a"], notice)
        got = await _recv(alice)
        while "seq" in got:  # a stream event of the subscriptions above
            got = await _recv(alice)
        if got.get("type") != "notice" or got.get("id") != world.objects["job"]:
            problems.append(f"alice's feed: {got}")
        try:
            problems.append(f"bob's feed got team A's notice: {await _recv(bob, 1.5)}")
        except TimeoutError:
            pass
    assert not problems, "\n".join(problems)
