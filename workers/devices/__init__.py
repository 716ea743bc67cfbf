"""The ground floor of the engines: which accelerator this process drives and how to reach its counters.

- :mod:`~workers.devices.backend`  picks ``npu|cuda|cpu`` and the matching process-group backend (HCCL, NCCL,
  gloo), loads ``torch_npu`` only where asked, and says why a kind is unavailable
- :mod:`~workers.devices.nvml`     NVML (``nvidia-ml-py``): a session (init/shutdown), devices by
  ``CUDA_VISIBLE_DEVICES``, energy, power, power limits, temperature
- :mod:`~workers.devices.npu_smi`  ``npu-smi``: runs one query under a timeout and parses its tables
  (``info``, ``info -m``, ``-t power|health|temp|ecc``)
- :mod:`~workers.devices.rapl`     the powercap RAPL counters: package and DRAM zones, wrap-around

The meters (``workers.green.power``), the power-cap advisor (``workers.green.powercap``) and the telemetry
collectors (``workers.reliability.telemetry``) read devices only through these adapters.

Nothing here imports another engine; every engine may import it.
"""
