"""Power meters: the energy a training job draws, per component (``device``, ``cpu``, ``memory``), from the
best source present, and a labelled estimate only where no meter exists.

Best source first, each used where present and otherwise reported as absent with the reason:

- **NVML** (``nvidia-ml-py``, ``pynvml``) for CUDA devices: the board's total-energy counter
  (``nvmlDeviceGetTotalEnergyConsumption``, mJ since the driver loaded, Volta and newer), else power
  samples (``nvmlDeviceGetPowerUsage``, mW, board and memory) integrated on a background thread.
- **npu-smi** for Ascend NPUs: ``npu-smi info -t power -i <npu id> [-c <chip id>]`` sampled on a background
  thread and integrated (:func:`parse_npu_smi_power` documents the format).
- **RAPL** (``/sys/class/powercap/intel-rapl:*``, Intel, and AMD since Linux 5.8): the package counters
  give ``cpu``, a ``dram`` zone gives ``memory``; counters wrap at ``max_energy_range_uj``.
- **estimate**, CodeCarbon-style (``data/power_defaults.json`` holds every figure with its source):
  ``cpu`` = TDP x the CPU time of the job's process tree / logical CPUs (CodeCarbon's process mode);
  ``memory`` = 3 W per 8 GiB of the tree's resident memory (CodeCarbon v2); ``device`` = the device's
  ``tdp_watts`` x utilisation. :meth:`PowerMeter.describe` labels every estimated component as one.

``meter = select_meter("cuda", [0, 1], tdp_watts=700)``; ``meter.read()`` returns the cumulative joules per
component since the meter started (cheap: call it every step); ``meter.describe()`` says which source
feeds each component, whether it is measured, and what was tried and why it was not used.

The rooms: :mod:`~.readings` (what a meter reads), :mod:`~.sources` (what a source is), :mod:`~.measured`
(NVML, npu-smi and RAPL sources, on the adapters of :mod:`workers.devices`), :mod:`~.estimates` (the
labelled CodeCarbon-style estimates), :mod:`~.meter` (choosing and reading the sources).

Scope: NVML and npu-smi measure whole boards; RAPL measures whole CPU packages and DRAM (every process on
the machine); the estimates cover the job's process tree. A node's meter should run in one process per node
(local rank 0) over that node's devices; :func:`sum_readings` adds the nodes' readings up.
"""

from workers.devices.npu_smi import (
    NPU_POWER_LABELS,
    NPU_RATED_LABEL,
    NpuPower,
    parse_npu_smi_mapping,
    parse_npu_smi_power,
)
from workers.devices.rapl import RAPL_ROOT
from workers.green.power.estimates import (
    CODECARBON_CPU_TABLE,
    DEFAULTS_PATH,
    ESTIMATE_LABEL,
    MEMORY_WATTS_PER_GIB,
    UNKNOWN_CPU_TDP_WATTS,
    CpuEstimate,
    DeviceEstimate,
    MemoryEstimate,
    ProcessTree,
    codecarbon_cpu_tdp,
    cpu_model_name,
    load_defaults,
)
from workers.green.power.measured import NpuSmiPower, NvmlEnergy, RaplEnergy
from workers.green.power.meter import PowerMeter, select_meter
from workers.green.power.readings import COMPONENTS, DEVICE_KINDS, METHODS, PowerReading, sum_readings
from workers.green.power.sources import SourceUnavailable

__all__ = [
    "CODECARBON_CPU_TABLE",
    "COMPONENTS",
    "DEFAULTS_PATH",
    "DEVICE_KINDS",
    "ESTIMATE_LABEL",
    "MEMORY_WATTS_PER_GIB",
    "METHODS",
    "NPU_POWER_LABELS",
    "NPU_RATED_LABEL",
    "RAPL_ROOT",
    "UNKNOWN_CPU_TDP_WATTS",
    "CpuEstimate",
    "DeviceEstimate",
    "MemoryEstimate",
    "NpuPower",
    "NpuSmiPower",
    "NvmlEnergy",
    "PowerMeter",
    "PowerReading",
    "ProcessTree",
    "RaplEnergy",
    "SourceUnavailable",
    "codecarbon_cpu_tdp",
    "cpu_model_name",
    "load_defaults",
    "parse_npu_smi_mapping",
    "parse_npu_smi_power",
    "select_meter",
    "sum_readings",
]
