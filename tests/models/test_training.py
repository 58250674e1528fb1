"""Drafter training: resumption is bitwise, crashes keep checkpoints, DDP equals one process."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from floorgap.models.checkpoints import latest_checkpoint, load_checkpoint, load_drafter_weights
from floorgap.models.training import TIMING_KEYS, TrainConfig, launch, train

sys.path.insert(0, str(Path(__file__).parent))
from _training_helpers import grads_and_step_worker, make_examples, new_model


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
