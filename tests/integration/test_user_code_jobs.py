"""A user's own training script through the control plane, under the SDK (``cann_train``): the plain DDP loop
of ``examples/sdk/ddp_loop.py`` launched as a job from a directory the operator allows for code, a rank
killed and recovered from the script's own snapshot with the very losses of an uninterrupted run, its live
events, goodput and energy report; a probe script that finds none of the control plane's secrets in its
environment and no way onto another job's stream; and the requests refused with the field that is wrong."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.integration.test_jobs import wait_for_state
from tests.integration.whole_job_reports import check_whole_job_report

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
STEPS = 40
EVERY = 5


def _losses(stream: str) -> dict[int, float]:
    """Each step's loss as the job's stored train events last say it (a step trained again after a restart
    is the later one)."""
    from controlplane.live.models import StreamEvent

    out = {}
    for step, values in (
        StreamEvent.objects.filter(stream=stream, kind="train").order_by("seq").values_list("step", "values")
    ):
        out[step] = values["loss"]
    return out


def _ddp_job(script: Path, **extra) -> dict:
    return {
        "name": "my ddp loop",
        # steps of ~75 ms here (2 ranks alone; slower beside the uninterrupted twin): the kill, fired from
        # outside once the watch reads step 12, lands mid-run (batch 16 gave 11 ms steps, 40 in 0.5 s:
        # tests/engines/test_sdk.py says what that did)
        "entrypoint": {
            "script": str(script),
            "args": ["--steps", str(STEPS), "--batch", "256", "--seq", "64"],
            "nproc_per_node": 2,
        },
        "steps": STEPS,
        "device": "cpu",
        "snapshot_every": EVERY,
        "hyperparameters": {"lr": 0.003},
        **extra,
    }


def test_a_ddp_script_recovers_a_killed_rank_from_its_own_snapshot_bit_for_bit(
    live_stack, alice_api, code_dir
):
    script = code_dir / "ddp_loop.py"
    shutil.copy(ROOT / "examples" / "sdk" / "ddp_loop.py", script)

    plain = alice_api.post("/api/jobs/", _ddp_job(script), format="json")
    faulty = alice_api.post("/api/jobs/", _ddp_job(script, inject="kill-rank@step=12"), format="json")
    assert plain.status_code == 201 and faulty.status_code == 201, (plain.content, faulty.content)
    plain, faulty = plain.json(), faulty.json()
    assert faulty["config"]["entrypoint"]["workdir"] == str(code_dir)
    assert faulty["config"]["strategy"]["dp"] == 2 and faulty["nproc_per_node"] == 2
    assert f"/jobs/{faulty['id']}/snapshots-" in faulty["config"]["snapshot_dir"]

    done = [wait_for_state(job["id"], {"succeeded", "failed"}, timeout=300) for job in (plain, faulty)]
    for job in done:
        assert job.state == "succeeded", (job.human_readable_error, job.log_tail[-3000:])

    detail = alice_api.get(f"/api/jobs/{faulty['id']}/").json()
    [fault] = detail["faults"]
    # killed once it had trained step 12 (the watch looks every second: a few steps later, maybe); resumed from
    # its newest snapshot written by then
    assert fault["kind"] == "rank-killed" and fault["step"] >= 12, fault
    resumed = fault["resumed_from_step"] or 0
    assert (
        resumed % EVERY == 0 and resumed <= fault["step"] and fault["steps_lost"] == fault["step"] - resumed
    )
    assert fault["rto_s"] > 0 and fault["recovered_at"] is not None
    assert {s["step"] for s in detail["snapshots"] if s["verified"]} >= {STEPS - EVERY, STEPS}
    assert detail["goodput"]["goodput"] > 0 and detail["goodput"]["badput"]["lost_progress_s"] >= 0

    # every step's loss, after the recovery, is the uninterrupted run's: bit for bit (DDP on CPU)
    expected, got = _losses(plain["stream"]), _losses(faulty["stream"])
    assert sorted(expected) == list(range(1, STEPS + 1)) and sorted(got) == list(range(1, STEPS + 1))
    assert got == expected
    measured = done[1].measured
    assert measured["entrypoint"] is True and round(measured["losses"][-1], 6) == expected[STEPS]
    assert measured["energy"]["results"]["kwh"]["facility"] > 0

    events = alice_api.get(f"/api/jobs/{faulty['id']}/events/").json()
    train = [e for e in events if e["kind"] == "train"]
    assert train[-1]["values"]["tokens_per_s"] > 0 and train[-1]["values"]["lr"] == 0.003
    assert any(e["kind"] == "energy" for e in events)
    assert {e["values"].get("attempt") for e in train} == {1}

    # its energy report covers the run before the kill and the restart after it (each metered from its start)
    check_whole_job_report(alice_api, faulty["id"], segments={(1, 0), (1, 1)})


def _check_energy_report(client, job_id: int) -> None:
    """The job's energy and carbon report is issued from its measured figures and verifies."""
    r = client.post(f"/api/jobs/{job_id}/certificate/")
    assert r.status_code == 201, r.content
    assert r.json()["kwh"] > 0
    verdict = client.get(r.json()["verify_url"]).json()
    assert verdict["valid"] and verdict["figures_match"], verdict


