"""One options table (workers/training/options.py) makes the job config's fields, the job API's fields and the
CLIs' flags: an option added to a copy of the table appears in all three, with its type, bounds, default and
help, and the real table's API options are exactly what the job API documents."""

from __future__ import annotations

import argparse
from dataclasses import fields

import pytest

from workers.training.config import ConfigError, JobConfig, job_config_class
from workers.training.examples import example
from workers.training.options import (
    OPTIONS,
    Option,
    add_option_flags,
    api_options,
    options_from_args,
    with_option,
)

NEW = Option(
    "frobnicate_every",
    int,
    7,
    "frobnicate the gradients every N steps (a test's option)",
    section="comm",
    minimum=1,
    maximum=50,
    api=True,
    cli=True,
)
TABLE = with_option(OPTIONS, NEW)
TINY = {"model": example("tiny-dense.json"), "strategy": {"dp": 1}, "training": {"global_batch_size": 2}}


def test_an_option_added_to_the_table_is_a_field_of_the_job_config_with_its_bounds():
    cls = job_config_class(TABLE, name="FrobConfig")
    field = next(f for f in fields(cls) if f.name == "frobnicate_every")
    assert field.default == 7 and field.metadata["option"].help.startswith("frobnicate")
    assert cls.from_dict(dict(TINY)).frobnicate_every == 7  # the default
    cfg = cls.from_dict({**TINY, "frobnicate_every": 3})
    assert cfg.frobnicate_every == 3 and cfg.to_dict()["frobnicate_every"] == 3  # the flat JSON
    with pytest.raises(ConfigError, match="must be <= 50, got 99") as err:
        cls.from_dict({**TINY, "frobnicate_every": 99})
    assert err.value.field == "frobnicate_every"
    with pytest.raises(ConfigError, match="must be an integer"):
        cls.from_dict({**TINY, "frobnicate_every": "often"})
    # the real job config does not know it: an unknown key is an error naming it
    with pytest.raises(ConfigError, match="is not a field of the job config"):
        JobConfig.from_dict({**TINY, "frobnicate_every": 3})


def test_an_option_added_to_the_table_is_a_flag_with_its_help_and_bounds(capsys):
    parser = argparse.ArgumentParser(prog="t")
    add_option_flags(parser, ["frobnicate_every", "lr"], table=TABLE)
    assert options_from_args(parser.parse_args(["--frobnicate-every", "4"]), table=TABLE) == {
        "frobnicate_every": 4
    }
    assert "frobnicate the gradients every N steps" in parser.format_help()
    with pytest.raises(SystemExit):
        parser.parse_args(["--frobnicate-every", "0"])
    assert "--frobnicate-every: must be >= 1, got 0" in capsys.readouterr().err


def test_an_option_added_to_the_table_is_a_field_of_the_job_api():
    from rest_framework import serializers

    from controlplane.jobs.apis import JobCreateSerializer
    from controlplane.jobs.options import option_fields

    made = option_fields(TABLE)
    field = made["frobnicate_every"]
    assert isinstance(field, serializers.IntegerField) and not field.required
    assert (field.min_value, field.max_value) == (1, 50) and field.help_text.startswith("frobnicate")

    class FrobJobSerializer(JobCreateSerializer):
        OPTIONS_TABLE = TABLE

    assert "frobnicate_every" in FrobJobSerializer().fields
    assert "frobnicate_every" not in JobCreateSerializer().fields
    bad = FrobJobSerializer(data={"name": "x", "frobnicate_every": 0})
    assert not bad.is_valid() and "frobnicate_every" in bad.errors


def test_the_job_api_offers_exactly_the_tables_api_options_with_their_help():
    from controlplane.jobs.apis import JobCreateSerializer

    names = {o.name for o in OPTIONS}
    api = {n: f for n, f in JobCreateSerializer().fields.items() if n in names}
    assert set(api) == {o.name for o in api_options()}
    for option in api_options():
        assert api[option.name].help_text == option.help
    # what is the control plane's to choose is not a request's to set
    assert not {"snapshot_dir", "job_id", "redis_url", "start_step"} & set(JobCreateSerializer().fields)


def test_every_cli_flag_of_the_table_has_the_tables_help():
    parser = argparse.ArgumentParser(prog="t")
    add_option_flags(parser)
    text = " ".join(parser.format_help().split())
    for option in OPTIONS:
        if option.cli:
            assert option.flag in text and " ".join(option.help.split())[:40] in text
