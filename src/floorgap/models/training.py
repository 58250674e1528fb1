"""Drafter training: deterministic, resumable, data-parallel.

A drafter is an ``nn.Module`` with

* ``forward(features, committed, block_tokens, prefix_mask=..., feature_index=...) -> output``
  and
* ``loss(output, targets, block_tokens) -> (loss, parts)`` with ``targets`` the target's top-K
  law (:class:`floorgap.models.drafters.TopKTargets`), ``loss`` the mean over the batch and
  ``parts`` a map of names to floats.

Parameters with ``requires_grad=False`` (the shared target tables a drafter borrows) are frozen:
they are not given to the optimiser and are not written into checkpoints; a checkpoint stores a
fingerprint of them instead, so loading it into a drafter built on a different target fails.

The examples are one object with the :class:`Examples` interface (in the workflow,
:class:`floorgap.models.examples.BlockExamples`): it orders the epoch's batches and
gathers each one; the loop below is the only one that trains a drafter.

Determinism. The batch order of epoch ``e`` is keyed by ``(seed, e)`` (the examples' own
``epoch_batches``), and the
global random state is re-seeded from ``(seed, e, rank)`` at the start of every epoch, so an epoch
does the same work whether or not the run was resumed before it. A checkpoint is written
atomically after every epoch (temporary file + ``os.replace``; the file format and its loaders
are in :mod:`floorgap.models.checkpoints`); a run that dies mid-epoch leaves the previous
checkpoint intact and ``resume=True`` continues from it.

Data parallel. ``config.batch_size`` is the *global* batch: each batch is split across the ranks
(rank ``r`` takes positions ``r, r + world, ...``) and every rank's loss is weighted by its share,
so the all-reduced gradient equals the single-process gradient of the whole batch; the number of
steps and the trajectory do not depend on the number of processes beyond floating-point
reduction order. Only rank 0 writes checkpoints and logs. Run under ``torchrun`` (the drafters
stage re-executes itself so) or in-process with :func:`launch`.

Size: about 600 lines, one training loop and what it owns: the learning-rate schedule, exact
resume (optimiser, scheduler and generator states), the data-parallel launch and the epoch
log; each is a few short functions that only this loop calls.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import random
import socket
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from floorgap.models.checkpoints import (checkpoint_files, checkpoint_path, frozen_fingerprint,
                                         latest_checkpoint, load_drafter_weights, save_checkpoint,
                                         trainable_layout, trainable_state)
from floorgap.models.drafters import TopKTargets
from floorgap.models.targets import mixed_precision
from floorgap.progress import progress as progress_bar
from floorgap.records import atomic_path, best_epoch
from floorgap.seeds import derive_seed

__all__ = ["Examples", "TrainConfig", "TrainResult", "best_epoch", "init_distributed", "launch",
           "train"]

LOG_NAME = "log.jsonl"
# Keys of log records that measure time; they differ between otherwise identical runs.
TIMING_KEYS = frozenset({"seconds", "tokens_per_s", "time"})


# --------------------------------------------------------------------------------------------
# Configuration and result


@dataclass
class TrainConfig:
    """Hyper-parameters and bookkeeping of one training run.

    ``batch_size`` is the global batch (split across data-parallel ranks). ``warmup_steps`` is a
    linear warm-up; ``schedule`` is ``"cosine"`` (decay to ``min_lr_ratio * lr`` at the end of
    ``epochs``), ``"linear"`` or ``"constant"``. With an ``evaluate`` function
    given to :func:`train`, every epoch is scored on held-out data (lower is better) and
    ``patience`` stops the run once that many epochs in a row have not improved on the best.
    """

    epochs: int = 1
    batch_size: int = 8
    lr: float = 6e-4
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    warmup_steps: int = 0
    schedule: str = "cosine"
    min_lr_ratio: float = 0.0
    grad_clip: float | None = 1.0
    seed: int = 0
    checkpoint_dir: str | None = None
    log_every: int = 10
    autocast_dtype: str | None = None
    device: str | None = None
    find_unused_parameters: bool = False
    patience: int | None = None

    # Fields that may change between a run and its resumption without changing the trajectory.
    _VOLATILE = ("checkpoint_dir", "log_every", "device", "epochs", "patience")

    def fingerprint(self) -> str:
        """SHA-256 over the fields that determine the trajectory (``epochs`` is checked apart)."""
        d = {k: v for k, v in dataclasses.asdict(self).items() if k not in self._VOLATILE}
        d["betas"] = list(d["betas"])
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TrainConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown TrainConfig fields: {sorted(unknown)}")
        d = dict(d)
        if "betas" in d:
            d["betas"] = tuple(d["betas"])
        return cls(**d)


@dataclass
class TrainResult:
    """Per-epoch records (all epochs of the run, including those before a resumption)."""

    epochs: list[dict[str, Any]]
    steps: int
    tokens_per_s: float
    seconds: float
    resumed_from: int
    checkpoint: str | None
    log: list[dict[str, Any]] = field(default_factory=list)


# --------------------------------------------------------------------------------------------
# Data


class Examples(Protocol):
    """What :func:`train` reads: :class:`floorgap.models.examples.BlockExamples` (the
    workflow's one data path) and any test double of it.

    ``epoch_batches`` gives the epoch's global batches (index tensors, keyed by ``seed`` and
    ``epoch``; none shorter than ``min_size``, the number of ranks); ``gather`` gives one batch
    as tensors: ``features [S, T, F]``, ``feature_index [N]`` (the row of ``features`` each
    block reads), ``prefix_mask [N, T]``, ``committed [N]``, ``block_tokens [N, gamma]`` and the
    target's top-K law ``target_ids``/``target_vals [N, gamma, K]``.
    """

    def __len__(self) -> int: ...

    def epoch_batches(self, batch_size: int, seed: int, epoch: int, *, min_size: int = 1
                      ) -> list[torch.Tensor]: ...

    def gather(self, indices: torch.Tensor) -> dict[str, torch.Tensor]: ...


# --------------------------------------------------------------------------------------------
# Random state


def _rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), int(np_state[2]),
                  int(np_state[3]), float(np_state[4])],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: Mapping[str, Any]) -> None:
    torch.set_rng_state(state["torch"].cpu())
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    if "cuda" in state and torch.cuda.is_available():
        cuda = [s.cpu() for s in state["cuda"]]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)


def _seed_epoch(seed: int, epoch: int, rank: int) -> None:
    s = derive_seed(seed, "drafter-train", "rng", epoch, rank)
    torch.manual_seed(s)
    random.seed(s)
    np.random.seed(s % (2**32))


# --------------------------------------------------------------------------------------------
# Optimiser and schedule


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def _lr_lambda(config: TrainConfig, total_steps: int) -> Callable[[int], float]:
    warm, kind, floor = int(config.warmup_steps), config.schedule, float(config.min_lr_ratio)
    if kind not in ("cosine", "linear", "constant"):
        raise ValueError(f"unknown schedule {kind!r}")

    def f(step: int) -> float:
        if warm and step < warm:
            return (step + 1) / warm
        if kind == "constant":
            return 1.0
        span = max(1, total_steps - warm)
        frac = min(1.0, (step - warm) / span)
        if kind == "linear":
            return floor + (1 - floor) * (1 - frac)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * frac))

    return f


# --------------------------------------------------------------------------------------------
# Distributed helpers


def _dist_info() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def init_distributed(backend: str | None = None) -> tuple[int, int]:
    """Initialise the default process group from ``torchrun``'s environment when it asks for
    more than one process (NCCL with CUDA, gloo otherwise). Returns ``(rank, world_size)``."""
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend=backend)
    return dist.get_rank(), dist.get_world_size()


def _resolve_device(config: TrainConfig) -> torch.device:
    if config.device:
        return torch.device(config.device)
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def _all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    _, world = _dist_info()
    if world == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch_entry(rank: int, world: int, port: int, backend: str, fn: Callable[..., Any],
                  args: tuple[Any, ...], outdir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend=backend, rank=rank, world_size=world)
    try:
        result = fn(*args)
        torch.save(result, os.path.join(outdir, f"rank-{rank}.pt"))
    finally:
        dist.destroy_process_group()


def launch(fn: Callable[..., Any], nprocs: int, *args: Any, backend: str | None = None
           ) -> list[Any]:
    """Run ``fn(*args)`` in ``nprocs`` spawned processes joined in one process group.

    ``fn`` must be importable (a module-level function). The group uses the loopback interface
    and a free port; the backend defaults to NCCL with at least ``nprocs`` GPUs, gloo otherwise.
    Returns each rank's return value (which must be picklable by ``torch.save``).
    """
    backend = backend or ("nccl" if torch.cuda.device_count() >= nprocs else "gloo")
    with tempfile.TemporaryDirectory(prefix="floorgap-launch-") as outdir:
        mp.spawn(_launch_entry, args=(nprocs, _free_port(), backend, fn, args, outdir),
                 nprocs=nprocs, join=True)
        return [torch.load(os.path.join(outdir, f"rank-{r}.pt"), weights_only=False)
                for r in range(nprocs)]


# --------------------------------------------------------------------------------------------
# Training


class _JsonLog:
    """Append-only JSON-lines loss log (rank 0), kept in step with the records in memory."""

    def __init__(self, path: Path | None, records: list[dict[str, Any]]):
        self.path, self.records = path, records
        if path is not None:
            # Rewrite from the checkpoint's log: drops lines of an epoch that did not finish.
            with atomic_path(path) as tmp:
                tmp.write_text("".join(json.dumps(r) + "\n" for r in records))

    def write(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        if self.path is not None:
            with open(self.path, "a") as fh:
                fh.write(json.dumps(record) + "\n")


@dataclass
class _Totals:
    """Example-weighted sums over a stretch of steps (an epoch, or a window between log
    records): the loss and each named part times the examples, the examples and block tokens.
    Means divide by ``examples`` after the sums of every rank are added up."""

    names: list[str]
    loss: float = 0.0
    parts: dict[str, float] = field(default_factory=dict)
    examples: float = 0.0
    tokens: float = 0.0

    @classmethod
    def zero(cls, names: list[str]) -> _Totals:
        return cls(names, parts={k: 0.0 for k in names})

    def add(self, loss: float, parts: Mapping[str, float], examples: int, tokens: int) -> None:
        self.loss += loss * examples
        for k in self.names:
            self.parts[k] += float(parts[k]) * examples
        self.examples += examples
        self.tokens += tokens

    def reduced(self, device: torch.device) -> _Totals:
        """The sums over every rank (one all-reduce; the same sums on a single process)."""
        flat = _all_reduce_sum([self.loss, *self.parts.values(), self.examples, self.tokens],
                               device)
        return _Totals(self.names, flat[0], dict(zip(self.names, flat[1:-2])), flat[-2], flat[-1])

    def means(self) -> dict[str, Any]:
        return {"loss": self.loss / self.examples,
                "parts": {k: v / self.examples for k, v in self.parts.items()}}


@dataclass
class _Run:
    """What the epochs and steps of one :func:`train` call share, and its running counts."""

    config: TrainConfig
    dataset: Examples
    rank: int
    world: int
    device: torch.device
    core: nn.Module
    wrapped: nn.Module
    trainable: list[nn.Parameter]
    optimizer: torch.optim.Optimizer
    scheduler: Any
    log: _JsonLog
    ckpt_dir: Path | None
    fingerprints: tuple[str, str, str]  # training config, frozen tables, trainable layout
    before_step: Callable[[dict[str, Any]], None] | None
    evaluate: Callable[[nn.Module], dict[str, Any]] | None = None
    bar: Any = None
    global_step: int = 0
    tokens: int = 0
    seconds: float = 0.0
    last_ckpt: Path | None = None


def _optimizer(core: nn.Module, config: TrainConfig, total_steps: int
               ) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW over the trainable parameters (no decay on vectors) and its LR schedule. The fused
    kernel where torch has one: a DSpark predecessor table (V x rank) makes the per-tensor
    update most of a CPU step otherwise."""
    device = next(p for p in core.parameters() if p.requires_grad).device
    optimizer = torch.optim.AdamW(_param_groups(core, config.weight_decay), lr=config.lr,
                                  betas=tuple(config.betas), eps=config.eps,
                                  fused=device.type in ("cpu", "cuda"))
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(config, total_steps))


