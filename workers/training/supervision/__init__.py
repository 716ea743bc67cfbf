"""What runs around the ranks on a node, and the file protocol between the ranks and their supervisor.

- :mod:`~workers.training.supervision.supervisor`   starts the node's ranks (torchrun), polls them, stops them
- :mod:`~workers.training.supervision.agent`        torchrun's elastic agent, warm: ranks fork from one import
- :mod:`~workers.training.supervision.progress`     ``rank<r>.json``: pid, restart, phase, committed step
- :mod:`~workers.training.supervision.step_times`   per-rank step times and collective waits (the straggler watch)
- :mod:`~workers.training.supervision.snapshot_now` a supervisor's request for an early snapshot
- :mod:`~workers.training.supervision.fault_plan`   the fault plan's grammar (``JobConfig.inject``)

The watchers that read these files (dead and hung ranks, stragglers, node risk) and the fault injector are
:mod:`workers.reliability`, one floor up; the ranks write, they read.
"""
