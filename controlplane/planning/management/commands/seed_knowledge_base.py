from django.core.management.base import BaseCommand, CommandError

from controlplane.accounts.models import Team
from controlplane.planning.seed import seed_knowledge_base


class Command(BaseCommand):
    help = "Load the shipped hardware profiles, clusters, models and published reference runs into a team."

    def add_arguments(self, parser):
        parser.add_argument("--team", required=True, help="team slug")

    def handle(self, *args, **opts):
        team = Team.objects.filter(slug=opts["team"]).first()
        if team is None:
            raise CommandError(f"No team with slug {opts['team']!r}.")
        counts = seed_knowledge_base(team=team)
        self.stdout.write(", ".join(f"{v} {k.replace('_', ' ')}" for k, v in counts.items()) + f" in {team}")