def _restore(core: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
             config: TrainConfig, ckpt_dir: Path | None, resume: bool, rank: int
             ) -> tuple[int, list[dict[str, Any]], Path | None]:
    """Continue after the newest checkpoint in ``ckpt_dir`` (``resume``), or clear the folder
    (rank 0 of a fresh run). Returns (epochs done, log records so far, checkpoint resumed)."""
    if ckpt_dir is None:
        return 0, [], None
    if not resume:
        if rank == 0:
            # A fresh run: checkpoints of an earlier run must not be taken for this run's later.
            for _, stale in checkpoint_files(ckpt_dir):
                stale.unlink()
        return 0, [], None
    found = latest_checkpoint(ckpt_dir)
    if found is None:
        return 0, [], None
    path, ckpt = found
    if ckpt["config_fingerprint"] != config.fingerprint():
        raise ValueError(f"{path}: written under a different training configuration")
    if config.schedule != "constant" and ckpt["config"]["epochs"] != config.epochs:
        raise ValueError(f"{path}: the {config.schedule} schedule spans "
                         f"{ckpt['config']['epochs']} epochs, not {config.epochs}")
    load_drafter_weights(core, ckpt)
    optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    _set_rng_state(ckpt["rng"])
    return int(ckpt["epoch"]), list(ckpt["log"]), path


