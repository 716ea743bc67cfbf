"""The ground floor of the engines: which accelerator this process drives and how to reach its counters.

- :mod:`~workers.devices.backend`  picks ``npu|cuda|cpu`` and the matching process-group backend (HCCL, NCCL,
  gloo), loads ``torch_npu`` only where asked, and says why a kind is unavailable

Nothing here imports another engine; every engine may import it.
"""
