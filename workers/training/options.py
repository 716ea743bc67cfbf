"""The run options: one table (name, type, bounds, default, help, section) from which the job's config
(:class:`workers.training.config.JobConfig`), the job API's fields (``controlplane.jobs.options``) and every
CLI's flags (:func:`add_option_flags`) are made. A new option is one line here; its help never drifts.

The model, strategy and training documents are not options: they are the public contracts, parsed by the
planner's own parsers (``workers.training.config``). What is here is the runtime's own knobs, in the flat
JSON the job config has always been (``{"model": ..., "snapshot_every": 5, ...}``); ``section`` groups them
for people (a CLI's ``--help``, the docs), not for the JSON.

``api``: a run option a job request (``POST /api/jobs/``) may set; the others are the control plane's to
choose (``snapshot_dir``, ``job_id``, ``redis_url``: where a job writes is never the user's to say) or the
runtime's (``start_step``: a resume point). ``cli``: a flag of ``cann-train train`` (``--snapshot-every``).
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

SECTIONS = ("run", "model", "optimizer", "data", "comm", "checkpoint", "fault tolerance", "energy", "metrics")
SNAPSHOT_DELTAS = ("xor", "log")
RISK_POLICIES = ("act", "observe")
COMM_ORDERS = ("reverse", "priority", "magnitude")
DEVICES = ("auto", "cpu", "cuda", "npu")
MAX_STEPS = (
    1_000_000  # a job's optimizer steps (the job API's bound); a CPU job is bounded lower, per machine
)
MAX_EVERY = 100_000  # "every N steps" options: ~1 day at the 1 s steps of a CPU job
# a seed: numpy's range (2^32 - 1); the data order seeds a 64-bit generator with seed * 1_000_003 + epoch, which
# a seed of 2^70 overflowed at run time
MAX_SEED = 2**32 - 1


class OptionError(ValueError):
    """A value an option does not take; ``name`` is the option, the message says why (and what it got)."""

    def __init__(self, name: str, message: str):
        super().__init__(message)
        self.name, self.message = name, message


def _problem_of_comm_hook(spec: str) -> str | None:
    """``name[:key=value,...]`` with a known name (the hook itself checks the option names when built)."""
    from workers.training.comm_methods import HOOK_NAMES

    name, _, rest = spec.partition(":")
    if name.strip() not in HOOK_NAMES:
        return f"unknown hook {name.strip()!r}; choose from {', '.join(HOOK_NAMES)}"
    for item in filter(None, (part.strip() for part in rest.split(","))):
        if "=" not in item:
            return f"option {item!r} is not key=value"
    return None


def _problem_of_faults(text: str) -> str | None:
    from workers.training.supervision.fault_plan import parse_faults

    try:
        parse_faults(text)
    except ValueError as exc:
        return str(exc)
    return None


def _problems_of_energy(settings: Any) -> list[str]:
    from workers.green.job import check_energy_settings  # psutil and the meters: only when energy is given

    return check_energy_settings(settings)


def _problem_of_snapshot_name(name: str) -> str | None:
    if not re.fullmatch(r"step-\d{8}", name):
        return f"must be a snapshot name like step-00000020, got {name!r}"
    return None


def _problem_of_job_id(job_id: str) -> str | None:
    return None if job_id.isdigit() else f"must be a number (stream job/<id>), got {job_id!r}"


@dataclass(frozen=True)
class Option:
    """One run option. ``kind`` is its JSON type (``int``, ``float``, ``str``, ``bool``, ``dict``); ``minimum`` /
    ``maximum`` bound a number (inclusive); ``nullable``: ``null`` is a value (the runtime then chooses);
    ``check(value)`` -> a problem, or a list of them, beyond the type and bounds."""

    name: str
    kind: type
    default: Any
    help: str
    section: str = "run"
    minimum: float | None = None
    maximum: float | None = None
    above: float | None = None
    """An exclusive lower bound (``bucket_cap_mb`` > 0)."""
    choices: tuple[str, ...] | None = None
    nullable: bool = False
    max_length: int | None = None
    check: Callable[[Any], str | list[str] | None] | None = None
    type_error: str | None = None
    """The message for a value of the wrong type (default: ``must be an integer`` and its kin)."""
    api: bool = False
    api_default: Any = ...
    """The job API's default where it differs on purpose (a request's ``steps``: 20, a CLI run's: 10)."""
    cli: bool = False
    metavar: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def problems(self, value: Any) -> list[str]:
        """Everything wrong with ``value`` for this option ([] when it is fine)."""
        if value is None:
            return [] if self.nullable else ["may not be null"]
        kind = self.kind
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if kind is bool and not isinstance(value, bool):
            return [self.type_error or f"must be true or false, got {value!r}"]
        if kind is int and not (number and math.isfinite(value) and int(value) == value):
            return [self.type_error or f"must be an integer, got {value!r}"]
        if kind is float and not (number and math.isfinite(value)):
            return [self.type_error or f"must be a number, got {value!r}"]
        if kind is str and not isinstance(value, str):
            return [self.type_error or f"must be a string, got {value!r}"]
        if kind is dict and not isinstance(value, dict):
            return [self.type_error or f"must be a JSON object, got {value!r}"]
        if number and kind in (int, float):
            if self.above is not None and value <= self.above:
                return [f"must be > {self.above:g}, got {value:g}"]
            if self.minimum is not None and value < self.minimum:
                return [f"must be >= {self.minimum:g}, got {value:g}"]
            if self.maximum is not None and value > self.maximum:
                return [f"must be <= {self.maximum:g}, got {value:g}"]
        if self.choices is not None and value not in self.choices:
            return [f"must be one of {', '.join(self.choices)}, got {value!r}"]
        if self.max_length is not None and len(value) > self.max_length:
            return [f"at most {self.max_length} characters, got {len(value)}"]
        if self.check is not None:
            found = self.check(value)
            return [found] if isinstance(found, str) else list(found or [])
        return []

    def parse(self, value: Any) -> Any:
        """``value`` as this option holds it (an int as ``int``, a float as ``float``); OptionError if bad."""
        if problems := self.problems(value):
            raise OptionError(self.name, "; ".join(problems))
        if value is not None and self.kind in (int, float):
            return self.kind(value)
        return value


