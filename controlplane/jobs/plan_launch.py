"""Launching a stored plan from its page: the launch options the page offers, and the scaled-down launch with
them.

:func:`launch_form` gives one labelled field per option a job request takes (``POST /api/jobs/``,
:class:`~controlplane.jobs.apis.JobCreateSerializer`), made from that serializer's own fields (their bounds,
choices, defaults and help) so the form offers what the API has and no more; a new option in the runtime's
table (``workers/training/options.py``) is a new field here without a line of this module. What the
serializer cannot say is added from where it is known: the plan's world size (the node counts that divide it),
the communication hooks (``workers.training.comm_methods``), the grid zones (``controlplane.green.zones``), the
team's stored green schedules, and the settings of ``energy`` (``workers.green.job.SETTINGS``).

Each field is a dict the template renders (``frontend/templates/planning/launch_options.html``) and the page's
script reads back (``frontend/static/js/launch_options.js``): ``name`` is the request's key (``energy.pue``
for a key of a nested object), ``kind`` its JSON type; a field left empty is left out of the request, so the
API's default applies, and ``default`` says what that default is.

:func:`scaled_down_launch` starts the scaled-down plan (``POST /api/plans/<id>/scale-down/``) with the same
options, checked by the same serializer. The planning app, below this one, reaches both through its ports
(``controlplane.planning.ports``)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.utils import timezone
from rest_framework import serializers
from rest_framework.exceptions import ValidationError

from controlplane.green.models import GreenSchedule
from controlplane.green.selectors import live_intensity_providers
from controlplane.green.zones import zone_choices
from controlplane.jobs.apis import CarbonAwareSerializer, JobCreateSerializer
from controlplane.jobs.services.submit import job_submit
from controlplane.jobs.slots import slots_of, utc_text
from workers.green.job import DEFAULT_EVERY
from workers.green.job import SETTINGS as ENERGY_SETTINGS
from workers.planner.energy import DEFAULT_PUE
from workers.training.comm_methods import FSDP_REFUSED, HOOK_NAMES
from workers.training.options import OPTIONS, by_name

# keys of a job request the launch form does not offer, and why (a test checks every other key has a field)
NOT_OFFERED = {
    "team": "the plan's team",
    "name": "the form's own Job name",
    "steps": "the form's own Steps",
    "plan_id": "the plan of the page",
    "model": "the plan's model document",
    "plan": "the plan itself",
    "strategy": "the plan's strategy",
    "training": "the plan's training document",
    "max_nodes": "another name for nnodes",
    "entrypoint": "your own training code: POST /api/jobs/ or cann-train train --entrypoint",
    "hyperparameters": "with an entrypoint only",
}
# what a scaled-down launch takes besides them: it runs on this machine's CPU ranks, one node
NOT_SCALED_DOWN = ("nnodes", "min_nodes", "device")

SECTIONS = (
    ("nodes", "Nodes"),
    ("start", "Start"),
    ("comm", "Communication"),
    ("fault tolerance", "Fault tolerance"),
    ("checkpoint", "Snapshots"),
    ("energy", "Energy and carbon"),
    ("run", "Run"),
    ("optimizer", "Optimizer"),
    ("model", "Model"),
    ("data", "Data"),
    ("metrics", "Metrics"),
)
SECTION_NOTES = {
    "start": "Now by default; or on a stored green schedule of the plan's team; or carbon-aware: scheduled now on "
    "the least carbon before a deadline. One or the other, not both.",
    "energy": "Every job is metered; the carbon uses the grid zone's intensity. A PUE needs its source, a price "
    "its currency.",
}
# the request's keys outside the runtime's options table, by section
SECTION_OF = {
    "nnodes": "nodes",
    "min_nodes": "nodes",
    "max_restarts": "fault tolerance",
    "hang_timeout_s": "fault tolerance",
    "green_schedule": "start",
    "carbon_aware": "start",
}
LABELS = {
    "nnodes": "Nodes",
    "min_nodes": "Fewest nodes (elastic)",
    "max_restarts": "Automatic recoveries",
    "hang_timeout_s": "Hang timeout (s)",
    "green_schedule": "Stored green schedule",
    "carbon_aware": "Carbon-aware start",
    "carbon_aware.deadline_h": "Finish within (h)",
    "carbon_aware.interruptible": "Interruptible (runs in slots)",
    "carbon_aware.zone": "Grid zone to schedule in",
    "carbon_aware.duration_h": "Run time (h)",
    "carbon_aware.power_kw": "IT power (kW)",
    "carbon_aware.site_cap_kw": "Site power cap (kW)",
    "carbon_aware.forecast_csv": "Intensity forecast (CSV)",
    "device": "Device",
    "seed": "Seed",
    "lr": "Peak learning rate",
    "hf_model": "Hugging Face model directory",
    "tokenizer": "Tokenizer",
    "data": "Training data",
    "data_field": "Text field of a record",
    "val_fraction": "Validation fraction",
    "val_every": "Validate every (steps)",
    "comm_hook": "Communication hook",
    "bucket_cap_mb": "Gradient bucket (MB)",
    "snapshot_every": "Snapshot every (steps)",
    "snapshot_full_every": "Full snapshot every (snapshots)",
    "snapshot_delta": "Between full snapshots",
    "snapshot_keep": "Snapshots kept",
    "snapshot_memory_every": "In-memory snapshot every (steps)",
    "risk_policy": "Risk policy",
    "inject": "Inject faults",
    "profile_every": "Profile every (steps)",
    "energy.zone": "Grid zone",
    "energy.pue": "PUE",
    "energy.pue_source": "PUE source",
    "energy.price_per_kwh": "Price per kWh",
    "energy.currency": "Currency",
    "energy.price_source": "Price source",
    "energy.market_factor_g_per_kwh": "Market-based factor (gCO2e/kWh)",
    "energy.market_factor_source": "Market factor source",
    "energy.tdp_watts": "Device TDP (W)",
    "energy.device_name": "Device name",
    "energy.every": "Sample every (steps)",
    "energy.enabled": "Meter energy",
}
# the default of a key whose serializer field has none (the runtime or the service chooses), as a person reads it
DEFAULT_TEXT = {
    "nnodes": "1",
    "min_nodes": "= Nodes (not elastic)",
    "green_schedule": "none: start now",
    "hf_model": "none: weights from the seed",
    "tokenizer": "hf_model's own",
    "data": "this interpreter's standard library",
    "comm_hook": "none: DDP's all-reduce",
    "bucket_cap_mb": "from the plan's inter-node link, else 25",
    "inject": "none",
    "carbon_aware.zone": "the job's grid zone",
    "carbon_aware.duration_h": "steps × the plan's step time",
    "carbon_aware.power_kw": "the plan's predicted power",
    "carbon_aware.site_cap_kw": "none",
    "carbon_aware.forecast_csv": "the zone's series",
    "energy.pue": f"{DEFAULT_PUE:g} (industry average)",
    "energy.pue_source": "the default's citation",
    "energy.price_per_kwh": "none: no cost",
    "energy.currency": "none",
    "energy.price_source": "set on the job",
    "energy.market_factor_g_per_kwh": "none: location-based only",
    "energy.market_factor_source": "none",
    "energy.tdp_watts": "the meter's, else the device's",
    "energy.device_name": "cpu on CPU ranks",
    "energy.every": str(DEFAULT_EVERY),
}
HELP = {
    "nnodes": "the nodes its ranks are split over (it must divide the plan's ranks); more than one runs on node "
    "workers, one per node (CANN_TRAIN_NODE=<name> celery -A controlplane worker -Q training,node.<name>)",
    "green_schedule": "a schedule of the plan's team from the Green page: the job waits in 'scheduled' and starts "
    "when its slot opens",
    "carbon_aware": "schedule it now on the least carbon before its deadline, then wait for that window",
    "comm_hook": "the DDP communication hook on the data-parallel group (zero_stage 0; with ZeRO the hooks that "
    "have a reduce-scatter form)",
    "comm_hook-options": "key=value,... of the hook, e.g. density=0.01 for topk_ef",
    "profile_every": "measure compute against communication with the torch profiler every N steps: this page "
    "sends 5, so the job page splits the step time (0: never)",
    "energy.zone": "where its electricity comes from: the carbon intensity's grid zone",
    "energy.pue": "facility energy / IT energy, at least 1",
    "energy.pue_source": "where the PUE comes from (a measurement, the operator's report); needed with a PUE",
    "energy.price_per_kwh": "a flat tariff: the job's cost",
    "energy.currency": "the price's currency, e.g. EUR; needed with a price",
    "energy.price_source": "where the price comes from",
    "energy.market_factor_g_per_kwh": "a market-based emission factor (a contract, certificates)",
    "energy.market_factor_source": "its contract or certificates; needed with a factor",
    "energy.tdp_watts": "a device's thermal design power (more than 0), for the estimate when no meter reads it",
    "energy.device_name": "the device, for its embodied carbon (e.g. A100-SXM4-80GB)",
    "energy.every": "steps between two energy samples",
    "energy.enabled": "meter the job's energy and carbon",
}
# ``energy`` is one JSON object: its settings' types and bounds (``check_energy_settings`` has the rules)
ENERGY_FIELDS = {
    "zone": ("str", {}),
    "pue": ("float", {"min": 1}),
    "pue_source": ("str", {"max_length": 300}),
    "price_per_kwh": ("float", {"min": 0}),
    "currency": ("str", {"max_length": 300}),
    "price_source": ("str", {"max_length": 300}),
    "market_factor_g_per_kwh": ("float", {"min": 0}),
    "market_factor_source": ("str", {"max_length": 300}),
    "tdp_watts": ("float", {}),  # more than 0
    "device_name": ("str", {"max_length": 300}),
    "every": ("int", {"min": 1}),
    "enabled": ("bool", {}),
}
PREFILLED = {"profile_every": "5"}  # what the page sends unless the person changes it
TEXTAREAS = ("carbon_aware.forecast_csv",)
PLACEHOLDERS = {"inject": "e.g. kill-rank@step=5", "comm_hook-options": "e.g. density=0.01"}


def _label(name: str) -> str:
    return LABELS.get(name) or name.rsplit(".", 1)[-1].replace("_", " ").capitalize()


def _text(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _bound_text(value: float) -> str:
    """A bound as a person reads it: 100,000 (not 1e+05), 0.01667."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:.4g}"


