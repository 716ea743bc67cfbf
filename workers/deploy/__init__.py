"""Beyond one machine: render a plan as a job for a cluster scheduler, never submit it.

- :mod:`~workers.deploy.render` a plan + its model, cluster and training documents -> a Kubeflow Training
  Operator ``PyTorchJob`` (with its job config in a ``ConfigMap``) or a Slurm batch script; both run
  ``torchrun`` with c10d rendezvous and ``python -m workers.training.run``, as the local launcher does
- :mod:`~workers.deploy.cli`    ``cann-train render``
- ``schemas/``                  the training operator's PyTorchJob CRD, vendored (cut down) for the tests
"""