def _opt(name, kind, default, help, **kw) -> Option:  # noqa: A002 - the table reads as the CLIs' help does
    return Option(name, kind, default, help, **kw)


OPTIONS: tuple[Option, ...] = (
    # --- run
    _opt("steps", int, 10, "optimizer steps to run (counted from start_step on resume)", minimum=1, maximum=MAX_STEPS, api=True, api_default=20, cli=True),
    _opt("device", str, "auto", "auto|cpu|cuda|npu (CANN_TRAIN_DEVICE overrides auto)", choices=DEVICES, api=True, api_default="auto"),
    _opt("seed", int, 0, "seeds parameter init (identical on every rank) and the data order", minimum=0, maximum=MAX_SEED, api=True, cli=True),
    _opt("start_step", int, 0, "resume point: optimizer steps already taken (the data position follows from it)", minimum=0),
    _opt("job_id", str, None, "publishes events to Redis stream job/<job_id> (with redis_url); none: no publishing", nullable=True, check=_problem_of_job_id),
    _opt("redis_url", str, None, "the Redis the events go to", nullable=True),
    _opt("publish", bool, True, "with a job id and redis url: publish events (the overhead bench turns it off to compare)"),
    # --- optimizer
    _opt("lr", float, 3e-3, "peak learning rate (linear warmup then cosine decay to 10%)", section="optimizer", minimum=0, api=True, cli=True),
    _opt("warmup_steps", int, 2, "linear warmup steps", section="optimizer", minimum=0),
    _opt("weight_decay", float, 0.0, "AdamW weight decay", section="optimizer", minimum=0),
    _opt("grad_clip", float, 1.0, "clip the global gradient norm (0 disables clipping; the norm is reported either way)", section="optimizer", minimum=0),
    _opt("expert_bias_update_rate", float, 1e-3, "auxiliary-loss-free balancing step (DeepSeek-V3, Liu et al. 2024, sec. 2.1.2: gamma)", section="optimizer", minimum=0),
    # --- model
    _opt("hf_model", str, None, "a Hugging Face model directory (config.json, safetensors weights): the run starts from its weights (the model document is its config's: cann-train import-model)", section="model", nullable=True, api=True),
    _opt("save_hf", str, None, "at the end of the run, write the trained model here as a Hugging Face directory (config.json, safetensors, the tokenizer's files) that transformers loads", section="model", nullable=True),
    # --- data
    _opt("tokenizer", str, None, "a tokenizer.json (or the directory holding it; default: hf_model's own): text, JSONL and Parquet data are tokenized with it, once, into cached shards beside the data", section="data", nullable=True, api=True),
    _opt("data_field", str, "text", "the field of each JSONL record or Parquet row that holds the document's text", section="data", max_length=200, api=True),
    _opt("val_fraction", float, 0.0, "documents held out for a validation loss (the last ones of the corpus; 0: none)", section="data", minimum=0, maximum=0.5, api=True),
    _opt("val_every", int, 0, "a validation loss every N steps and at the end (0: only at the end, when there is a validation split)", section="data", minimum=0, maximum=MAX_EVERY, api=True),
    _opt("data", str, None, "token source: none = this interpreter's standard-library sources as bytes; else a file or a directory of files (raw bytes are byte tokens, .npy holds token ids)", section="data", nullable=True, api=True),
    # --- comm
    _opt("comm_hook", str, None, "DDP communication hook, name[:key=value,...] from workers.training.comm.HOOKS (zero_stage 0 only), e.g. topk_ef:density=0.01; registered on the data-parallel group", section="comm", nullable=True, max_length=500, check=_problem_of_comm_hook, api=True, cli=True),
    _opt("bucket_cap_mb", float, None, "DDP gradient bucket size in MB; none: chosen from inter_node_GBps/inter_node_latency_us (choose_bucket_cap_mb) when given, else DDP's default (25 MB)", section="comm", above=0, maximum=4096, nullable=True, api=True),
    _opt("comm_order", str, "reverse", "the order data-parallel gradients go on the wire: reverse (DDP's: the last layers first, the step waits for all), priority (the first layers first, each updated as soon as its gradient is in: ByteScheduler, Peng et al. SOSP'19; P3, Jayarajan et al. SysML'19) or magnitude (the largest-norm partitions first); not reverse: data parallelism only, grad_clip 0, no comm_hook, no snapshots (workers.training.comm.priority)", section="comm", choices=COMM_ORDERS),
    _opt("inter_node_GBps", float, None, "the job's inter-node bandwidth, GB/s per device per direction (cluster.json units); sizes buckets", section="comm", above=0, nullable=True),
    _opt("inter_node_latency_us", float, 0.0, "the job's inter-node latency in microseconds; sizes buckets", section="comm", minimum=0),
    # --- checkpoint
    _opt("snapshot_every", int, 0, "snapshot the training state every N steps into snapshot_dir (0: never); asynchronous, the loop waits only for a copy to CPU memory; a job that snapshots recovers from faults and resumes when relaunched", section="checkpoint", minimum=0, maximum=MAX_EVERY, api=True, cli=True),
    _opt("snapshot_dir", str, None, "the run's snapshot directory, one filesystem seen by every rank", section="checkpoint", nullable=True, type_error="must be a path", cli=True),
    _opt("snapshot_full_every", int, 4, "a full snapshot every M snapshots, lossless deltas in between (1: all full)", section="checkpoint", minimum=1, maximum=1000, api=True, cli=True),
    _opt("snapshot_delta", str, "xor", "between full snapshots: xor (the state XORed with the last full one; any snapshot_every) or log (the gradients the optimizer consumed, replayed on restore: ~3x smaller, for snapshot_every 1-3)", section="checkpoint", choices=SNAPSHOT_DELTAS, api=True, cli=True),
    _opt("snapshot_keep", int, 3, "snapshots kept (retention), plus the full snapshot each kept delta needs", section="checkpoint", minimum=1, maximum=1000, api=True, cli=True),
    _opt("snapshot_memory_every", int, 0, "also keep each rank's newest state in its node's RAM every N steps (0: never): a restarted rank reloads it without reading disk", section="checkpoint", minimum=0, maximum=MAX_EVERY, api=True, cli=True),
    _opt("resume", bool, False, "continue from the newest good snapshot in snapshot_dir (from start_step if there is none)", section="checkpoint", cli=True),
    _opt("resume_from", str, None, "continue from exactly this snapshot (step-00000020; a restore): it must verify, and newer ones are set aside as <name>.superseded; implies resume", section="checkpoint", nullable=True, check=_problem_of_snapshot_name),
    # --- fault tolerance
    _opt("rescale", bool, False, "accept a world size other than the strategy's (torchrun --nnodes MIN:MAX after a node was lost or came back): the layout for the ranks present is chosen by workers.training.scaling.replan and the state resharded from the newest snapshot", section="fault tolerance"),
    _opt("risk_policy", str, "act", "what the fault-risk loop may do: act (at a risk of 0.85 snapshot now, for a job that snapshots) or observe (report the risk and what it would have done, never act); the ranks ignore it, their supervisor reads it", section="fault tolerance", choices=RISK_POLICIES, api=True),
    _opt("inject", str, None, "faults to inject (tests, benches, demos): kill-rank@step=17,hang-rank@step=40:rank=1,corrupt-snapshot@step=30 (workers.reliability.faults); read by the supervisor that watches the ranks, never by them", section="fault tolerance", nullable=True, max_length=2000, check=_problem_of_faults, type_error="must be a fault list like kill-rank@step=5", api=True),
    # --- energy
    _opt("energy", dict, None, "energy and carbon metering (workers.green.job): {zone (grid zone, e.g. GB, DE, FR), pue, pue_source, tdp_watts, device_name, market_factor_g_per_kwh, market_factor_source, price_per_kwh, currency, price_source, every (steps between samples), enabled}; all optional, the zone defaults to the deployment's", section="energy", nullable=True, check=_problems_of_energy, api=True),
    # --- metrics
    _opt("profile_every", int, 0, "measure compute vs communication with the torch profiler every N steps (0: never)", section="metrics", minimum=0, maximum=MAX_EVERY, api=True, cli=True),
    _opt("peak_tflops", float, None, "per-device peak TFLOP/s (for mfu); unknown on cpu", section="metrics", minimum=0, nullable=True),
)  # fmt: skip


