"""How the planner reads a contract document: :class:`SpecError`, the upper bound of every numeric field
(:data:`MAXIMA`, each with its source), the rules a name obeys, and :class:`DocumentChecker`, which every
``from_dict`` parser uses to collect all the problems of one document into one error."""

from __future__ import annotations

import dataclasses
import math
from typing import Any


class SpecError(ValueError):
    """An input document breaks the contract.

    ``errors`` maps a dotted field path (``"moe.top_k"``, ``"strategy.tp"``) to the list of messages
    about it; ``field`` is the first such path. ``str(exc)`` names every field and rule.
    """

    def __init__(self, field: str | dict[str, list[str]], message: str | None = None):
        if isinstance(field, dict):
            errors = {k: list(v) for k, v in field.items() if v}
        else:
            errors = {field: [message or "is invalid"]}
        self.errors: dict[str, list[str]] = errors
        self.field: str = next(iter(errors), "")
        super().__init__("; ".join(f"{k}: {m}" for k, msgs in errors.items() for m in msgs))

    def prefixed(self, prefix: str) -> SpecError:
        """The same errors with ``prefix.`` in front of each field path."""
        return SpecError({f"{prefix}.{k}": v for k, v in self.errors.items()})


# what each parser's document is called in an unknown-field message
DOCUMENT_NAMES = {
    "model": "model.json",
    "moe": "model.json's moe",
    "architecture": "model.json's architecture",
    "cluster": "cluster.json",
    "device": "cluster.json's device",
    "link": "a cluster.json link (intra_node, inter_node)",
    "tier": "a cluster.json tier",
    "training": "training.json",
    "strategy": "strategy.json",
}


# Upper bounds of every numeric field: what the physical world has, with room to grow (each one 8-100x the
# largest published value), so that a typo or a hostile 1e300 is an error naming the field instead of a
# stored document that makes a page 150 MB or a search run for hours.
MAXIMA: dict[str, float] = {
    # model.json; largest published: 128 layers and hidden 25,600 (Megatron-LM 1T, Narayanan et al. 2021
    # Table 1), 128 heads, FFN 4x hidden, vocabulary 256k (Gemma, Gemma Team 2024), context 10M tokens
    # (Llama 4 Scout, Meta 2025), 256 routed experts of top-8 (DeepSeek-V3, 2024), 2,048 experts (Switch)
    "num_layers": 4096,
    "hidden_size": 262_144,
    "num_attention_heads": 4096,
    "num_kv_heads": 4096,
    "ffn_hidden_size": 1_048_576,
    "expert_ffn_hidden_size": 1_048_576,
    "vocab_size": 16_777_216,
    "seq_length": 134_217_728,
    "num_experts": 65_536,
    "top_k": 1024,
    "num_shared_experts": 1024,
    "first_dense_layers": 4096,
    "layer_frequency": 4096,
    "capacity_factor": 1024.0,
    "load_imbalance": 1024.0,
    # cluster.json; largest published: ~25k nodes (xAI Colossus, 200k GPUs), 16 accelerators per node
    # (HGX-2), 288 GB HBM (B300), 1,800 GB/s NVLink 5, 20 PFLOP/s FP4 (B200), 1,200 W TDP (B300)
    "num_nodes": 1_048_576,
    "devices_per_node": 1024,
    "nodes": 1_048_576,
    "memory_GiB": 65_536.0,
    "memory_bandwidth_GBps": 1_000_000.0,
    "peak_tflops": 10_000_000.0,
    "tdp_watts": 100_000.0,
    "bandwidth_GBps": 1_000_000.0,
    "latency_us": 10_000_000.0,
    "oversubscription": 1024.0,
    # training.json / strategy.json: 1.2 B sequences in one step is 1000x any published global batch
    "global_batch_size": 1 << 30,
    "micro_batch_size": 1 << 20,
    "tp": 1 << 20,
    "pp": 1 << 20,
    "dp": 1 << 20,
    "ep": 1 << 20,
    "cp": 1 << 20,
    "vpp": 1 << 20,
}
MAX_NAME_CHARS = 200
# characters a name may not hold: control characters (NUL, newlines, ...) and bidirectional overrides that
# make a name display as something else (U+202A-U+202E, U+2066-U+2069, "Trojan Source", CVE-2021-42574)
_BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f")


