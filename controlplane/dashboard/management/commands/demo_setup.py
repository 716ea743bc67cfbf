import json
import os

from django.conf import settings
from django.core.management.base import BaseCommand

from controlplane.accounts.services import demo_setup
from controlplane.jobs.models import TrainingJob
from controlplane.jobs.services import job_create
from workers.planner.examples import small_example
from workers.training.examples import example


class Command(BaseCommand):
    help = (
        "Create the demo team and user, load the example knowledge base and launch a tiny demo training job "
        "(idempotent). Prints the credentials when created."
    )

    def add_arguments(self, parser):
        parser.add_argument("--url", default="http://127.0.0.1:8000/")

    def handle(self, *args, **opts):
        from controlplane.planning.models import StoredModelSpec
        from controlplane.planning.seed import seed_knowledge_base

        user, password = demo_setup()
        team = user.teams.first()
        # the small example (tiny-gpt on this-machine-cpu) is how a new user gets from a search to a job
        # that runs here: a demo team seeded before it shipped gets it too
        if not StoredModelSpec.objects.filter(team=team, name=small_example()["model"]["name"]).exists():
            seed_knowledge_base(team=team)
        if not TrainingJob.objects.filter(team=team).exists():
            # a real run: a tiny GPT on 2 CPU ranks (data parallel), queued now, trained by the worker that
            # `make run` starts next; the dashboard's live panel and the job page follow it
            job_create(
                team=team,
                name="demo: tiny GPT on 2 CPU ranks",
                created_by=user,
                config={
                    "model": example("tiny-dense.json"),
                    "strategy": example("dp2.json"),
                    "training": example("training.json"),
                    "steps": 100,
                    "device": "cpu",
                    "profile_every": 25,
                    # metered in the deployment's grid zone, as a job launched from a page or the API is
                    # (without one its first dashboard read 0.0000 kgCO2e)
                    "energy": {"zone": settings.GREEN_DEFAULT_ZONE},
                },
            )
        calibrating = self._calibrate_once()
        creds = settings.VAR_DIR / "demo_credentials.json"
        if password:
            creds.write_text(json.dumps({"username": user.username, "password": password}))
            os.chmod(creds, 0o600)
        elif creds.exists():
            password = json.loads(creds.read_text())["password"]
        line = "=" * 72
        self.stdout.write(line)
        self.stdout.write(f"  cann-train is starting at {opts['url']}")
        if calibrating:
            self.stdout.write(
                "  calibrating this machine for the planner in the background (after the demo job; a few"
                " minutes): the pages show its progress"
            )
        if password:
            self.stdout.write(f"  log in as: {user.username}   password: {password}")
            self.stdout.write(
                f"  (kept in {creds}; change it with: python manage.py changepassword {user.username})"
            )
        else:
            self.stdout.write(
                f"  log in as {user.username} (reset: python manage.py changepassword {user.username})"
            )
        self.stdout.write(
            '  try it: Planner → "Use the example that runs here" (tiny-gpt on this-machine-cpu) → Search →'
            " open the best plan → Launch"
        )
        self.stdout.write(line)

    def _calibrate_once(self) -> bool:
        """Queue this machine's calibration at the first start (none measured, none ever requested): plans for
        ``this-machine-cpu`` are many times off on the shipped placeholder profile."""
        from controlplane.clusters.calibration import calibration_start, calibration_status

        status = calibration_status()
        if status["calibrated"] or status["state"] is not None:
            return False
        calibration_start(by="make run (first start)")
        return True