def _with_and_without_a_kill(client, body: dict, timeout: float) -> tuple:
    """The job run twice side by side, uninterrupted and with a rank killed at step 12: both ended jobs, and
    each one's losses (a step trained again after the kill: its later loss)."""
    plain = client.post("/api/jobs/", {**body, "name": body["name"] + " (uninterrupted)"}, format="json")
    faulty = client.post("/api/jobs/", {**body, "inject": "kill-rank@step=12"}, format="json")
    assert plain.status_code == 201 and faulty.status_code == 201, (plain.content, faulty.content)
    jobs = [wait_for_state(r.json()["id"], {"succeeded", "failed"}, timeout=timeout) for r in (plain, faulty)]
    for job in jobs:
        assert job.state == "succeeded", (job.human_readable_error, job.log_tail[-3000:])
    return jobs, [_losses(job.stream) for job in jobs]


def test_an_fsdp2_script_takes_its_layout_from_the_plan_and_recovers(live_stack, alice_api, code_dir):
    for name in ("ddp_loop.py", "fsdp2_loop.py"):
        shutil.copy(ROOT / "examples" / "sdk" / name, code_dir / name)
    body = _ddp_job(code_dir / "fsdp2_loop.py", name="fsdp2")
    body["strategy"] = {"dp": 2, "zero_stage": 3}
    (plain, job), (expected, got) = _with_and_without_a_kill(alice_api, body, timeout=300)
    [fault] = job.faults.all()
    assert fault.kind == "rank-killed" and (fault.resumed_from_step or 0) % EVERY == 0, (
        fault.resumed_from_step
    )
    # every step's loss after the recovery is the uninterrupted run's: the sharded parameters and the
    # optimizer state came back exactly, in the layout the plan gave
    assert sorted(got) == list(range(1, STEPS + 1)) and got == expected
    assert job.measured["strategy"] == "tp1-pp1-dp2-ep1"
    events = alice_api.get(f"/api/jobs/{job.pk}/events/").json()
    assert {e["values"]["zero_stage"] for e in events if e["kind"] == "train"} == {3}
    _check_energy_report(alice_api, job.pk)


@pytest.mark.long
def test_a_transformers_trainer_with_the_callback_recovers_from_its_own_checkpoint(
    live_stack, alice_api, code_dir
):
    shutil.copy(ROOT / "examples" / "sdk" / "hf_trainer.py", code_dir / "hf_trainer.py")
    body = {
        "name": "tiny llama, transformers Trainer",
        "entrypoint": {"script": str(code_dir / "hf_trainer.py"), "nproc_per_node": 2},
        # 48 steps for a kill at 12: the injector looks from outside, and in a CI run (2026-12-06) it first
        # saw step 12 or later at step 24, the end of a 24-step run (~0.3 s a step)
        "steps": 48,
        "device": "cpu",
        "snapshot_every": 8,
    }
    (plain, job), (expected, got) = _with_and_without_a_kill(alice_api, body, timeout=420)
    [fault] = job.faults.all()
    # the Trainer went back to its own newest checkpoint (the start or a checkpoint-8k before the kill), said
    # on the timeline
    resumed = fault.resumed_from_step or 0
    assert fault.kind == "rank-killed" and resumed % 8 == 0 and resumed <= fault.step < 48, (
        fault.resumed_from_step,
        fault.step,
    )
    # every step's loss after the recovery is the uninterrupted run's (model, optimizer, RNG and data position
    # restored by the Trainer from its checkpoint)
    assert sorted(got) == list(range(1, 49)) and got == expected
    events = alice_api.get(f"/api/jobs/{job.pk}/events/").json()
    train = [e for e in events if e["kind"] == "train"]
    assert all("learning_rate" in e["values"] for e in train) and any(e["kind"] == "energy" for e in events)
    assert sorted((Path(job.config["snapshot_dir"])).glob("checkpoint-*"))
    _check_energy_report(alice_api, job.pk)


