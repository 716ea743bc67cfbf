"""The parallelisms :func:`workers.training.parallelize.parallelize` applies, one concern per module.

- :mod:`.dims`                  ``ParallelDims``: degrees, rank layout, this rank's coordinates, the ``DeviceMesh``
- :mod:`.pipeline`              pipeline split into stages and torch's 1F1B / interleaved 1F1B schedule
- :mod:`.tensor`                tensor + sequence parallel with DTensor ``parallelize_module``
- :mod:`.context`               context parallel: load-balanced sequence chunks, all-gathered K/V
- :mod:`.expert`                expert parallel: experts sharded over ``ep``, all-to-all token dispatch
- :mod:`.activation_checkpoint` full / selective activation recomputation
- :mod:`.data_parallel`         DDP (with comm hooks and bucket size), FSDP2 (ZeRO 1-3), FSDP2 ``replicate``

Every public name is importable from :mod:`workers.training.parallelize` too.
"""