def _default_of(name: str, field: serializers.Field | None) -> Any:
    """The value the API uses when the key is left out: the serializer field's default, else the job
    config's (the runtime's options table), else ``...`` (the service chooses: ``DEFAULT_TEXT`` says how)."""
    if field is not None and field.default is not serializers.empty:
        return field.default
    option = by_name(OPTIONS).get(name)
    return option.default if option is not None else ...


def _field(
    name: str,
    field: serializers.Field | None,
    *,
    kind: str | None = None,
    bounds: dict | None = None,
    default: Any = ...,
) -> dict:
    """One form field of a request key, from its serializer field (or, for ``energy``'s settings, the kind
    and bounds given)."""
    if field is not None:
        if isinstance(field, serializers.BooleanField):
            kind = "bool"
        elif isinstance(field, serializers.ChoiceField):
            kind = "str"
        elif isinstance(field, serializers.IntegerField):
            kind = "int"
        elif isinstance(field, serializers.FloatField):
            kind = "float"
        else:
            kind = "str"
        bounds = {
            "min": getattr(field, "min_value", None),
            "max": getattr(field, "max_value", None),
            "max_length": getattr(field, "max_length", None),
        }
        default = _default_of(name, field)
    bounds = {k: v for k, v in (bounds or {}).items() if v is not None}
    shown = DEFAULT_TEXT.get(name) or ("" if default is ... else _text(default))
    out = {
        "name": name,
        "slug": name.replace(".", "-").replace("_", "-"),
        "label": _label(name),
        "kind": kind,
        "help": HELP.get(name) or (field.help_text if field is not None and field.help_text else ""),
        "default": shown,
        "value": PREFILLED.get(name, ""),
        **bounds,
    }
    if name in TEXTAREAS:
        out["widget"] = "textarea"
    elif kind == "bool":
        out |= {"widget": "checkbox", "checked": default is True}
    elif field is not None and isinstance(field, serializers.ChoiceField):
        out |= {"widget": "select", "choices": _choices(field.choices, shown)}
    elif kind in ("int", "float"):
        out |= {"widget": "number", "step": "1" if kind == "int" else "any"}
    else:
        out["widget"] = "text"
    if placeholder := PLACEHOLDERS.get(name):
        out["placeholder"] = placeholder
    elif out["widget"] in ("number", "text", "textarea") and shown:
        out["placeholder"] = f"default: {shown}"
    if out["widget"] == "number" and "min" in bounds:
        low = _bound_text(bounds["min"])
        out["range"] = f"{low} to {_bound_text(bounds['max'])}" if "max" in bounds else f"at least {low}"
    return out