def test_a_launched_script_has_no_secrets_and_no_way_onto_another_jobs_stream(
    live_stack, alice_api, code_dir
):
    from controlplane.live.models import StreamEvent

    # the worker that launches it holds the secrets (the test session sets them, as production does)
    worker = live_stack.procs["worker"].pid
    environ = Path(f"/proc/{worker}/environ").read_bytes().split(b"\0")
    names = {item.split(b"=", 1)[0].decode() for item in environ if b"=" in item}
    assert {"SECRET_KEY", "DATABASE_URL", "REDIS_URL"} <= names

    shutil.copy(ROOT / "tests" / "data" / "user_code" / "probe.py", code_dir / "probe.py")
    shutil.copy(ROOT / "examples" / "sdk" / "ddp_loop.py", code_dir / "ddp_loop.py")
    victim = _ddp_job(code_dir / "ddp_loop.py", snapshot_every=0, steps=3)
    victim["entrypoint"]["args"] = ["--steps", "3"]
    victim = alice_api.post("/api/jobs/", victim, format="json")
    assert victim.status_code == 201, victim.content
    victim = victim.json()
    wait_for_state(victim["id"], {"succeeded", "failed"}, timeout=180)

    body = {
        "name": "probe",
        "entrypoint": {"script": str(code_dir / "probe.py")},
        "device": "cpu",
        "steps": 1,
        "hyperparameters": {"other_stream": victim["stream"]},
    }
    r = alice_api.post("/api/jobs/", body, format="json")
    assert r.status_code == 201, r.content
    job = wait_for_state(r.json()["id"], {"succeeded", "failed"}, timeout=180)
    assert job.state == "succeeded", (job.human_readable_error, job.log_tail[-3000:])
    [step] = [e for e in alice_api.get(f"/api/jobs/{job.pk}/events/").json() if e["kind"] == "train"]
    found = step["values"]
    assert not any(found[f"env_{k}"] for k in ("SECRET_KEY", "DATABASE_URL", "REDIS_URL", "METRICS_TOKEN")), (
        found
    )
    assert found["refused"] == "publish,xadd,read" and found["cwd"] == str(code_dir)
    # the entry it forged on its own stream, naming the other job's, was dropped by the relay; the other
    # job's history is what that job wrote
    from tests.conftest import wait_for

    wait_for(
        lambda: StreamEvent.objects.filter(
            stream=job.stream, kind="event", values__state="finished"
        ).exists(),
        30,
        "the probe's events to be stored",
    )
    assert not StreamEvent.objects.filter(values__from="probe").exists()
    assert not StreamEvent.objects.filter(stream=victim["stream"], seq=999).exists()
    # and the relay went on: a later job's events are stored
    later = alice_api.post("/api/jobs/", {**body, "name": "after the probe"}, format="json").json()
    assert wait_for_state(later["id"], {"succeeded", "failed"}, timeout=180).state == "succeeded"
    wait_for(
        lambda: StreamEvent.objects.filter(stream=later["stream"], kind="train").exists(),
        60,
        "a later job's events",
    )


