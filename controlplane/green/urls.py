"""Green-training API (energy, carbon, certificates) — mounted at /api/green/; filled by the green work."""

urlpatterns: list = []