def _choices(values: Iterable, default_text: str) -> list[dict]:
    """A select's options: the first, empty, means the API's default and says what it is."""
    return [{"value": "", "label": f"default ({default_text})" if default_text else "default"}] + [
        {"value": str(v), "label": str(v)} for v in values
    ]


def _node_field(field: serializers.Field, world: int) -> dict:
    """Nodes: the counts that divide the plan's ranks (tp*pp*dp*cp), each with its ranks per node."""
    out = _field("nnodes", field)
    counts = [n for n in range(1, world + 1) if world % n == 0]
    options = [
        {
            "value": str(n),
            "label": f"{n} node{'s' if n != 1 else ''} × {world // n} rank{'s' if world // n != 1 else ''}",
        }
        for n in counts
        if n != 1
    ]
    first = f"default: 1 node × {world} rank{'s' if world != 1 else ''}"
    return out | {"widget": "select", "choices": [{"value": "", "label": first}, *options], "range": ""}


def _hook_fields(field: serializers.Field, zero_stage: int) -> list[dict]:
    """The hook by name (those FSDP cannot run are offered disabled, with why, for a plan with ZeRO) and its
    ``key=value`` options: the page sends ``name:options``."""
    out = _field("comm_hook", field)
    choices = _choices(HOOK_NAMES, out["default"])
    for c in choices[1:]:
        if zero_stage and c["value"] in FSDP_REFUSED:
            c |= {
                "disabled": True,
                "title": FSDP_REFUSED[c["value"]],
                "label": f"{c['value']} (not with ZeRO)",
            }
    options = {
        "name": "comm_hook-options",
        "slug": "comm-hook-options",
        "label": "Hook options",
        "kind": "str",
        "widget": "text",
        "help": HELP["comm_hook-options"],
        "default": "the hook's own",
        "value": "",
        "placeholder": PLACEHOLDERS["comm_hook-options"],
        "suffix_of": "comm_hook",
    }
    return [out | {"widget": "select", "choices": choices}, options]