def by_name(table: Iterable[Option] = OPTIONS) -> dict[str, Option]:
    return {o.name: o for o in table}


def api_options(table: Iterable[Option] = OPTIONS) -> list[Option]:
    """The options a job request may set (``POST /api/jobs/``)."""
    return [o for o in table if o.api]


def with_option(table: Iterable[Option], option: Option) -> tuple[Option, ...]:
    """A copy of ``table`` with ``option`` added (or replacing the one of its name)."""
    return (*(o for o in table if o.name != option.name), option)


# ------------------------------------------------------------------------------------------------- CLIs


def add_option_flags(
    parser: Any,
    names: Iterable[str] | None = None,
    *,
    defaults: Mapping[str, Any] | None = None,
    notes: Mapping[str, str] | None = None,
    table: Iterable[Option] = OPTIONS,
) -> None:
    """Add a flag for each option named (all the ``cli`` ones when ``names`` is None), its help and bounds
    from the table; ``defaults`` sets a command's own default (``cann-train elastic`` snapshots every 5
    steps); otherwise a flag left out is None, and the job config's default applies. ``notes`` adds what the
    flag means to this command (``cann-train render --snapshot-dir``: implies resume)."""
    defaults = dict(defaults or {})
    for o in _chosen(table, names):
        default = defaults.get(o.name)
        shown = o.default if default is None else default
        help_text = o.help + ("" if shown is None or shown is False else f" (default {shown})")
        if note := (notes or {}).get(o.name):
            help_text += f"; {note}"
        if o.kind is bool:
            parser.add_argument(
                o.flag, action="store_true", default=bool(default), help=help_text.replace("%", "%%")
            )
            continue
        parser.add_argument(
            o.flag,
            type=_flag_type(o),
            choices=o.choices,
            default=default,
            metavar=o.metavar or (None if o.choices else o.name.upper().rsplit("_", 1)[-1]),
            help=help_text.replace("%", "%%"),  # argparse %-formats help
        )


