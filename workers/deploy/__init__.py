"""Beyond one machine: render a plan as a job for a cluster scheduler; submit, follow and cancel it.

- :mod:`~workers.deploy.render` a plan + its model, cluster and training documents -> a Kubeflow Training
  Operator ``PyTorchJob`` (with its job config in a ``ConfigMap``) or a Slurm batch script; both run
  ``torchrun`` with c10d rendezvous and ``python -m workers.training.run``, as the local launcher does
- :mod:`~workers.deploy.cli`    ``cann-train render`` (prints or writes the files, submits nothing)
- :mod:`~workers.deploy.launchers` the state vocabulary the schedulers are read into, and a control-plane job's
  runtime config as a Deployment (with ``job_id``, ``redis_url``, ``attempt``)
- :mod:`~workers.deploy.slurm`  ``sbatch --parsable`` / ``scontrol show job -o`` / ``scancel``, the output file
- :mod:`~workers.deploy.kubernetes` the official client: create, read the conditions of, delete a PyTorchJob
- ``schemas/``                  the training operator's PyTorchJob CRD, vendored (cut down) for the tests

The control plane launches through :mod:`slurm` / :mod:`kubernetes` when ``CANN_TRAIN_LAUNCHER`` says so
(``controlplane/jobs/services/launchers.py``, ``follow.py``).
"""
