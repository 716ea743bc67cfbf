"""The grid zones the pages offer: the zones whose carbon intensity this deployment knows (the shipped 2020
histories, then a few countries CodeCarbon's annual averages cover), this deployment's own zone first when it
is none of them. The Green page's schedule form and the plan page's launch options list the same zones.

Any zone code the rule accepts (``workers.green.job.ZONE_PATTERN``) is a valid request; these are the ones a
person picks from."""

from __future__ import annotations

from workers.green.history import ZONES as HISTORY_ZONES

# zones offered besides the shipped histories: without a live provider their figure is CodeCarbon's annual
# country average (one value, nothing to shift), which the result says
OTHER_ZONES = (
    ("FR", "France"),
    ("NL", "Netherlands"),
    ("PL", "Poland"),
    ("SE", "Sweden"),
    ("US", "United States"),
    ("IN", "India"),
    ("CN", "China"),
    ("JP", "Japan"),
)
HISTORY_NAMES = {"GB": "Great Britain, 30 min", "DE": "Germany, 15 min"}


def zone_choices(*, default_zone: str, live: bool) -> list[dict]:
    """``[{"code", "label"}]``: the shipped histories' zones (``live``: a live provider is configured and comes
    first), the other countries, and ``default_zone`` first when it is none of them."""
    shipped = "live provider, else 2020 history" if live else "2020 history"
    zones = [
        {"code": z, "label": f"{z} · {HISTORY_NAMES.get(z, z)} ({shipped})"} for z in sorted(HISTORY_ZONES)
    ]
    zones += [{"code": z, "label": f"{z} · {name}"} for z, name in OTHER_ZONES]
    if default_zone not in {z["code"] for z in zones}:
        zones.insert(0, {"code": default_zone, "label": f"{default_zone} (this deployment's zone)"})
    return zones
