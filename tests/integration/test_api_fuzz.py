"""Schemathesis against the OpenAPI schema, on a real daphne: every operation of ``/api/schema/`` gets a
bounded number of generated requests (valid and invalid ones), answered in JSON and in YAML, and each
answer must be no 5xx, of a documented status code and content type, and match its documented schema.
Generated documents rarely pass the planner's checks, so a second test sends one known-valid request to
each operation that creates or changes something and holds its answer to the same checks.

Path ids point half of the time at real objects of the fuzzing team (a finished search with its plans and
candidates, jobs with stored events, a comparison, ...), so the 200 branches are checked too, not only
the 404s; a DELETE gets objects of its own. Work that would start real processes is held back without
leaving any operation out:

- jobs (``POST /api/jobs/``, ``relaunch``, ``restore``, ``scale-down``): the fuzzing team has as many jobs queued as
  one team may (``CANN_TRAIN_MAX_ACTIVE_JOBS``), so a valid request is checked to the end and answered
  429 with nothing stored; those queued jobs are never a path id here (a cancel would free a slot);
- searches and comparisons (``POST /api/searches/``, ``what-if``, ``comm-compare``) have no such quota:
  one that is created (201) is cancelled at once, before any worker gets far with it;
- this machine's calibration (``POST /api/calibration/``): one is under way (its status file says so), so a
  valid request is answered 409 and nothing measures.
The fixture checks afterwards that no job was launched and nothing created was left running.

``CANN_TRAIN_FUZZ_EXAMPLES`` (default 25 per operation and representation) and ``CANN_TRAIN_FUZZ_SEED``
(default: fixed, so `make test` sends the same requests each time) explore further.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from dataclasses import dataclass, field

import pytest
import requests
import schemathesis
import yaml
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.conftest import calibration_held
from workers.planner.examples import contract

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

MAX_EXAMPLES = int(os.environ.get("CANN_TRAIN_FUZZ_EXAMPLES", "20"))
SEED = int(os.environ.get("CANN_TRAIN_FUZZ_SEED", "11"))
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
MEDIA_TYPES = {"json": "application/json", "yaml": "application/yaml"}
TINY_TRAINING = {"global_batch_size": 8, "dtype": "fp32", "optimizer": "adam"}
INCIDENTS = "node,time,kind\nnode-a,2026-01-01T00:28:00Z,gpu_hbm3\nnode-b,1767225600,Kernel panic\n"

TALLY: Counter = Counter()


@dataclass
class FuzzWorld:
    """The fuzzing team's objects: ids a path may point at, and the ones it must not."""

    base_url: str
    token: str
    ids: dict[str, list[int]] = field(default_factory=dict)
    # objects a DELETE may remove (the others stay for the operations after it)
    spares: dict[str, list[int]] = field(default_factory=dict)
    # ids never to send: the fuzzer's own token (revoking it ends the run), the queued jobs that fill
    # the team's quota (cancelling one would let a valid job launch)
    protected: dict[str, set[int]] = field(default_factory=dict)
    # documents of the finished search (its best strategy, its plans) for the valid requests
    facts: dict = field(default_factory=dict)

    def aim(self, case) -> None:
        """Point the generated integer ids at real objects half of the time (even ids), and never at a
        protected one."""
        resource = case.operation.path.split("/")[2]
        pool = self.spares if case.method.upper() == "DELETE" else self.ids
        for name, value in case.path_parameters.items():
            key = resource if name == "id" else {"comparison_id": "comparison"}.get(name, "")
            choices = pool.get(key)
            if isinstance(value, str) and value.isascii() and value.isdigit():
                value = int(value)  # "0293" (an invalid-data case) is id 293 to the server
            if not choices or not isinstance(value, int) or isinstance(value, bool):
                continue
            if value % 2 == 0 or value in self.protected.get(key, ()):
                case.path_parameters[name] = choices[(abs(value) // 2) % len(choices)]

    def clean_up(self, case, response) -> None:
        """Cancel at once a search or comparison that a valid request created."""
        if case.method.upper() != "POST" or response.status_code != 201:
            return
        path = case.operation.path
        body = yaml.safe_load(response.content)  # JSON or YAML
        headers = {"Authorization": f"Token {self.token}"}
        if path in ("/api/searches/", "/api/searches/{id}/what-if/"):
            requests.post(f"{self.base_url}/api/searches/{body['id']}/cancel/", headers=headers, timeout=30)
        elif path == "/api/jobs/{id}/comm-compare/":
            url = f"{self.base_url}/api/jobs/{body['job']}/comm-compare/{body['id']}/cancel/"
            requests.post(url, headers=headers, timeout=30)


def _copies(model, rows, n: int = 6) -> list[int]:
    """``n`` copies of the given rows (for DELETE to remove), renamed where names are unique."""
    ids = []
    for i in range(n):
        row = model.objects.get(pk=rows[i % len(rows)].pk)
        row.pk = None
        row._state.adding = True
        row.name = f"spare {i} of {row.name}"[:200]
        if isinstance(getattr(row, "spec", None), dict):
            row.spec = {**row.spec, "name": row.name}
        row.save()
        ids.append(row.pk)
    return ids


def _seed(team, user) -> FuzzWorld:
    """Real objects of every kind for the fuzzing team (token and URLs are filled in by the fixture)."""
    from django.utils import timezone

    from controlplane.accounts.services import token_issue
    from controlplane.clusters.models import Cluster, HardwareProfile
    from controlplane.jobs import services as job_services
    from controlplane.jobs.models import CommComparison, JobSnapshot, TrainingJob
    from controlplane.live.models import StreamEvent
    from controlplane.planning import services as planning_services
    from controlplane.planning.models import StoredModelSpec, StoredPlan, StrategySearch
    from controlplane.planning.seed import seed_knowledge_base
    from workers.training.examples import example

    seed_knowledge_base(team=team)
    done = StrategySearch.objects.create(
        team=team,
        created_by=user,
        request={
            "cluster": contract("cluster.json"),
            "model": contract("model.json"),
            "training": contract("training.json"),
            "strategy": {},
            "top_k": 5,
            "allow_fewer_nodes": False,
        },
    )
    assert planning_services.search_run(search_id=done.pk) == "succeeded"
    queued = StrategySearch.objects.create(team=team, created_by=user, request=done.request)
    best = StoredPlan.objects.filter(search=done).order_by("rank").first()

    config = job_services.validated_config(
        job_services.job_config_of(
            model=example("tiny-dense.json"),
            strategy={"dp": 2},
            training=TINY_TRAINING,
            steps=5,
            device="cpu",
        )
    )
    jobs = {}
    for state, attempts in (("succeeded", 1), ("failed", 1), ("cancelled", 1), ("queued", 0)):
        jobs[state] = TrainingJob.objects.create(
            team=team,
            name=f"{state} job",
            config=config,
            nproc_per_node=2,
            attempts=attempts,  # the queued one was never launched: it holds no slot of the quota
            state=state,
            source_plan=best,
            tags=["fuzz"],
            measured={"step_time_s": 0.5} if state == "succeeded" else None,
        ).pk
    JobSnapshot.objects.create(  # what a valid restore of the failed job names
        job_id=jobs["failed"],
        name="step-00000005",
        step=5,
        kind="full",
        created_at=timezone.now(),
        verified=True,
    )
    StreamEvent.objects.bulk_create(
        StreamEvent(
            stream=f"job/{jobs['succeeded']}",
            seq=seq,
            time=timezone.now(),
            kind="train",
            step=seq,
            values={"loss": 5.0 - seq * 0.1, "step_time_s": 0.5, "tokens_per_s": 1000.0},
        )
        for seq in range(1, 6)
    )
    comparison = CommComparison.objects.create(
        team=team,
        job_id=jobs["succeeded"],
        state="succeeded",
        request={"methods": ["dense"], "steps": 20, "nodes": 2, "ranks_per_node": 2, "inter_node_gbit": 1.0},
        result={},
    )
    # the team's quota of queued work is full: a valid job request ends in a 429, and nothing launches
    fillers = {
        TrainingJob.objects.create(
            team=team, name=f"waiting {i}", config=config, attempts=1, state="queued"
        ).pk
        for i in range(job_services.MAX_ACTIVE_JOBS_PER_TEAM)
    }
    clusters = list(Cluster.objects.filter(team=team)[:4])
    profiles = list(HardwareProfile.objects.filter(team=team)[:4])
    models = list(StoredModelSpec.objects.filter(team=team)[:4])
    plans = [best, *StoredPlan.objects.filter(team=team).exclude(pk=best.pk)[:3]]
    world = FuzzWorld(
        base_url="",
        token="",
        ids={
            "clusters": [c.pk for c in clusters],
            "hardware-profiles": [p.pk for p in profiles],
            "models": [m.pk for m in models],
            "plans": [p.pk for p in plans],
            "searches": [done.pk, queued.pk],
            "jobs": list(jobs.values()),
            "comparison": [comparison.pk],
        },
        protected={"jobs": fillers},
        facts={"search": done.pk, "queued_search": queued.pk, "best": best, "jobs": jobs},
    )
    world.spares = {
        "clusters": _copies(Cluster, clusters),
        "hardware-profiles": _copies(HardwareProfile, profiles),
        "models": _copies(StoredModelSpec, models),
        "plans": _copies(StoredPlan, plans),
        "tokens": [token_issue(user=user, name=f"spare {i}")[0].pk for i in range(6)],
    }
    return world


@pytest.fixture
def fuzz_world(live_stack, make_member, token_for):
    from controlplane.accounts.models import ApiToken
    from controlplane.jobs.models import CommComparison, TrainingJob
    from controlplane.planning.models import StrategySearch

    user = make_member("fuzzer", "Fuzz")
    token = token_for(user)
    team = user.teams.first()
    world = _seed(team, user)
    world.base_url, world.token = live_stack.base_url, token
    world.protected["tokens"] = set(
        ApiToken.objects.filter(user=user, name="tests").values_list("pk", flat=True)
    )
    seeded_searches = set(StrategySearch.objects.filter(team=team).values_list("pk", flat=True))
    seeded_comparisons = set(CommComparison.objects.filter(team=team).values_list("pk", flat=True))
    seeded_jobs = set(TrainingJob.objects.filter(team=team).values_list("pk", flat=True))
    with calibration_held(live_stack):
        yield world

    # nothing was launched: a valid job request ended in the quota's 429 (and stored nothing), every search
    # or comparison a valid request created was cancelled or has already ended (a worker without network
    # namespaces fails a comparison at once; a small search may finish first)
    assert not TrainingJob.objects.filter(team=team).exclude(pk__in=seeded_jobs).exists()
    assert TrainingJob.objects.filter(pk__in=world.protected["jobs"], state="queued").count() == len(
        world.protected["jobs"]
    )
    for started in (
        StrategySearch.objects.filter(team=team).exclude(pk__in=seeded_searches),
        CommComparison.objects.filter(team=team).exclude(pk__in=seeded_comparisons),
    ):
        # (a search of a small scenario may end before its cancel arrives: ended is as good as cancelled)
        assert all(row.cancel_requested or row.is_finished for row in started), [
            (row, row.state) for row in started
        ]


# yaml: the long tier (make test keeps json: the same generated requests, rendered by the other renderer)
@pytest.fixture(
    params=[pytest.param(m, marks=pytest.mark.long) if m == "yaml" else m for m in sorted(MEDIA_TYPES)]
)
def representation(request) -> str:
    return request.param


@pytest.fixture
def api_schema(live_stack, fuzz_world, representation):
    config = schemathesis.Config.from_dict(
        {
            "seed": SEED,
            "suppress-health-check": ["all"],
            "base-url": live_stack.base_url,
            "headers": {"Authorization": f"Token {fuzz_world.token}", "Accept": MEDIA_TYPES[representation]},
            "generation": {
                # YAML answers the same generated requests as JSON, only rendered by another renderer: a
                # third of the examples per operation checks that renderer against the schema (CI time)
                "max-examples": MAX_EXAMPLES if representation == "json" else max(5, MAX_EXAMPLES // 3),
                "no-shrink": True,
                "database": "none",
                "with-security-parameters": False,
            },
            # the explicit examples and the fuzzing phase (positive and negative data); the coverage phase's
            # boundary values would be several hundred requests per operation, stateful links none here
            "phases": {"coverage": {"enabled": False}, "stateful": {"enabled": False}},
        }
    )
    return schemathesis.openapi.from_url(
        live_stack.base_url + "/api/schema/?format=json",
        config=config,
        headers={"Authorization": f"Token {fuzz_world.token}"},
        timeout=30,
    )


schema = schemathesis.pytest.from_fixture("api_schema")


@pytest.fixture(scope="module", autouse=True)
def report_tally(request):
    """After the run, one line on the terminal: operations, requests and the status codes answered."""
    yield
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or not TALLY:
        return
    operations = {key[1] for key in TALLY if key[0] == "op"}
    total = sum(n for key, n in TALLY.items() if key[0] == "op")
    statuses = {key[1]: n for key, n in sorted(TALLY.items()) if key[0] == "status"}
    line = f"schemathesis: {len(operations)} operations, {total} requests, answers {statuses}"
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        reporter.write_line("\n" + line)


def rejected_by_twisted(case, response) -> bool:
    """Twisted, under daphne, answers a ``multipart/form-data`` body it cannot parse with a bare 400 (no body,
    no Content-Type) before the request reaches the app (``twisted.web.http.Request.requestReceived``): a
    4xx, but no answer of ours whose content type or body the schema could describe."""
    return (
        response.status_code == 400
        and not response.content
        and "content-type" not in response.headers
        and (case.media_type or "").startswith("multipart/form-data")
    )


def call_and_check(case, world: FuzzWorld, representation: str, checks=None):
    if case.query and isinstance(case.query.get("format"), str) and case.query["format"] in MEDIA_TYPES:
        case.query["format"] = representation  # a valid format asks for the representation under test
    response = case.call(timeout=60)
    TALLY["op", f"{case.method.upper()} {case.operation.path}"] += 1
    TALLY["status", response.status_code] += 1
    world.clean_up(case, response)
    if checks is None:
        checks = (
            [not_a_server_error, status_code_conformance] if rejected_by_twisted(case, response) else CHECKS
        )
    case.validate_response(response, checks=checks)
    return response


@schema.parametrize()
def test_every_operation_answers_as_documented(case, fuzz_world, representation):
    fuzz_world.aim(case)
    call_and_check(case, fuzz_world, representation)


def valid_requests(world: FuzzWorld) -> list[tuple[str, str, dict, object, set[int]]]:
    """(method, path, path parameters, body, the statuses it may answer) of one valid request per operation
    that creates or changes something, plus the reads whose bodies the generated requests rarely reach."""
    from controlplane.planning.seed import local_cpu_cluster
    from workers.training.examples import example

    best, jobs, ids, spares = world.facts["best"], world.facts["jobs"], world.ids, world.spares
    search = {"id": world.facts["search"]}
    model, cluster, training = contract("model.json"), contract("cluster.json"), contract("training.json")
    cpu, _ = local_cpu_cluster()
    scenario = {"model": best.model_doc, "cluster": best.cluster_doc, "training": best.training}
    tiny_job = {
        "name": "one more job",
        "model": example("tiny-dense.json"),
        "strategy": {"dp": 2},
        "training": TINY_TRAINING,
        "steps": 5,
        "device": "cpu",
    }
    profile = {
        "name": "Ascend-910B-fuzz",
        "confidence": "soft",
        "peak_tflops": {"bf16": 313},
        "memory_GiB": 64,
        "sources": {"peak_tflops": "third-party claims range 256-320 TFLOP/s fp16 (soft)"},
    }
    return [
        ("POST", "/api/models/", {}, {**model, "name": "gpt3 copy"}, {201}),
        ("PUT", "/api/models/{id}/", {"id": ids["models"][0]}, {**model, "name": "gpt3 renamed"}, {200}),
        ("PATCH", "/api/models/{id}/", {"id": ids["models"][0]}, {"num_layers": 48}, {200}),
        ("DELETE", "/api/models/{id}/", {"id": spares["models"][0]}, None, {204}),
        ("POST", "/api/clusters/", {}, {**cluster, "name": "superpod copy"}, {201}),
        ("PATCH", "/api/clusters/{id}/", {"id": ids["clusters"][0]}, {"name": "renamed cluster"}, {200}),
        ("POST", "/api/hardware-profiles/", {}, profile, {201}),
        (
            "PATCH",
            "/api/hardware-profiles/{id}/",
            {"id": ids["hardware-profiles"][0]},
            {"memory_GiB": 96},
            {200},
        ),
        (
            "POST",
            "/api/plans/",
            {},
            {
                "name": "tiny on this machine",
                "model": example("tiny-dense.json"),
                "cluster": {**cpu, "num_nodes": 1, "devices_per_node": 2},
                "training": TINY_TRAINING,
                "strategy": example("dp2.json"),
            },
            {201},
        ),
        ("POST", "/api/plans/evaluate/", {}, {**scenario, "strategy": best.strategy}, {200}),
        ("POST", "/api/calibration/", {}, {"quick": True}, {409}),
        ("GET", "/api/plans/{id}/plan-json/", {"id": best.pk}, None, {200}),
        ("GET", "/api/plans/{id}/scale-down/", {"id": best.pk}, None, {200}),
        ("POST", "/api/plans/{id}/scale-down/", {"id": best.pk}, {"steps": 5}, {429}),
        (
            "POST",
            "/api/searches/",
            {},
            {"cluster_doc": cluster, "model_doc": model, "training": training},
            {201},
        ),
        ("GET", "/api/searches/{id}/candidates/", search, None, {200}),
        ("GET", "/api/searches/{id}/page-data/", search, None, {200}),
        ("POST", "/api/searches/{id}/what-if/", search, {"lose_nodes": 1}, {201}),
        ("POST", "/api/searches/{id}/save-plan/", search, {"strategy": best.strategy}, {200, 201}),
        ("POST", "/api/searches/{id}/cancel/", {"id": world.facts["queued_search"]}, None, {202}),
        ("POST", "/api/jobs/", {}, tiny_job, {429}),
        ("PATCH", "/api/jobs/{id}/", {"id": jobs["succeeded"]}, {"tags": ["a", "b"], "notes": "fine"}, {200}),
        ("GET", "/api/jobs/{id}/events/", {"id": jobs["succeeded"]}, None, {200}),
        ("POST", "/api/jobs/{id}/probe/", {"id": jobs["succeeded"]}, {"message": "hello"}, {202}),
        ("POST", "/api/jobs/{id}/relaunch/", {"id": jobs["failed"]}, None, {429}),
        ("POST", "/api/jobs/{id}/restore/", {"id": jobs["failed"]}, {"snapshot": "step-00000005"}, {429}),
        ("POST", "/api/jobs/{id}/restore/", {"id": jobs["queued"]}, {"snapshot": "step-00000005"}, {409}),
        ("POST", "/api/jobs/{id}/cancel/", {"id": jobs["queued"]}, None, {202}),
        ("POST", "/api/jobs/{id}/cancel/", {"id": jobs["succeeded"]}, None, {400}),
        ("GET", "/api/jobs/{id}/comm-compare/", {"id": jobs["succeeded"]}, None, {200}),
        # 400 where this machine cannot build the emulated network (no `ip netns`)
        ("POST", "/api/jobs/{id}/comm-compare/", {"id": jobs["succeeded"]}, {"steps": 2}, {201, 400}),
        (
            "POST",
            "/api/jobs/{id}/comm-compare/{comparison_id}/cancel/",
            {"id": jobs["succeeded"], "comparison_id": ids["comparison"][0]},
            None,
            {400},  # it already ended
        ),
        ("POST", "/api/tokens/", {}, {"name": "laptop"}, {201}),
        ("DELETE", "/api/tokens/{id}/", {"id": spares["tokens"][0]}, None, {204}),
        # the failure-pattern knowledge base: an incident list extends the patterns (again: duplicates, 201)
        ("POST", "/api/failure-patterns/incidents/", {}, {"csv": INCIDENTS}, {201}),
        ("GET", "/api/failure-patterns/{key}/", {"key": "kernel_panic"}, None, {200}),
        ("GET", "/api/failure-patterns/{key}/", {"key": "gpu_hbm3"}, None, {200}),
    ]


def test_valid_requests_answer_as_documented(api_schema, fuzz_world, representation):
    """Each valid request, its body in the representation under test, answers what it should (a launch: the
    quota's 429) with a body that matches the schema."""
    media_type = MEDIA_TYPES[representation]
    for method, path, path_parameters, body, expected in valid_requests(fuzz_world):
        operation = api_schema[path][method]
        kwargs = {"body": body, "media_type": media_type} if body is not None else {}
        headers = {"Authorization": f"Token {fuzz_world.token}", "Accept": media_type}
        case = operation.Case(
            path_parameters=path_parameters, query={"format": representation}, headers=headers, **kwargs
        )
        response = call_and_check(case, fuzz_world, representation, checks=CHECKS)
        assert response.status_code in expected, (method, path, response.status_code, response.text[:2000])