def name_problem(value: str) -> str:
    """Why ``value`` cannot be a name ("" when it can)."""
    import unicodedata

    if len(value) > MAX_NAME_CHARS:
        return f"must be at most {MAX_NAME_CHARS} characters, got {len(value)}"
    if any(unicodedata.category(c) == "Cs" for c in value):
        return "must not contain a lone UTF-16 surrogate (an escape like \\ud800 without its pair): it is not text"
    bad = sorted({c for c in value if unicodedata.category(c) == "Cc" or c in _BIDI_CONTROLS})
    if bad:
        return (
            "must not contain control or bidirectional-override characters ("
            + ", ".join(f"U+{ord(c):04X}" for c in bad)
            + ")"
        )
    return ""


class DocumentChecker:
    """Collects every problem in one document so that one error names all of them.

    It remembers the fields a parser reads (every accessor, plus :meth:`get` for a value read as is);
    :meth:`done` rejects the keys no one read, so a typo (``tpp``, ``num_layer``) is an error naming the
    key instead of a field silently left at its default."""

    def __init__(self, data: Any, doc: str):
        if not isinstance(data, dict):
            raise SpecError(doc, f"must be a JSON object, got {type(data).__name__}")
        self.data = data
        self.doc = doc
        self.read: dict[str, None] = {}  # in reading order: the "known" list of the error message
        self.errors: dict[str, list[str]] = {}

    def fail(self, name: str, message: str) -> None:
        self.errors.setdefault(name, []).append(message)

    def get(self, name: str, default: Any = None) -> Any:
        """``data.get(name, default)``, for a value the parser checks itself."""
        self.read[name] = None
        return self.data.get(name, default)

    def raw(self, name: str, default: Any = dataclasses.MISSING) -> Any:
        self.read[name] = None
        if name not in self.data or self.data[name] is None:
            if default is dataclasses.MISSING:
                self.fail(name, "is required")
            return None if default is dataclasses.MISSING else default
        return self.data[name]

    def integer(self, name: str, minimum: int = 1, default: Any = dataclasses.MISSING) -> int | None:
        value = self.raw(name, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
            self.fail(name, f"must be an integer, got {value!r}")
            return None
        if value < minimum:
            self.fail(name, f"must be >= {minimum}, got {value}")
            return None
        if value > (top := MAXIMA.get(name, 1 << 62)):
            self.fail(name, f"must be <= {top:,.0f} (more than any real system has), got {value:.4g}")
            return None
        return int(value)

    def number(
        self, name: str, minimum: float = 0.0, default: Any = dataclasses.MISSING, strict: bool = True
    ) -> float | None:
        value = self.raw(name, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(name, f"must be a number, got {value!r}")
            return None
        if not math.isfinite(value):
            self.fail(name, f"must be a finite number, got {value!r}")
            return None
        if (value <= minimum) if strict else (value < minimum):
            self.fail(name, f"must be {'>' if strict else '>='} {minimum}, got {value}")
            return None
        if value > (top := MAXIMA.get(name, 1e15)):
            self.fail(name, f"must be <= {top:,.0f} (more than any real system has), got {value:.4g}")
            return None
        return float(value)

    def choice(self, name: str, choices: tuple[str, ...], default: Any = dataclasses.MISSING) -> str | None:
        value = self.raw(name, default)
        if value is None:
            return None
        if value not in choices:
            self.fail(name, f"must be one of {', '.join(choices)}, got {value!r}")
            return None
        return value

    def boolean(self, name: str, default: Any = dataclasses.MISSING) -> bool | None:
        value = self.raw(name, default)
        if value is None:
            return None
        if not isinstance(value, bool):
            self.fail(name, f"must be true or false, got {value!r}")
            return None
        return value

    def text(self, name: str, default: Any = dataclasses.MISSING) -> str | None:
        value = self.raw(name, default)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            self.fail(
                name, f"must be a non-empty string, got {value[:80] if isinstance(value, str) else value!r}"
            )
            return None
        if problem := name_problem(value):
            self.fail(name, problem)
            return None
        return value

    def nested(self, name: str, parse, default: Any = dataclasses.MISSING):
        value = self.raw(name, default)
        if value is None:
            return None
        try:
            return parse(value)
        except SpecError as exc:
            for k, msgs in exc.prefixed(name).errors.items():
                for m in msgs:
                    self.fail(k, m)
            return None

    def done(self) -> None:
        known = ", ".join(self.read)
        for key in self.data:
            if key not in self.read:
                self.fail(
                    str(key), f"is not a field of {DOCUMENT_NAMES.get(self.doc, self.doc)} (known: {known})"
                )
        if self.errors:
            raise SpecError(self.errors)


def fields_as_dict(obj) -> dict[str, Any]:
    return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}


def _plain(value):
    if dataclasses.is_dataclass(value):
        return value.to_dict()
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