@pytest.mark.parametrize(
    "entrypoint, field, words",
    [
        ({"script": "/etc/passwd.py"}, "entrypoint.script", "outside the directories this deployment allows"),
        ({"script": "{code}/missing.py"}, "entrypoint.script", "does not exist"),
        ({"script": "{code}/" + "a" * 300 + ".py"}, "entrypoint.script", "File name too long"),
        ({"script": "{code}/../x.py"}, "entrypoint.script", "must not contain '..'"),
        ({"script": "{code}/link/train.py"}, "entrypoint.script", "a symlink out of them is followed"),
        ({"script": "{code}/train.py", "module": "pkg"}, "entrypoint.script", "not both"),
        ({"script": "{code}/train.py", "env": {"SECRET_KEY": "x"}}, "entrypoint.env", None),
        (
            {"script": "{code}/train.py", "env": {"CANN_TRAIN_RUN_CONFIG": "x"}},
            "entrypoint.env",
            "cannot set it",
        ),
        ({"module": "pkg.train"}, "entrypoint.workdir", "needs the working directory"),
        ({"script": "{code}/train.py", "nproc_per_node": 64}, "entrypoint.nproc_per_node", None),
    ],
)
def test_requests_for_user_code_that_cannot_run_are_refused_with_the_field(
    alice_api, code_dir, tmp_path, entrypoint, field, words
):
    (code_dir / "train.py").write_text("print('hi')\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "train.py").write_text("print('hi')\n")
    (code_dir / "link").symlink_to(tmp_path / "outside")
    entrypoint = {k: (v.format(code=code_dir) if isinstance(v, str) else v) for k, v in entrypoint.items()}
    r = alice_api.post("/api/jobs/", {"name": "x", "entrypoint": entrypoint, "device": "cpu"}, format="json")
    if field == "entrypoint.env" and words is None:  # the user's own variables may be named anything else
        assert r.status_code == 201, r.content
        alice_api.post(f"/api/jobs/{r.json()['id']}/cancel/")
        return
    assert r.status_code == 400, r.content
    errors = r.json()
    flat = {k: v for k, v in errors.items() if k != "entrypoint"}
    flat.update(
        {f"entrypoint.{k}": v for k, v in (errors.get("entrypoint") or {}).items()}
        if isinstance(errors.get("entrypoint"), dict)
        else {}
    )
    assert field in flat, errors
    assert words is None or any(words in m for m in flat[field]), errors


@pytest.mark.parametrize(
    "extra, status, words",
    [
        # tp 2 on 1 node of 1 rank: no layout
        ({"strategy": {"tp": 2, "dp": 1}}, 400, "on 1 node(s): 1 rank(s) do not split into tp*pp*cp = 2"),
        ({"snapshot_every": 0}, 400, "needs snapshots"),
        ({}, 201, None),
    ],
)
def test_an_elastic_range_for_your_code_needs_a_layout_on_every_node_count(
    alice_api, code_dir, extra, status, words
):
    (code_dir / "train.py").write_text("print('hi')\n")
    body = {
        "name": "x",
        "entrypoint": {"script": str(code_dir / "train.py")},
        "device": "cpu",
        "max_nodes": 2,
        "min_nodes": 1,
        "snapshot_every": 2,
        "max_restarts": 2,
        **extra,
    }
    r = alice_api.post("/api/jobs/", body, format="json")
    assert r.status_code == status, r.content
    if status == 201:
        assert r.json()["min_nodes"] == 1 and r.json()["nnodes"] == 2
        alice_api.post(f"/api/jobs/{r.json()['id']}/cancel/")
    else:
        assert any(words in m for m in sum(r.json().values(), [])), r.json()


def test_runtime_options_are_refused_for_user_code(alice_api, code_dir):
    (code_dir / "train.py").write_text("print('hi')\n")
    body = {"name": "x", "entrypoint": {"script": str(code_dir / "train.py")}, "device": "cpu"}
    r = alice_api.post("/api/jobs/", {**body, "lr": 0.1, "training": {"global_batch_size": 8}}, format="json")
    assert r.status_code == 400 and set(r.json()) == {"lr", "training"}, r.content
    assert "sets it in its script" in r.json()["lr"][0]
    r = alice_api.post("/api/jobs/", {**body, "strategy": {"dp": 3}}, format="json")
    assert r.status_code == 400 and "the job runs 1 rank(s)" in r.json()["strategy"][0], r.content
    # (an elastic node range: test_an_elastic_range_for_your_code_needs_a_layout_on_every_node_count)
    r = alice_api.post(
        "/api/jobs/", {"name": "x", "hyperparameters": {"a": 1}, "strategy": {}, "model": {}}, format="json"
    )
    assert r.status_code == 400 and "hyperparameters" in r.json(), r.content


def test_scripts_that_go_wrong_are_told_apart_in_words(live_stack, alice_api, code_dir):
    (code_dir / "broken.py").write_text("import cann_train\nimport no_such_module  # noqa\n")
    (code_dir / "silent.py").write_text(
        "import cann_train\n\nrun = cann_train.init()\nprint('trained, said nothing')\n"
    )
    jobs = {}
    for name in ("broken", "silent"):
        r = alice_api.post(
            "/api/jobs/", {"name": name, "entrypoint": {"script": str(code_dir / f"{name}.py")}, "device": "cpu"},
            format="json",
        )  # fmt: skip
        assert r.status_code == 201, r.content
        jobs[name] = r.json()["id"]
    broken = wait_for_state(jobs["broken"], {"succeeded", "failed"}, timeout=180)
    assert broken.state == "failed" and "before its first run.report()" in broken.human_readable_error
    assert "No module named 'no_such_module'" in broken.log_tail
    silent = wait_for_state(jobs["silent"], {"succeeded", "failed"}, timeout=180)
    assert silent.state == "succeeded" and "never called run.report" in silent.human_readable_error


def test_a_cancelled_script_stops_itself_after_a_snapshot(live_stack, alice_api, code_dir):
    from controlplane.jobs.models import JobSnapshot
    from tests.conftest import wait_for

    script = code_dir / "ddp_loop.py"
    shutil.copy(ROOT / "examples" / "sdk" / "ddp_loop.py", script)
    body = _ddp_job(script, snapshot_every=1000, steps=100000)
    body["entrypoint"].update(args=["--steps", "100000"], nproc_per_node=1)
    r = alice_api.post("/api/jobs/", body, format="json")
    assert r.status_code == 201, r.content
    job_id = r.json()["id"]
    wait_for(lambda: len(_losses(r.json()["stream"])) >= 5, 180, "the script to train a few steps")
    assert alice_api.post(f"/api/jobs/{job_id}/cancel/").status_code == 202
    job = wait_for_state(job_id, {"cancelled", "failed", "succeeded"}, timeout=120)
    assert job.state == "cancelled", (job.human_readable_error, job.log_tail[-2000:])
    assert "stopping after step" in job.log_tail  # it stopped itself, within the grace period
    [snapshot] = JobSnapshot.objects.filter(job_id=job_id)
    assert snapshot.verified and snapshot.step % 1000 != 0  # the step it stopped at, off the cadence


@pytest.mark.long
def test_an_elastic_job_of_your_code_goes_on_without_a_lost_node_with_its_strategy_rescaled(
    live_stack, alice_api, code_dir
):
    """The DDP example as an elastic job (1-2 nodes of one rank): node-b's Celery worker is SIGKILLed while
    both train; node-a's rank restarts alone, ``run.strategy`` says dp 1, the SDK restores the two-rank
    snapshot resharded, and the job ends succeeded on one rank with every step trained."""
    import math

    from controlplane.live.models import StreamEvent
    from tests.integration.test_elastic_jobs import group_starts, run_losing_node_b

    shutil.copy(ROOT / "examples" / "sdk" / "ddp_loop.py", code_dir / "ddp_loop.py")
    steps = 60
    body = {
        "name": "my elastic ddp loop",
        "entrypoint": {"script": str(code_dir / "ddp_loop.py"), "args": ["--batch", "16", "--seq", "64"]},
        "steps": steps,
        "device": "cpu",
        "snapshot_every": 2,
        "max_nodes": 2,
        "min_nodes": 1,
        "max_restarts": 5,
    }
    job, stream, killed_after = run_losing_node_b(live_stack, alice_api, body)
    assert job.state == "succeeded", (job.human_readable_error, job.log_tail[-3000:])
    assert job.attempts == 1
    [lost] = job.faults.filter(kind="node-lost")
    assert (lost.node_rank, lost.node_name) == (1, "node-b")
    assert [world for seq, world in group_starts(stream) if seq > killed_after] == [1]
    [restart] = [
        v
        for v in StreamEvent.objects.filter(
            stream=stream, kind="event", values__state="started", seq__gt=killed_after
        ).values_list("values", flat=True)
    ]
    assert restart["strategy"] == "tp1-pp1-dp1-ep1"  # the plan's dp 2 rescaled to the rank left
    # resumed from a snapshot the two ranks took: the kill came once both had trained 6 steps, and the
    # newest snapshot then may still have been in its background write (CI: step 4 when step 6 was drawn)
    trained_before = StreamEvent.objects.filter(stream=stream, kind="train", seq__lte=killed_after)
    last_before = max(trained_before.values_list("step", flat=True))
    resumed = job.measured["resumed"]["step"]
    assert job.measured["world_size"] == 1 and 2 <= resumed <= last_before and resumed % 2 == 0, (
        resumed,
        last_before,
    )
    train = StreamEvent.objects.filter(stream=stream, kind="train")
    assert max(train.values_list("step", flat=True)) == steps
    assert all(math.isfinite(x) for x in train.values_list("values__loss", flat=True))
