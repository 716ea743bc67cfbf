"""One replica process of a hot-swap run: the normal runtime's model, data slice, LR schedule, clipping and
optimizer for one data-parallel replica, a torchft ``Manager`` of its own, one commit per step (see the
package docstring), and its progress and event files."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from pathlib import Path

from workers.reliability.hotswap.limits import (
    CONNECT_TIMEOUT_S,
    HEARTBEAT_INTERVAL_MS,
    MAX_FAILED_COMMITS,
    POLL_S,
    QUORUM_TIMEOUT_S,
)
from workers.reliability.hotswap.network import bound_http_transport, manager_server_bound_to


class _Reporter:
    """A replica's side of the files: ``replica<N>.json`` (atomic replace) and the events log."""

    def __init__(self, run_dir: Path, replica: int, attempt: int):
        self.run_dir, self.replica, self.attempt, self.pid = run_dir, replica, attempt, os.getpid()
        self.path = run_dir / f"replica{replica}.json"
        self.tmp = run_dir / f".replica{replica}.json.{self.pid}.tmp"
        events = run_dir / f"replica{replica}.events.jsonl"
        cut = events.exists() and events.stat().st_size and not events.read_bytes().endswith(b"\n")
        self.events = events.open("a")
        if cut:
            self.events.write("\n")  # a killed predecessor's last line was cut: do not glue ours to it
        self.step: int | None = None
        self.loss: float | None = None

    def status(self, state: str, **values) -> None:
        doc = {
            "replica": self.replica,
            "pid": self.pid,
            "attempt": self.attempt,
            "state": state,
            "step": self.step,
            "loss": self.loss,
            "time": time.time(),
            **values,
        }
        self.tmp.write_text(json.dumps(doc))
        os.replace(self.tmp, self.path)

    def event(self, event: str, **values) -> None:
        values.setdefault("t", time.time())
        doc = {"event": event, "replica": self.replica, "pid": self.pid, "attempt": self.attempt, **values}
        self.events.write(json.dumps(doc) + "\n")
        self.events.flush()


