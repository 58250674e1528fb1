"""Drafter training: resumption is bitwise, crashes keep checkpoints, DDP equals one process."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from floorgap.models.checkpoints import latest_checkpoint, load_checkpoint, load_drafter_weights
from floorgap.models.training import (
    TIMING_KEYS,
    StackedExamples,
    TrainConfig,
    collate,
    densify_targets,
    epoch_batches,
    launch,
    train,
)

sys.path.insert(0, str(Path(__file__).parent))
from _training_helpers import (
    GAMMA,
    V,
    grads_and_step_worker,
    make_examples,
    new_model,
)


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _config(tmp: Path, **kw) -> TrainConfig:
    base = {"epochs": 2, "batch_size": 4, "lr": 1e-2, "warmup_steps": 2, "schedule": "cosine",
            "seed": 7, "checkpoint_dir": str(tmp), "log_every": 2, "grad_clip": 1.0}
    base.update(kw)
    return TrainConfig(**base)


def _strip_timing(records):
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]


def _read_log(directory: Path):
    return [json.loads(line) for line in (directory / "log.jsonl").read_text().splitlines()]


class _Kill(RuntimeError):
    pass


def test_kill_and_resume_is_bitwise(tmp_path):
    data = make_examples(18, ragged=True)
    full = train(new_model(dropout=0.1), data, _config(tmp_path / "full"), progress=False)

    def kill_in_second_epoch(info):
        if info["epoch"] == 1 and info["step"] == 2:
            raise _Kill

    crashed = tmp_path / "crashed"
    with pytest.raises(_Kill):
        train(new_model(dropout=0.1), data, _config(crashed), progress=False,
              before_step=kill_in_second_epoch)
    # The crash left epoch 1 only, loadable, and the log holds lines from the dead epoch.
    assert sorted(p.name for p in crashed.glob("epoch-*.pt")) == ["epoch-0001.pt"]
    assert any(r["epoch"] == 2 for r in _read_log(crashed))
    # A fresh process would rebuild the model from scratch (a different init here): resume
    # must restore everything that matters from the checkpoint.
    resumed = train(new_model(seed=99, dropout=0.1), data, _config(crashed), progress=False)
    assert resumed.resumed_from == 1

    a = load_checkpoint(full.checkpoint)
    b = load_checkpoint(resumed.checkpoint)
    assert a["epoch"] == b["epoch"] == 2
    assert a["model"].keys() == b["model"].keys()
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
    assert _strip_timing(a["log"]) == _strip_timing(b["log"])
    assert _strip_timing(_read_log(tmp_path / "full")) == _strip_timing(_read_log(crashed))
    assert [e["loss"] for e in full.epochs] == [e["loss"] for e in resumed.epochs]
    assert full.epochs[1]["loss"] < full.epochs[0]["loss"] + 0.5  # sane, finite
    assert full.steps == resumed.steps == 2 * 5


def test_crash_mid_epoch_keeps_previous_checkpoint_loadable(tmp_path):
    data = make_examples(8)
    cfg = _config(tmp_path, epochs=3, schedule="constant")
    train(new_model(), data, cfg, progress=False)
    before = (tmp_path / "epoch-0003.pt").read_bytes()

    def boom(info):
        if info["step"] == 1:
            raise _Kill

    # Continue the constant-schedule run for more epochs and die inside the 4th.
    with pytest.raises(_Kill):
        train(new_model(), data, _config(tmp_path, epochs=5, schedule="constant"),
              progress=False, before_step=boom)
    path, ckpt = latest_checkpoint(tmp_path)
    assert path.name == "epoch-0003.pt" and ckpt["epoch"] == 3
    assert path.read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    model = new_model(seed=5)
    load_drafter_weights(model, path)
    assert torch.equal(model.out.weight, ckpt["model"]["out.weight"])


def test_frozen_parameters_untouched_and_not_stored(tmp_path):
    model = new_model()
    frozen = model.embed.detach().clone()

    def hook(info):
        assert info["model"].embed.grad is None

    res = train(model, make_examples(8), _config(tmp_path, epochs=1), progress=False,
                before_step=hook)
    assert torch.equal(model.embed, frozen)
    ckpt = load_checkpoint(res.checkpoint)
    assert "embed" not in ckpt["model"]
    assert set(ckpt["model"]) == {n for n, p in model.named_parameters() if p.requires_grad}
    n_trainable = sum(1 for p in model.parameters() if p.requires_grad)
    state = ckpt["optimizer"]["state"]
    params_in_groups = [i for g in ckpt["optimizer"]["param_groups"] for i in g["params"]]
    assert len(params_in_groups) == n_trainable and len(state) == n_trainable
    # A drafter built on different target tables refuses the checkpoint.
    other = new_model()
    with torch.no_grad():
        other.embed.add_(1.0)
    with pytest.raises(ValueError, match="frozen"):
        load_drafter_weights(other, res.checkpoint)


def test_sparse_topk_and_stacked_dataset_match_dense_list(tmp_path):
    sparse = make_examples(8, sparse=True)
    dense = []
    for ex in sparse:
        d = {k: v for k, v in ex.items() if k not in ("target_ids", "target_vals")}
        p = torch.zeros(GAMMA, V).scatter_(-1, ex["target_ids"], ex["target_vals"])
        d["target_probs"] = p / p.sum(-1, keepdim=True)
        dense.append(d)
    stacked = StackedExamples({k: torch.stack([e[k] for e in sparse]) for k in sparse[0]})
    r1 = train(new_model(), stacked, _config(tmp_path / "a", epochs=1), progress=False)
    r2 = train(new_model(), dense, _config(tmp_path / "b", epochs=1), progress=False)
    a, b = load_checkpoint(r1.checkpoint)["model"], load_checkpoint(r2.checkpoint)["model"]
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)
    batch = densify_targets(collate(sparse[:2]), V)
    assert batch["target_probs"].shape == (2, GAMMA, V)
    torch.testing.assert_close(batch["target_probs"].sum(-1), torch.ones(2, GAMMA))


def test_collate_pads_ragged_prefixes_on_the_left():
    ex = make_examples(3, ragged=True)
    batch = collate(ex)
    assert batch["features"].shape == (3, 5, ex[0]["features"].shape[1])
    assert batch["prefix_mask"].tolist()[1] == [False, True, True, True, True]
    assert torch.equal(batch["features"][1, 1:], ex[1]["features"])


def test_epoch_order_is_keyed_by_seed_and_epoch():
    a = epoch_batches(10, 4, seed=3, epoch=1)
    assert [len(x) for x in a] == [4, 4, 2]
    assert all(torch.equal(x, y) for x, y in zip(a, epoch_batches(10, 4, seed=3, epoch=1)))
    assert not torch.equal(torch.cat(a), torch.cat(epoch_batches(10, 4, seed=3, epoch=2)))
    assert len(epoch_batches(10, 4, 3, 1, drop_last=True)) == 2
    assert len(epoch_batches(9, 4, 3, 1, min_size=2)) == 2  # a 1-example batch cannot split


def test_resume_refuses_a_different_configuration(tmp_path):
    data = make_examples(4)
    train(new_model(), data, _config(tmp_path, epochs=1), progress=False)
    with pytest.raises(ValueError, match="configuration"):
        train(new_model(), data, _config(tmp_path, epochs=1, lr=5e-3), progress=False)
    with pytest.raises(ValueError, match="schedule"):
        train(new_model(), data, _config(tmp_path, epochs=2), progress=False)


@pytest.mark.slow
def test_ddp_two_gloo_processes_match_one_process_on_the_union_batch():
    # Batch 5 splits 3 + 2 across the ranks: the share weighting must make it exact anyway.
    cfg = {"epochs": 1, "batch_size": 5, "lr": 1e-2, "seed": 3, "grad_clip": None, "log_every": 0}
    single_grads, single_params = grads_and_step_worker(5, cfg)
    results = launch(grads_and_step_worker, 2, 5, cfg, backend="gloo")
    for grads, params in results:
        assert grads.keys() == single_grads.keys()
        for k in grads:
            torch.testing.assert_close(grads[k], single_grads[k], rtol=1e-5, atol=1e-6)
        for k in params:
            torch.testing.assert_close(params[k], single_params[k], rtol=1e-5, atol=1e-6)
    # Every rank took the step (the parameters moved away from the initialisation).
    init = new_model()
    assert not torch.equal(results[0][1]["out.weight"], init.out.weight)


@pytest.mark.slow
def test_torchrun_entry_matches_single_process(tmp_path):
    import subprocess

    from floorgap.models.training import _free_port, main

    ex = make_examples(12, sparse=True)
    data = tmp_path / "data.pt"
    torch.save({k: torch.stack([e[k] for e in ex]) for k in ex[0]}, data)
    cfg = {"epochs": 2, "batch_size": 4, "lr": 1e-2, "seed": 5, "log_every": 1}
    common = ["--factory", "_training_helpers:new_model", "--data", str(data), "--threads", "1",
              "--no-progress"]
    single = tmp_path / "single"
    assert main([*common, "--config", json.dumps({**cfg, "checkpoint_dir": str(single)})]) == 0
    multi = tmp_path / "multi"
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent),
                                          os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={_free_port()}",
           "-m", "floorgap.models.training", *common,
           "--config", json.dumps({**cfg, "checkpoint_dir": str(multi)}),
           "--result", str(tmp_path / "result.json")]
    proc = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["steps"] == 6 and len(result["epochs"]) == 2
    a = load_checkpoint(single / "epoch-0002.pt")["model"]
    b = load_checkpoint(multi / "epoch-0002.pt")["model"]
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)
    la, lb = _read_log(single), _read_log(multi)
    assert [r["kind"] for r in la] == [r["kind"] for r in lb]
    for ra, rb in zip(la, lb):
        assert ra["loss"] == pytest.approx(rb["loss"], rel=1e-4)


def _scripted_scores(scores):
    """A held-out score function that returns ``scores`` epoch by epoch (a fixture where a
    later epoch is worse), with the calls it saw."""
    calls = []

    def evaluate(model):
        assert not model.training and not torch.is_grad_enabled()
        calls.append(len(calls) + 1)
        return {"score": scores[len(calls) - 1]}

    return evaluate, calls


def test_the_best_held_out_epoch_is_kept_and_patience_stops(tmp_path):
    from floorgap.models.training import best_epoch

    evaluate, calls = _scripted_scores([0.9, 0.7, 0.8, 0.85, 0.6])
    result = train(new_model(), make_examples(12), _config(tmp_path / "a", epochs=5),
                   progress=False, evaluate=evaluate)
    assert [r["heldout"]["score"] for r in result.epochs] == [0.9, 0.7, 0.8, 0.85, 0.6]
    assert best_epoch(result.epochs) == 5
    # a later epoch worse than an earlier one: the earlier one is kept
    assert best_epoch(result.epochs[:4]) == 2
    # patience 2: epochs 3 and 4 do not beat epoch 2, so the run ends after epoch 4
    evaluate, calls = _scripted_scores([0.9, 0.7, 0.8, 0.85, 0.6])
    stopped = train(new_model(), make_examples(12),
                    _config(tmp_path / "b", epochs=5, patience=2), progress=False,
                    evaluate=evaluate)
    assert [r["epoch"] for r in stopped.epochs] == [1, 2, 3, 4] and calls == [1, 2, 3, 4]
    assert best_epoch(stopped.epochs) == 2
    # resuming the stopped run trains nothing more: the rule is applied to the restored log
    evaluate, calls = _scripted_scores([0.1] * 5)
    again = train(new_model(), make_examples(12), _config(tmp_path / "b", epochs=5, patience=2),
                  progress=False, evaluate=evaluate)
    assert calls == [] and [r["epoch"] for r in again.epochs] == [1, 2, 3, 4]
    # the held-out scores do not change the trajectory: same weights as a run without them
    plain = train(new_model(), make_examples(12), _config(tmp_path / "c", epochs=5),
                  progress=False)
    a = load_checkpoint(tmp_path / "a" / "epoch-0005.pt")["model"]
    c = load_checkpoint(tmp_path / "c" / "epoch-0005.pt")["model"]
    assert all(torch.equal(a[k], c[k]) for k in a) and plain.steps == result.steps