def _chosen(table: Iterable[Option], names: Iterable[str] | None) -> list[Option]:
    """The options named (in that order), or every ``cli`` one when ``names`` is None."""
    table = tuple(table)
    if names is None:
        return [o for o in table if o.cli]
    index = by_name(table)
    return [index[n] for n in names]


def _flag_type(o: Option) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        value: Any = text
        if o.kind in (int, float):
            try:
                value = o.kind(text)
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"{o.flag}: must be {'an integer' if o.kind is int else 'a number'}, got {text!r}"
                ) from None
        if problems := o.problems(value):
            raise argparse.ArgumentTypeError(f"{o.flag}: {'; '.join(problems)}")
        return value

    convert.__name__ = o.kind.__name__
    return convert


def options_from_args(
    args: argparse.Namespace, names: Iterable[str] | None = None, table: Iterable[Option] = OPTIONS
) -> dict[str, Any]:
    """The options the flags gave (left-out flags are left out: the job config's defaults apply)."""
    out = {}
    for o in _chosen(table, names):
        value = getattr(args, o.name, None)
        if value is None or (o.kind is bool and value is False):
            continue
        out[o.name] = value
    return out


def dataclass_fields(table: Iterable[Option] = OPTIONS) -> list[tuple[str, type, Any]]:
    """``(name, type, field)`` for ``dataclasses.make_dataclass``: each option a field with its default and
    the option itself (help, section, bounds) in the field's metadata."""
    return [
        (o.name, o.kind | None if o.nullable else o.kind, field(default=o.default, metadata={"option": o}))
        for o in table
    ]


__all__ = [
    "OPTIONS",
    "Option",
    "OptionError",
    "SECTIONS",
    "add_option_flags",
    "api_options",
    "by_name",
    "dataclass_fields",
    "options_from_args",
    "with_option",
]