def _data_parallel(core: nn.Module, config: TrainConfig, device: torch.device, world: int
                   ) -> nn.Module:
    """``core`` wrapped in DDP when there is more than one rank (DDP broadcasts rank 0's
    parameters, so this comes after a resumption has loaded them)."""
    if world == 1:
        return core
    ddp_kw: dict[str, Any] = {"find_unused_parameters": config.find_unused_parameters}
    if device.type == "cuda":
        ddp_kw.update(device_ids=[device.index], output_device=device.index)
    return nn.parallel.DistributedDataParallel(core, **ddp_kw)


def _train_step(run: _Run, epoch: int, step: int, idx: torch.Tensor, local: torch.Tensor
                ) -> tuple[torch.Tensor, Mapping[str, float], float, int]:
    """One optimiser step on global batch ``idx`` (this rank's share ``local``).

    Returns the local loss, its parts, the learning rate of the step and the block tokens.
    """
    cfg = run.config
    # Weight the local mean by the rank's share: the all-reduced gradient is the batch mean's.
    share = len(local) * run.world / len(idx)
    batch = {k: v.to(run.device, non_blocking=True) for k, v in run.dataset.gather(local).items()}
    targets = TopKTargets(batch["target_ids"].long(), batch["target_vals"])
    with mixed_precision(run.device.type, cfg.autocast_dtype):
        out = run.wrapped(batch["features"], batch["committed"], batch["block_tokens"],
                          prefix_mask=batch["prefix_mask"], feature_index=batch["feature_index"])
        loss, parts = run.core.loss(out, targets, batch["block_tokens"])
    (loss * share).backward()
    if cfg.grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(run.trainable, cfg.grad_clip)
    if run.before_step is not None:
        run.before_step({"epoch": epoch, "step": step, "global_step": run.global_step,
                         "model": run.core, "loss": loss, "parts": parts})
    run.optimizer.step()
    lr = run.scheduler.get_last_lr()[0]
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    run.global_step += 1
    return loss, parts, lr, len(local) * int(batch["block_tokens"].shape[-1])


