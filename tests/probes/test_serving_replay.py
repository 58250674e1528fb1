"""Served rounds replayed offline (floorgap.probes.serving_replay): the round boundaries from an
engine's per-round counts, and each round's p, q and TV against the evaluation probe's own
route (a prefilled cache and teacher forcing, the drafter's inputs built for that context)."""

from __future__ import annotations

import math

import pytest
import torch

from floorgap.errors import StageError
from floorgap.probes.serving_replay import replay_request, round_starts


def test_round_starts_follow_the_accepted_counts() -> None:
    # prefill token, then rounds returning 3, 1 and 4 tokens: 9 tokens
    assert round_starts([2, 0, 3], 9, gamma=4) == [1, 4, 5]
    # the last round cut by the token limit: 8 tokens served of the 9 the rounds returned
    assert round_starts([2, 0, 3], 8, gamma=4) == [1, 4, 5]
    with pytest.raises(StageError, match="incomplete"):
        round_starts([2, 0], 9, gamma=4)
    with pytest.raises(StageError, match="do not belong"):
        round_starts([2, 0, 3, 0], 8, gamma=4)
    with pytest.raises(StageError, match="outside"):
        round_starts([5], 7, gamma=4)


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_replay_equals_the_evaluation_probe_route(smoke_target, kind: str) -> None:
    from floorgap.models.drafter_training import drafter_config
    from floorgap.models.drafters import build_drafter
    from floorgap.models.targets import load_target
    from floorgap.probes.drafter_eval import drafter_inputs, target_path_probs
    from floorgap.sampling import SamplingLaw

    cfg, _, model_dir, _ = smoke_target
    model, _ = load_target(model_dir)
    gamma = int(cfg["anchors"]["gamma"])
    torch.manual_seed(1)
    dc = drafter_config({"kind": kind, "layers": 1}, cfg["drafters"]["taps"], gamma,
                        model.config)
    drafter = build_drafter(dc, model).eval()
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(5, 200, (6,), generator=g).tolist()
    completion = torch.randint(5, 200, (20,), generator=g).tolist()
    steps = [3, 0, 7, 1]        # with [2, 0]: rounds start at 1, 5, 6, 14, 16, 19
    labels = {"target": "t", "system": kind, "task": "t", "row_id": "r", "temperature": 1.0,
              "concurrency": 1}
    rounds = replay_request(model, drafter, prompt, completion, steps + [2, 0],
                            temperature=1.0, labels=labels)
    assert [r.start for r in rounds] == [1, 5, 6, 14, 16, 19]
    assert [r.complete for r in rounds] == [True, True, True, False, False, False]
    law = SamplingLaw(1.0)
    for r in rounds:
        context = prompt + completion[:r.start]
        avail = min(gamma, len(completion) - r.start)
        path = completion[r.start:r.start + avail]
        padded = path + [path[-1]] * (gamma - avail)
        p = target_path_probs(model, context, torch.tensor([padded]), law=law,
                              forward_batch=1)[:, 0]                          # [G, V]
        feats, committed, mask = drafter_inputs(model, drafter, context)
        q = law.probs(drafter.propose(feats, committed, torch.tensor([padded]), mask)[0])
        for j in range(gamma):
            if j >= avail:
                assert math.isnan(r.tv[j]) and math.isnan(r.p_tok[j])
                continue
            assert r.p_tok[j] == pytest.approx(float(p[j, path[j]]), rel=1e-4, abs=1e-9)
            assert r.q_tok[j] == pytest.approx(float(q[j, path[j]]), rel=1e-4, abs=1e-9)
            tv = 0.5 * float((p[j] - q[j]).abs().sum())
            assert r.tv[j] == pytest.approx(tv, rel=1e-4, abs=1e-6)


