"""Training snapshots: asynchronous, incremental, compressed, verified, reshardable.

- :mod:`.manager`  :class:`SnapshotManager` -- what the trainer calls: ``save`` (stage, write in the
  background), ``latest_good``, ``load``.
- :mod:`.storage`  the on-disk format (DCP ``StorageWriter``/``StorageReader``), manifest, verification,
  retention, the newest good snapshot.
- :mod:`.codec`    byte-shuffled zstd frames; XOR deltas against the base.
- :mod:`.gradlog`  log snapshots: the gradients each optimizer step consumed, replayed on the base.
- :mod:`.state`    RNG streams, comm-hook state, pipeline-stage views, per-rank key names.

Pure engine: plain Python, torch, numpy and zstandard (no Django, no Celery). docs/elastic.md has the
format, the measurements behind the choices, and how a recovery layer uses it.
"""

from workers.training.checkpoint.manager import SnapshotManager, SnapshotRecord
from workers.training.checkpoint.storage import (
    CorruptSnapshot,
    Skipped,
    SnapshotInfo,
    find_latest_good,
    list_snapshots,
    read_manifest,
    snapshot_name,
    verify,
)

__all__ = [
    "CorruptSnapshot",
    "SnapshotInfo",
    "SnapshotManager",
    "SnapshotRecord",
    "Skipped",
    "find_latest_good",
    "list_snapshots",
    "read_manifest",
    "snapshot_name",
    "verify",
]