def _log_window(run: _Run, epoch: int, lr: float, window: _Totals) -> None:
    """A ``step`` log record: the window's mean loss and parts over every rank (rank 0)."""
    tot = window.reduced(run.device)
    if run.rank == 0:
        run.log.write({"kind": "step", "epoch": epoch + 1, "step": run.global_step, "lr": lr,
                       **tot.means()})


def _checkpoint_epoch(run: _Run, epochs_done: int) -> None:
    """Rank 0 writes the checkpoint after ``epochs_done`` epochs; every rank waits for it."""
    run.last_ckpt = checkpoint_path(run.ckpt_dir, epochs_done)
    if run.rank == 0:
        cfg_fp, frozen_fp, layout = run.fingerprints
        save_checkpoint(run.last_ckpt, {
            "epoch": epochs_done, "global_step": run.global_step,
            "model": trainable_state(run.core), "optimizer": run.optimizer.state_dict(),
            "scheduler": run.scheduler.state_dict(), "rng": _rng_state(),
            "config": {**dataclasses.asdict(run.config), "betas": list(run.config.betas)},
            "config_fingerprint": cfg_fp, "frozen_fingerprint": frozen_fp,
            "trainable_layout": layout, "log": list(run.log.records),
        })
    if run.world > 1:
        dist.barrier()