def _zone_field(name: str, field: serializers.Field | None, zones: list[dict], default_text: str) -> dict:
    out = _field(name, field, kind="str") if field is None else _field(name, field)
    choices = [{"value": "", "label": f"default ({default_text})"}]
    choices += [{"value": z["code"], "label": z["label"]} for z in zones]
    return out | {"widget": "select", "choices": choices, "default": default_text}


def _schedule_field(field: serializers.Field, schedules: list) -> dict:
    out = _field("green_schedule", field)
    choices = [{"value": "", "label": "none: start now"}]
    for s in schedules:
        slots = slots_of(s)
        when = f"{utc_text(slots[0][0])} to {utc_text(slots[-1][1])}" if slots else "no slot"
        more = f", {len(slots)} slots" if len(slots) > 1 else ""
        choices.append({"value": str(s.pk), "label": f"#{s.pk} {s.name} · {s.zone} · {when}{more}"})
    return out | {"widget": "select", "choices": choices, "range": ""}


def usable_schedules(team, *, now=None) -> list:
    """The team's stored green schedules a new job may still run under: no job holds it and its last slot has
    not ended (``scheduling.check_schedule`` says why another one is refused)."""
    now = now or timezone.now()
    rows = GreenSchedule.objects.filter(team=team, end__gt=now, job__isnull=True).order_by("start", "id")
    return [s for s in rows if (slots := slots_of(s)) and slots[-1][1] > now]


