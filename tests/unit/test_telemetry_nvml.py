"""NVML collector: the decoding helpers against nvidia-ml-py's own constants and structs, the collector
reporting NVML as absent without a driver, and real readings where a GPU is present."""

from __future__ import annotations

import re

import pynvml
import pytest

from workers.reliability.telemetry import split_metric
from workers.reliability.telemetry.nvml import (
    CLOCK_EVENT_REASONS,
    METRICS,
    NVLINK_FIELDS,
    NvmlCollector,
    decode_clock_event_reasons,
    describe_xid,
    field_value,
)


def nvml_gpus() -> int:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return 0
    try:
        return pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()


needs_gpu = pytest.mark.skipif(nvml_gpus() == 0, reason="no NVIDIA driver or GPU here")


def test_the_reason_table_is_nvmls_bit_for_bit():
    for bit, name in CLOCK_EVENT_REASONS:
        camel = "".join(part.capitalize() for part in name.split("_"))
        constant = getattr(pynvml, f"nvmlClocksEventReason{camel}", None)
        if constant is None:  # older nvidia-ml-py: the throttle names, same values
            constant = getattr(pynvml, f"nvmlClocksThrottleReason{camel}")
        assert constant == bit, name


def test_a_throttle_bitmask_decodes_to_reason_names():
    assert decode_clock_event_reasons(0) == []
    sw_power = pynvml.nvmlClocksThrottleReasonSwPowerCap
    sw_thermal = pynvml.nvmlClocksThrottleReasonSwThermalSlowdown
    assert decode_clock_event_reasons(sw_power | sw_thermal) == ["sw_power_cap", "sw_thermal_slowdown"]
    assert decode_clock_event_reasons(pynvml.nvmlClocksThrottleReasonGpuIdle) == ["gpu_idle"]
    every = 0
    for bit, _ in CLOCK_EVENT_REASONS:
        every |= bit
    assert len(decode_clock_event_reasons(every)) == len(CLOCK_EVENT_REASONS)
    # bits NVML documents for other products, or future ones, are named by value, not dropped
    assert decode_clock_event_reasons(0x800 | 0x1) == ["gpu_idle", "unknown_0x800"]
    with pytest.raises(ValueError, match="never negative"):
        decode_clock_event_reasons(-1)


def test_field_values_decode_by_their_value_type():
    cases = [
        (pynvml.NVML_VALUE_TYPE_DOUBLE, "dVal", 41.5),
        (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal", 7),
        (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, "ullVal", 2**40 + 3),
        (pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG, "sllVal", -12),
        (pynvml.NVML_VALUE_TYPE_SIGNED_INT, "siVal", -3),
    ]
    for kind, attr, number in cases:
        fv = pynvml.c_nvmlFieldValue_t()
        fv.valueType = kind
        setattr(fv.value, attr, number)
        assert field_value(fv, pynvml) == number
    fv = pynvml.c_nvmlFieldValue_t()
    fv.valueType = 99
    with pytest.raises(ValueError, match="unknown value type"):
        field_value(fv, pynvml)


def test_the_nvlink_fields_exist_in_nvml():
    for constant in NVLINK_FIELDS:
        assert isinstance(getattr(pynvml, constant), int)
    assert describe_xid(79) == "GPU has fallen off the bus"
    assert "catalog" in describe_xid(1)


@pytest.mark.skipif(nvml_gpus() > 0, reason="this machine has an NVIDIA GPU")
def test_without_a_driver_nvml_is_absent_with_the_reason():
    collector = NvmlCollector()
    ok, why = collector.available()
    assert not ok
    assert "NVML" in why and len(why) > 20
    collector.close()


@needs_gpu
def test_every_gpu_metric_is_read_or_absent_with_a_reason():
    collector = NvmlCollector()
    try:
        ok, how = collector.available()
        assert ok, how
        r = collector.sample()
    finally:
        collector.close()
    templates = {re.sub(r"\{gpu\}", "{}", m) for m in METRICS}
    for gpu in collector.gpus:
        i = gpu["index"]
        for template in templates:
            name = template.replace("{}", str(i))
            assert (name in r.values) != (name in r.absent), name
            if name in r.absent:
                assert r.absent[name]
        assert 0 < r.values[f"gpu.{i}.temp_C"] < 120
        assert r.values[f"gpu.{i}.power_W"] > 0
        assert r.values[f"gpu.{i}.sm_clock_MHz"] > 0
        assert isinstance(r.info[f"gpu.{i}.clocks_event_reasons"], list)
    for name in r.values:
        scope, device, metric = split_metric(name)
        assert scope == "gpu" and device.isdigit() and f"gpu.{{gpu}}.{metric}" in METRICS