def _finish_epoch(run: _Run, epoch: int, totals: _Totals, steps: int, t0: float) -> None:
    """The ``epoch`` record (mean loss, tokens/s) of the epoch just trained, and its checkpoint."""
    tot = totals.reduced(run.device)
    if run.device.type == "cuda":
        torch.cuda.synchronize(run.device)
    seconds = time.perf_counter() - t0
    run.tokens += int(tot.tokens)
    run.seconds += seconds
    record = {"kind": "epoch", "epoch": epoch + 1, "step": run.global_step, "steps": steps,
              "examples": int(tot.examples), "tokens": int(tot.tokens), **tot.means(),
              "seconds": seconds, "tokens_per_s": tot.tokens / max(seconds, 1e-12)}
    if run.evaluate is not None:
        run.wrapped.eval()
        with torch.no_grad():
            record["heldout"] = run.evaluate(run.core)
        run.wrapped.train()
    run.log.write(record)  # only rank 0's log has a file
    if run.ckpt_dir is not None:
        _checkpoint_epoch(run, epoch + 1)


def _train_epoch(run: _Run, epoch: int) -> None:
    """Epoch ``epoch`` (0-based): its seeded batch order, every step, a log record every
    ``log_every`` steps and at the end, then the epoch record and checkpoint."""
    cfg = run.config
    _seed_epoch(cfg.seed, epoch, run.rank)
    batches = run.dataset.epoch_batches(cfg.batch_size, cfg.seed, epoch, min_size=run.world)
    totals: _Totals | None = None
    window: _Totals | None = None
    t0 = time.perf_counter()
    for step, idx in enumerate(batches):
        local = idx[run.rank::run.world]
        loss, parts, lr, tokens = _train_step(run, epoch, step, idx, local)
        if totals is None:
            totals, window = _Totals.zero(sorted(parts)), _Totals.zero(sorted(parts))
        for sums in (totals, window):
            sums.add(float(loss.detach()), parts, len(local), tokens)
        if (cfg.log_every and (step + 1) % cfg.log_every == 0) or step == len(batches) - 1:
            _log_window(run, epoch, lr, window)
            window = _Totals.zero(window.names)
        run.bar.update(1)
        run.bar.set_postfix(epoch=epoch + 1, loss=f"{float(loss.detach()):.4f}")
    _finish_epoch(run, epoch, totals, len(batches), t0)


