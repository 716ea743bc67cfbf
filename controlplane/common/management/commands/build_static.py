from django.core.management.base import BaseCommand

from controlplane.static_build import build_static


class Command(BaseCommand):
    help = (
        "Build STATIC_ROOT (hashed, compressed static files and the partial plotly.js bundle) unless it is "
        "the build of the current sources: controlplane/static_build.py."
    )

    def handle(self, *args, **opts):
        build_static(log=lambda line: self.stderr.write(line))