def test_a_request_served_again_unchanged_is_replayed_once(smoke_target) -> None:
    from types import SimpleNamespace

    from floorgap.models.drafter_training import drafter_config
    from floorgap.models.drafters import build_drafter
    from floorgap.models.targets import load_target
    from floorgap.probes.serving_replay import replay_requests

    cfg, _, model_dir, _ = smoke_target
    model, _ = load_target(model_dir)
    gamma = int(cfg["anchors"]["gamma"])
    torch.manual_seed(3)
    dc = drafter_config({"kind": "dflash", "layers": 1}, cfg["drafters"]["taps"], gamma,
                        model.config)
    drafter = build_drafter(dc, model).eval()
    g = torch.Generator().manual_seed(4)
    prompts = {"a": torch.randint(5, 200, (5,), generator=g).tolist(),
               "b": torch.randint(5, 200, (8,), generator=g).tolist()}
    y = torch.randint(5, 200, (12,), generator=g).tolist()

    def served(row, temperature, concurrency, steps):
        return SimpleNamespace(task="t", row_id=row, temperature=temperature,
                               concurrency=concurrency, token_ids=y, step_accepted=steps)

    requests = [served("a", 0.0, 1, [2, 3, 4]),
                served("a", 0.0, 2, [2, 3, 4]),     # the same completion and rounds again
                served("a", 0.0, 4, [1, 1, 1, 1, 2]),  # the same completion, other rounds
                served("b", 0.0, 1, [2, 3, 4])]     # another prompt
    calls = []
    rounds, distinct = replay_requests(model, drafter, requests, prompts, target_name="t",
                                       system="dflash", on_request=calls.append)
    assert distinct == 3 and calls == [1, 1, 1, 1]
    by = {}
    for r in rounds:
        by.setdefault((r.row_id, r.concurrency), []).append(r)
    again, first = by[("a", 2)], by[("a", 1)]
    assert _same(again, first) and {r.concurrency for r in again} == {2}
    # each replayed request equals its own replay
    for q in requests:
        labels = {"target": "t", "system": "dflash", "task": "t", "row_id": q.row_id,
                  "temperature": q.temperature, "concurrency": q.concurrency}
        own = replay_request(model, drafter, prompts[q.row_id], y, q.step_accepted,
                             temperature=q.temperature, labels=labels)
        assert _same(own, by[(q.row_id, q.concurrency)])
    with pytest.raises(StageError, match="not among the serving rows"):
        replay_requests(model, drafter, [served("c", 0.0, 1, [2, 3, 4])], prompts,
                        target_name="t", system="dflash")


def _same(a, b) -> bool:
    """Rounds equal field by field, NaN equal to NaN (slots past the completion)."""
    def key(r):
        return [x if not (isinstance(x, float) and math.isnan(x)) else "nan"
                for x in (r.round, r.start, r.accepted, r.complete, *r.p_tok, *r.q_tok, *r.tv)]
    return len(a) == len(b) and all(key(x) == key(y) for x, y in zip(a, b))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_each_named_fault_replays_as_the_folder_an_engine_would_read(smoke_target, tmp_path,
                                                                     temperature) -> None:
    """The rounds replayed under a named fault (hypotheses_tv) are the rounds replayed with the
    folder that fault makes: its layout declared the other way, its taps one layer off; read
    by floorgap's own import, independently of the hypothesis drafters."""
    import json
    from types import SimpleNamespace

    from floorgap.models.drafter_training import drafter_config
    from floorgap.models.drafters import build_drafter
    from floorgap.models.engine_formats import export_drafter
    from floorgap.models.targets import load_target
    from floorgap.probes.drafter_eval import load_trained_drafter
    from floorgap.probes.serving_replay import LAYOUT_SHIFT, replay_requests

    cfg, _, model_dir, _ = smoke_target
    model, _ = load_target(model_dir)
    gamma = int(cfg["anchors"]["gamma"])
    torch.manual_seed(5)
    taps = [0]    # of the smoke target's two layers: no offset of -1 (it would leave them)
    dc = drafter_config({"kind": "dflash", "layers": 1}, taps, gamma, model.config)
    drafter = build_drafter(dc, model).eval()
    folder = export_drafter(drafter, tmp_path / "faithful", "dflash")
    g = torch.Generator().manual_seed(6)
    prompts = {"a": torch.randint(5, 200, (7,), generator=g).tolist()}
    y = torch.randint(5, 200, (gamma + 14,), generator=g).tolist()
    request = SimpleNamespace(task="t", row_id="a", temperature=temperature, concurrency=1,
                              token_ids=y, step_accepted=[1, 0, 2, gamma, 1, 3])
    rounds, _ = replay_requests(model, drafter, [request], prompts, target_name="t",
                                system="dflash", name_faults=True)
    hypotheses = [json.loads(r.hypotheses_tv) for r in rounds]
    names = {LAYOUT_SHIFT: lambda c: c.update(sample_from_anchor=True),
             "target-layer index offset by +1": lambda c: c["dflash_config"].update(
                 target_layer_ids=[t + 1 for t in taps])}
    assert set(hypotheses[0]) == set(names)
    for name, edit in names.items():
        faulty = tmp_path / name.replace(" ", "-")
        faulty.mkdir()
        for f in folder.iterdir():
            (faulty / f.name).write_bytes(f.read_bytes())
        config = json.loads((faulty / "config.json").read_text())
        edit(config)
        (faulty / "config.json").write_text(json.dumps(config))
        engine_reading = load_trained_drafter(faulty, model, gamma)
        own, _ = replay_requests(model, engine_reading, [request], prompts, target_name="t",
                                 system="dflash")
        for r, h in zip(own, hypotheses):
            assert torch.allclose(torch.tensor(r.tv), torch.tensor(h[name]), atol=1e-9,
                                  equal_nan=True), name
        # and it differs from the faithful reading (at T = 0 a random drafter's argmaxes miss
        # the target's under every reading alike)
        assert temperature == 0 or any(not torch.allclose(torch.tensor(r.tv), torch.tensor(x.tv), equal_nan=True)
                   for r, x in zip(own, rounds)), name