def _patience_spent(epochs: Sequence[Mapping[str, Any]], patience: int | None) -> bool:
    """Whether the last ``patience`` scored epochs all came after the best one."""
    best = best_epoch(epochs)
    if patience is None or best is None:
        return False
    return int(epochs[-1]["epoch"]) - best >= patience


def train(model: nn.Module, dataset: Examples, config: TrainConfig, *, resume: bool = True,
          progress: bool = True, before_step: Callable[[dict[str, Any]], None] | None = None,
          evaluate: Callable[[nn.Module], dict[str, Any]] | None = None) -> TrainResult:
    """Train ``model`` on ``dataset`` for ``config.epochs`` epochs (see the module docstring).

    ``before_step(info)`` is called on every rank after the backward pass and gradient
    clipping, before the optimiser step, with ``info = {"epoch", "step", "global_step",
    "model", "loss", "parts"}`` (``model`` unwrapped): a place to inspect gradients or to
    stop a run. With a ``checkpoint_dir`` and ``resume``, training continues after the newest
    complete checkpoint there. ``evaluate(model)`` (no gradients, eval mode) scores every
    epoch on held-out data: its dict, with a ``score`` (lower is better), goes into the epoch
    record as ``heldout``, and ``config.patience`` ends the run early (a resumed run applies
    the rule to the epochs it restored). Returns the per-epoch records of all epochs so far.
    """
    rank, world = _dist_info()
    device = _resolve_device(config)
    core = model.to(device)
    trainable = [p for p in core.parameters() if p.requires_grad]
    if not trainable:
        raise ValueError("model has no trainable parameters")
    n = len(dataset)
    steps_per_epoch = len(dataset.epoch_batches(config.batch_size, config.seed, 0, min_size=world))
    if steps_per_epoch == 0:
        raise ValueError(f"no batches: {n} examples, batch {config.batch_size}, {world} ranks")
    optimizer, scheduler = _optimizer(core, config, steps_per_epoch * config.epochs)
    ckpt_dir = Path(config.checkpoint_dir) if config.checkpoint_dir else None
    fingerprints = (config.fingerprint(), frozen_fingerprint(core), trainable_layout(core))
    start_epoch, records, last_ckpt = _restore(core, optimizer, scheduler, config, ckpt_dir,
                                               resume, rank)
    if world > 1 and ckpt_dir is not None:
        dist.barrier()
    log = _JsonLog(ckpt_dir / LOG_NAME if (ckpt_dir is not None and rank == 0) else None, records)
    run = _Run(config=config, dataset=dataset, rank=rank, world=world, device=device, core=core,
               wrapped=_data_parallel(core, config, device, world), trainable=trainable,
               optimizer=optimizer, scheduler=scheduler, log=log, ckpt_dir=ckpt_dir,
               fingerprints=fingerprints, before_step=before_step, evaluate=evaluate,
               global_step=start_epoch * steps_per_epoch, last_ckpt=last_ckpt)
    run.bar = progress_bar(total=steps_per_epoch * config.epochs, initial=run.global_step,
                           desc="drafter", disable=not (progress and rank == 0))
    run.wrapped.train()

    def done() -> list[dict[str, Any]]:
        return [r for r in run.log.records if r.get("kind") == "epoch"]

    try:
        for epoch in range(start_epoch, config.epochs):
            if _patience_spent(done(), config.patience):
                break
            _train_epoch(run, epoch)
    finally:
        run.bar.close()
    return TrainResult(epochs=done(), steps=run.global_step,
                       tokens_per_s=run.tokens / run.seconds if run.seconds else 0.0,
                       seconds=run.seconds, resumed_from=start_epoch,
                       checkpoint=str(run.last_ckpt) if run.last_ckpt else None,
                       log=list(run.log.records))
