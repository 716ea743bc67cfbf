"""Failure prediction (pure engine: no Django, no Celery): score each node's risk of failing within a
horizon (default 15 min) from its telemetry, with a sequence model and a baseline side by side.

- :mod:`.simulator`  fault simulator: per-node traces, failure mix from Llama 3's Table 5 (cited), precursor
                     shapes, benign spikes and the failure rate as documented ASSUMPTIONS
- :mod:`.traces`     per-node traces in columns, failures, the ``.npz`` trace file
- :mod:`.features`   per-node features from our telemetry names (NVIDIA and Ascend alike)
- :mod:`.baseline`   rolling z-score per feature, threshold on the largest
- :mod:`.lstm`       a small LSTM over the last K samples (torch; imported only where used)
- :mod:`.evaluate`   event-level precision / recall / F1 / lead time / false alarms per node-day, one
                     function for both models; fitting, reports, ``load_model``
- :mod:`.history`    a cluster's own history: Prometheus text dump + incident CSV
- :mod:`.live`       scoring streamed telemetry samples into ``risk`` event values
- :mod:`.patterns`   the failure-pattern knowledge base: each kind's published rate (cited), precursors
                     (assumed), prevention action; extended with imported incidents

The CLI is ``cann-train faults`` (:mod:`workers.reliability.faults_cli`).
"""
