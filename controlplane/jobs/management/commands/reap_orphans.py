import time
from datetime import timedelta

from django.core.management.base import BaseCommand

from controlplane.jobs import services
from workers.training.supervision.supervisor import HEARTBEAT_EVERY_S, node_name


class Command(BaseCommand):
    help = (
        "Fail the jobs whose supervising worker is gone, so they can be relaunched at once. With --node "
        "(default: this node): only jobs running there, waiting until their last heartbeat is older than "
        "--stale-after seconds (make run calls it after stopping its worker)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--node", default=None, help="only jobs with a running node of this name")
        parser.add_argument(
            "--stale-after",
            type=float,
            default=2.5 * HEARTBEAT_EVERY_S,
            help="seconds without a heartbeat that make a supervisor dead (default: %(default)s)",
        )
        parser.add_argument("--reason", default="", help="the message the failed jobs show")

    def handle(self, *args, **opts):
        node = opts["node"] or node_name()
        stale_after = timedelta(seconds=opts["stale_after"])
        human = opts["reason"] or None
        # a live supervisor beats every HEARTBEAT_EVERY_S: wait (bounded) for the last beats to age
        deadline = time.monotonic() + opts["stale_after"] + HEARTBEAT_EVERY_S
        failed: list[int] = []
        while True:
            failed += services.reap_orphans(stale_after=stale_after, node_name=node, human=human)
            if not services.running_on_node(node) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if failed:
            ids = ", ".join(str(i) for i in failed)
            self.stdout.write(f"failed job(s) {ids} on node {node}: their supervisor is gone (relaunchable)")