class _ReplicaModel:
    """What the normal runtime builds from the config, for one data-parallel replica of ``replicas``: the
    model (same seeded init), AdamW/SGD as :class:`~workers.training.trainer.Trainer` builds them, the
    data slice of DP rank ``replica``, the LR schedule, micro-batching and clipping."""

    def __init__(self, cfg):
        import torch

        from workers.devices import backend as device_mod
        from workers.training.data import TokenCorpus
        from workers.training.model import Transformer

        self.cfg = cfg
        self.device_choice = device_mod.select_device(cfg.device if cfg.device != "auto" else None)
        torch.manual_seed(cfg.seed)
        self.model = Transformer.build(cfg.model, cfg.seed)
        self.corpus = TokenCorpus.from_source(cfg.data)
        from workers.training.trainer import AUTOCAST_DTYPES

        self.autocast = AUTOCAST_DTYPES.get(cfg.training.dtype)
        self.device = self.loader = self.optimizer = None

    def use_slot(self, replica: int, replicas: int) -> None:
        """Train as replica ``replica`` of ``replicas``: its device (local rank ``replica``, as the runtime
        places DP ranks on a node), its slice of every global batch, the optimizer over its parameters."""
        import torch

        from workers.training.data import ShardedTokenLoader

        cfg = self.cfg
        self.device = self.device_choice.device_for_local_rank(replica)
        if self.device.type != "cpu":
            getattr(torch, self.device.type).set_device(self.device)
        self.model.to(self.device)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        # Two persistent flat buffers, each the gradients plus the loss: the backward accumulates into
        # views of ``grads`` (as DDP's gradient_as_bucket_view), and the all-reduce runs on ``comm``, a copy:
        # torchft may leave a failed all-reduce's tensor half reduced, and the local gradients must survive
        # it for the next quorum. At 100M parameters this replaced a fresh 400 MB torch.cat and a copy back
        # into every p.grad per step (page faults on new memory: ~1.3 s of a 2.2 s step on this machine).
        n = sum(p.numel() for p in self.params)
        dtype = self.params[0].dtype
        self.grads = torch.zeros(n + 1, dtype=dtype, device=self.device)
        self.comm = torch.zeros(n + 1, dtype=dtype, device=self.device)
        self._point_grads_at(self.grads)
        if cfg.training.optimizer == "sgd":
            self.optimizer = torch.optim.SGD(self.params, lr=cfg.lr, momentum=0.9)
        else:  # as Trainer: torch's AdamW, fused where the parameters are plain CPU/CUDA tensors
            fused = {"fused": True} if self.device.type in ("cpu", "cuda") else {}
            self.optimizer = torch.optim.AdamW(
                self.params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay, **fused
            )
        self.loader = ShardedTokenLoader(
            self.corpus,
            cfg.model.seq_length,
            cfg.training.global_batch_size,
            dp_rank=replica,
            dp_size=replicas,
            seed=cfg.seed,
        )

    def _point_grads_at(self, flat) -> None:
        offset = 0
        for p in self.params:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p)
            offset += n

    def state_dict(self) -> dict:
        """What a healing peer fetches (the live tensors: torchft serves them before this replica's next
        optimizer step, which waits for the transfer to finish)."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def forward_backward(self, step: int):
        """This replica's loss on its slice of step ``step``'s global batch; gradients accumulated."""
        import torch

        from workers.training.parallelize import cross_entropy
        from workers.training.trainer import lr_at

        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(step, self.cfg)
        self.loader.load_state_dict({"consumed_samples": step * self.cfg.training.global_batch_size})
        inputs, labels = self.loader.next_batch()
        inputs, labels = inputs.to(self.device), labels.to(self.device)
        self.grads.zero_()  # the gradients are views of it: accumulated in place by the backward
        mbs = self.cfg.strategy.micro_batch_size
        micro = list(zip(inputs.split(mbs), labels.split(mbs), strict=True))
        total = torch.zeros((), device=self.device)
        for x, y in micro:
            ctx = (
                torch.autocast(self.device.type, dtype=self.autocast)
                if self.autocast
                else contextlib.nullcontext()
            )
            with ctx:
                loss = cross_entropy(self.model(x), y) / len(micro)
            loss.backward()
            total += loss.detach()
        return total

    def flat_grads(self, loss):
        """The gradients and the loss, copied into the buffer the all-reduce may overwrite."""
        self.grads[-1] = loss
        self.comm.copy_(self.grads)
        return self.comm

    def apply_averaged(self, flat) -> tuple[float, float]:
        """The averaged buffer becomes the gradients (the two buffers swap: no copy back), clipped as the
        Trainer does; (loss, grad norm). The norm is float32 over the flat buffer (pairwise-summed): all
        replicas compute it from the same averaged bytes, so they agree; a float64 pass (the Trainer's
        layout-independent norm) cost 0.8 s a step at 100M parameters here."""
        import torch

        assert flat is self.comm
        self.grads, self.comm = self.comm, self.grads
        self._point_grads_at(self.grads)
        grads = self.grads[:-1]
        loss = float(self.grads[-1])
        grad_norm = float(torch.linalg.vector_norm(grads))
        clip = self.cfg.grad_clip
        if clip > 0 and grad_norm > clip:
            grads.mul_(clip / (grad_norm + 1e-6))
        return loss, grad_norm

    def checksum(self) -> str:
        """sha256 over every parameter and optimizer-state tensor, in a fixed order."""
        import torch

        h = hashlib.sha256()
        for name, t in sorted(self.model.state_dict().items()):
            h.update(name.encode())
            h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        for index, state in sorted(self.optimizer.state_dict()["state"].items()):
            for key, value in sorted(state.items()):
                h.update(f"{index}.{key}".encode())
                if isinstance(value, torch.Tensor):
                    h.update(
                        value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
                    )
                else:
                    h.update(repr(value).encode())
        return h.hexdigest()


def _wait_for_file(path: Path, timeout_s: float, *, unless: Path | None = None) -> bool:
    """Wait for ``path``; False if ``unless`` appears first. ``TimeoutError`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if unless is not None and unless.exists():
            return False
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout_s:.0f} s")
        time.sleep(POLL_S)
    return True


def replica_main(spec_path: Path, replica: int | None, attempt: int = 1, spare: int | None = None) -> int:
    """One replica process: build, heartbeat, wait for the start, train with a commit per step, then
    stay in the quorum (so a replica still healing can fetch from it) until the supervisor says finish.
    A spare (``spare`` given, ``replica`` None) builds everything that does not depend on the slot, then
    waits for ``spare<k>.assign`` to say which replica it replaces."""
    t_process = time.time()
    spec = json.loads(Path(spec_path).read_text())
    run_dir, host, steps = Path(spec["run_dir"]), spec["host"], spec["steps"]
    report = None
    if replica is not None:
        report = _Reporter(run_dir, replica, attempt)
        report.status("starting")
        report.event("start", t=t_process)

    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torchft import Manager, ProcessGroupGloo

    from workers.training.config import JobConfig

    torch.set_num_threads(spec["threads"])
    cfg = JobConfig.from_dict(spec["config"])
    rep = _ReplicaModel(cfg)
    timeout = timedelta(seconds=spec["collective_timeout_s"])
    store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timeout)
    transport = bound_http_transport(host, timeout)
    if spare is not None:
        t_built = time.time()
        (run_dir / f"spare{spare}.ready").write_text(str(t_built))
        assign = run_dir / f"spare{spare}.assign"
        if not _wait_for_file(assign, spec["timeout_s"], unless=run_dir / "finish"):
            return 0  # the run ended without needing this spare
        doc = json.loads(assign.read_text())
        replica, attempt = doc["replica"], doc["attempt"]
        report = _Reporter(run_dir, replica, attempt)
        report.status("starting")
        report.event("start", spare=spare, spare_built_s=round(t_built - t_process, 4))
    rep.use_slot(replica, spec["replicas"])
    with manager_server_bound_to(host):
        manager = Manager(
            pg=ProcessGroupGloo(timeout=timeout),
            load_state_dict=rep.load_state_dict,
            state_dict=rep.state_dict,
            min_replica_size=1,
            use_async_quorum=False,  # heal before the forward pass: a rejoined replica contributes at once
            timeout=timeout,
            quorum_timeout=timedelta(seconds=QUORUM_TIMEOUT_S),
            connect_timeout=timedelta(seconds=CONNECT_TIMEOUT_S),
            rank=0,
            world_size=1,
            store_addr=host,
            store_port=store.port,
            lighthouse_addr=spec["lighthouse"],
            replica_id=f"replica{replica}",
            hostname=host,
            heartbeat_interval=timedelta(milliseconds=HEARTBEAT_INTERVAL_MS),
            checkpoint_transport=transport,
            init_sync=False,  # every replica starts from the same seeded init; a restarted one heals
            max_retries=MAX_FAILED_COMMITS,
        )
    report.status("ready")
    report.event("ready")
    _wait_for_file(run_dir / "go", spec["timeout_s"])

    step = 0
    quorum = width_before = None
    kept = None  # (step, loss) of local gradients an all-reduce failed on: still in p.grad, still valid
    while True:
        t_start = time.time()
        manager.start_quorum()
        t_compute = time.time()
        if manager.current_step() != step:
            report.event(
                "healed",
                from_step=step,
                to_step=manager.current_step(),
                seconds=round(t_compute - t_start, 4),
            )
            step = manager.current_step()
        if step >= steps:
            break
        width = manager.num_participants()
        reused = kept is not None and kept[0] == step
        if reused:
            # the last attempt at this step lost a peer in its all-reduce: this replica's gradients (on its
            # slice of the step, from the same parameters) are what running the step again would give, bit
            # for bit -- all-reduce them with the new quorum instead of computing them again
            loss = kept[1]
        else:
            loss = rep.forward_backward(step)
        kept = None
        flat = rep.flat_grads(loss)
        if _quorum_size(manager) > 1:
            manager.allreduce(flat).wait()  # AVG over the quorum; an error is recorded, not raised
        # else: alone in the quorum, the average is the buffer itself (gloo's one-rank all-reduce still
        # copied 400 MB through its pair buffers: ~0.5 s of a survivor's step at 100M parameters here)
        if manager.errored() is None:
            loss_avg, grad_norm = rep.apply_averaged(flat)
        if manager.should_commit():
            rep.optimizer.step()
            t_commit = time.time()
            step = manager.current_step()
            values = {"step": step, "loss": loss_avg, "grad_norm": grad_norm, "participants": width}
            if reused:
                values["gradients_reused"] = True
            # the first commit of a quorum that did not shrink (torchft bumps its private quorum id when the
            # membership changes): record the state, so that replicas can be compared right after a rejoin.
            # Not after a shrink (nothing to compare), and after t_commit: sha256 over 1.2 GB of state took
            # 0.9 s at 100M parameters, which is the instrument's cost, not the recovery's.
            quorum_id = getattr(manager, "_quorum_id", None)
            if (quorum_id != quorum or quorum_id is None) and (width_before is None or width >= width_before):
                values["checksum"] = rep.checksum()
            quorum, width_before = quorum_id, width
            report.step, report.loss = step, loss_avg
            report.event("commit", t_start=t_start, t_compute=t_compute, t_commit=t_commit, **values)
            report.status("training", quorum_t=t_compute)
        else:
            error = manager.errored()
            kept = (step, loss)  # flat_grads copied them: p.grad is untouched by the failed all-reduce
            report.event(
                "failed",
                step=step,
                t_start=t_start,
                t_compute=t_compute,
                t_end=time.time(),
                error=str(error)[:300],
            )
    report.step = step
    report.event("done", step=step, checksum=rep.checksum())
    report.status("done")
    # Stay in the quorum until the supervisor says finish: a replacement that joins now still needs a
    # healthy peer to heal from (without one it would form a quorum alone and train from scratch).
    finish = run_dir / "finish"
    while not finish.exists():
        manager.start_quorum()
        time.sleep(0.05)
    manager.shutdown(wait=False)
    report.events.close()
    return 0


def _quorum_size(manager) -> int:
    """How many replicas the current quorum's process group spans (torchft 0.2.0 has no public accessor:
    its ``Manager._pg`` is the group ``start_quorum`` configured). 0 when it cannot tell: then all-reduce."""
    try:
        return int(manager._pg.size())
    except Exception:  # a torchft without these internals: fall back to always all-reducing
        return 0
