"""Training runtime: runs under ``torchrun`` and never imports Django.

Components (each small, each with its own config in :mod:`workers.training.config`):

- :mod:`~workers.training.supervision` the node: torchrun supervisor, warm agent, rank<->supervisor files
- :mod:`~workers.training.calibrate`   measures this machine for the planner (``cann-train calibrate``)
- :mod:`~workers.training.scaling`     the layout for a shrunk or regrown worker set
- :mod:`~workers.training.model`       a plain GPT-style decoder with optional MoE layers
- :mod:`~workers.training.data`        deterministic, rank-sharded, resumable byte-level token stream
- :mod:`~workers.training.parallelize` strategy -> ``DeviceMesh`` -> torch's DDP/FSDP2/TP/PP/EP/AC
- :mod:`~workers.training.metrics`     per-step figures, published off the training thread
- :mod:`~workers.training.trainer`     the loop
- :mod:`~workers.training.run`         the ``torchrun`` entry point (``python -m workers.training.run``)
- :mod:`~workers.training.launch`      renders the ``torchrun`` command line
- :mod:`~workers.training.cli`         ``cann-train train``
"""