def launch_form(*, user, plan) -> dict:
    """The launch form's options for ``plan`` (a stored plan ``user`` may read): ``{"sections": [{"key",
    "title", "note", "fields", "scaled_down"}], "default_zone", "world_size", "not_offered",
    "not_scaled_down"}``, each field as the module docstring says (``scaled_down``: the scaled-down launch
    takes it too); ``carbon_aware`` is a ``group`` whose ``fields`` are its object's."""
    fields = JobCreateSerializer().fields
    strategy = plan.strategy or {}
    world = 1
    for key in ("tp", "pp", "dp", "cp"):
        world *= int(strategy.get(key, 1) or 1)
    default_zone = settings.GREEN_DEFAULT_ZONE
    zones = zone_choices(
        default_zone=default_zone, live=bool(live_intensity_providers(os.environ)["providers"])
    )
    options = by_name(OPTIONS)
    by_section: dict[str, list[dict]] = {}
    for name, field in fields.items():
        if name in NOT_OFFERED:
            continue
        section = SECTION_OF.get(name) or (options[name].section if name in options else "run")
        if name == "nnodes":
            made = [_node_field(field, world)]
        elif name == "comm_hook":
            made = _hook_fields(field, int(strategy.get("zero_stage", 0) or 0))
        elif name == "green_schedule":
            made = [_schedule_field(field, usable_schedules(plan.team))]
        elif name == "energy":
            made = [
                _zone_field("energy.zone", None, zones, f"{default_zone}, this deployment's")
                if key == "zone"
                else _field(f"energy.{key}", None, kind=ENERGY_FIELDS[key][0], bounds=ENERGY_FIELDS[key][1],
                            default=True if key == "enabled" else ...)
                for key in ENERGY_SETTINGS
            ]  # fmt: skip
        elif name == "carbon_aware":  # a ticked box sends the object, its fields fill it
            group = [
                (
                    _zone_field(f"{name}.{sub}", sub_field, zones, DEFAULT_TEXT[f"{name}.{sub}"])
                    if sub == "zone"
                    else _field(f"{name}.{sub}", sub_field)
                )
                | {"required": sub_field.required}
                for sub, sub_field in CarbonAwareSerializer().fields.items()
            ]
            made = [
                _field(name, None, kind="object") | {"widget": "group", "checked": False, "fields": group}
            ]
        else:
            made = [_field(name, field)]
        by_section.setdefault(section, []).extend(made)
    titles = dict(SECTIONS)
    order = [k for k, _ in SECTIONS if k in by_section] + [k for k in by_section if k not in titles]
    for made in by_section.values():
        for f in made:
            f["scaled_down"] = f["name"] not in NOT_SCALED_DOWN
    return {
        "sections": [
            {
                "key": key,
                "title": titles.get(key, key.capitalize()),
                "note": SECTION_NOTES.get(key, ""),
                "fields": by_section[key],
                "scaled_down": any(f["scaled_down"] for f in by_section[key]),
            }
            for key in order
        ],
        "default_zone": default_zone,
        "world_size": world,
        "not_offered": NOT_OFFERED,
        "not_scaled_down": NOT_SCALED_DOWN,
    }


def scaled_down_launch(*, plan, user, steps: int, name: str, options: dict):
    """A stored (scaled-down) plan as a job on this machine's CPU ranks, profiled unless the options say
    otherwise, with the run options a person set: the job request's own checks (``JobCreateSerializer``), so a
    bad value is the same field's 400 as from ``POST /api/jobs/``. The keys the plan fixes, and the node count
    and device (one node of CPU ranks), are refused by name."""
    fixed = {**NOT_OFFERED, **dict.fromkeys(NOT_SCALED_DOWN, "one node of this machine's CPU ranks")}
    if refused := sorted(set(options) & set(fixed)):
        raise ValidationError(
            {key: [f"not an option of a scaled-down launch: it takes {fixed[key]}"] for key in refused}
        )
    request = {
        "profile_every": 5,
        **options,
        "name": name,
        "plan_id": plan.pk,
        "steps": steps,
        "device": "cpu",
    }
    data = JobCreateSerializer(data=request)
    data.is_valid(raise_exception=True)
    return job_submit(user=user, team=plan.team, **data.validated_data)
