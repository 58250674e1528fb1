"""The drafter evaluation probe on the smoke config's tiny random target: exactness of the
recomputed target probabilities, a perfect drafter, a DSpark drafter without its Markov head,
and determinism of the stage's records."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch

from floorgap.stages._cli import run_stage
from floorgap.estimators.serving import (
    accepted_length,
    joint_survival,
    serving_risk_sums,
)
from floorgap.models.drafters import DrafterConfig, build_drafter
from floorgap.models.targets import load_target
from floorgap.probes.drafter_eval import (
    anchor_eval_records,
    anchor_target,
    evaluate_drafter,
    path_arrays,
    target_path_probs,
)
from floorgap.probes.rollouts import anchor_records, sample_block
from floorgap.records import dataclass_rows, read_metadata, read_table, sha256_file
from floorgap.sampling import SamplingLaw

pytestmark = pytest.mark.slow

GAMMA = 7
M = 8
LAW = SamplingLaw()


@pytest.fixture(scope="module")
def model(smoke_target):
    return load_target(smoke_target[2], "float32", "cpu")[0]


@pytest.fixture(scope="module")
def stored(model, smoke_domain_records):
    """One anchor's context, seed and stored paths (tokens, logp) as the rollouts stage keeps
    them."""
    from floorgap.data.anchors import anchor_contexts

    _, _, _, corpus, anchors, _ = smoke_domain_records
    a = read_table(anchors).iloc[:1]
    ctx = anchor_contexts(read_table(corpus), a)[0]
    seed = int(a.anchor_seed.iloc[0])
    block = sample_block(model, ctx, n_paths=M, gamma=GAMMA, law=LAW, anchor_seed=seed,
                         forward_batch=M)
    paths, _ = anchor_records("a", block, store_top_k=4)
    tokens, logp = path_arrays(dataclass_rows(paths), GAMMA)
    return ctx, seed, tokens, logp


def _drafter(model, kind: str):
    torch.manual_seed(1)
    cfg = DrafterConfig(kind=kind, gamma=GAMMA, hidden_size=model.config.hidden_size,
                        n_layers=1, n_heads=4, intermediate_size=64, taps=[0, 1], markov_rank=8)
    return build_drafter(cfg, model).eval()


class TargetAsDrafter:
    """A stand-in drafter whose proposal is the target itself: slot k's logits are log p_k
    after the context and predecessors[:, :k] (an order-1 proposal with the whole chain)."""

    order = 1
    gamma = GAMMA
    cfg = SimpleNamespace(taps=[0], kind="target")

    def __init__(self, model, ctx):
        self.model, self.ctx = model, ctx

    def propose(self, features, committed, predecessors, prefix_mask=None):
        p = target_path_probs(self.model, self.ctx, predecessors.cpu(), law=LAW,
                              forward_batch=predecessors.shape[0])
        return torch.log(p).transpose(0, 1)

    def propose_paths(self, features, committed, predecessors, prefix_mask=None, slots=None):
        logits = self.propose(features, committed, predecessors, prefix_mask)
        return logits if slots is None else logits[:, list(slots)]


def _evaluate_at(model, drafter, ctx, seed, tokens, logp):
    at = anchor_target(model, ctx, tokens, logp, law=LAW, forward_batch=M)
    return evaluate_drafter(model, drafter, at, law=LAW, anchor_seed=seed)


def _evaluate(model, drafter, stored):
    return _evaluate_at(model, drafter, *stored)


def test_recomputed_probabilities_match_the_stored_logp(model, stored):
    ev = _evaluate(model, _drafter(model, "dflash"), stored)
    assert float(ev.logp_abs_diff.max()) < 1e-5
    _, slots = anchor_eval_records("a", ev)
    assert sum(s.logp_mismatches for s in slots) == 0
    # order 0: one proposal for every path, no exposure
    f = dataclass_rows(slots)
    assert (f.exposure == 0).all() and (f.risk_self == f.risk).all()


def test_a_drafter_equal_to_the_target_has_no_risk(model, stored):
    ev = _evaluate(model, TargetAsDrafter(model, stored[0]), stored)
    assert float(ev.tv.max()) < 1e-12
    torch.testing.assert_close(ev.accept, torch.ones_like(ev.accept), atol=1e-12, rtol=0)
    tau = accepted_length(joint_survival(ev.accept))
    assert float(tau) == pytest.approx(GAMMA + 1, abs=1e-10)
    sums = serving_risk_sums(ev.accept, ev.tv)
    assert float(sums.ratio.abs().max()) < 1e-12
    _, slots = anchor_eval_records("a", ev)
    assert max(abs(s.risk) for s in slots) < 1e-12


def test_dspark_without_markov_head_has_no_exposure(model, stored):
    drafter = _drafter(model, "dspark")
    with torch.no_grad():
        drafter.markov_head.markov_w2.weight.zero_()
    ev = _evaluate(model, drafter, stored)
    assert ev.self_tokens is not None and ev.self_tokens.shape == (M, GAMMA)
    _, slots = anchor_eval_records("a", ev)
    f = dataclass_rows(slots)
    assert (f.order == 1).all()
    assert (f.exposure.abs() < 1e-12).all()
    assert (f.risk_self - f.risk_oracle).abs().max() < 1e-12
    # a live Markov head makes the proposal depend on the chain
    with torch.no_grad():
        drafter.markov_head.markov_w2.weight.normal_(std=1.0)
    live = dataclass_rows(anchor_eval_records("a", _evaluate(model, drafter, stored))[1])
    assert (live.exposure.abs() > 0).any()


def test_stage_records_are_deterministic(model, smoke_domain_records):
    from floorgap.stages import drafter_eval as eval_cli
    from floorgap.stages import rollouts as rollouts_cli
    from floorgap.models.checkpoints import frozen_fingerprint, trainable_layout, trainable_state

    cfg, target, model_dir, corpus, anchors, out = smoke_domain_records
    out = out / "drafter-eval"
    out.mkdir(parents=True, exist_ok=True)
    roll = dict(cfg["rollouts"], shards=3)  # 2 anchors per shard keep the test small
    spec = {"target": target, "rollouts": roll, "law": cfg["evaluation_law"],
            "gamma": cfg["anchors"]["gamma"], "shard": 0}
    paths = out / "rollouts-paths-0.parquet"
    assert run_stage(rollouts_cli.main, rollouts_cli.build_parser(),
                     ["--spec", json.dumps(spec), "--model-dir", str(model_dir),
                      "--corpus", str(corpus), "--anchors", str(anchors),
                      "--out-paths", str(paths), "--out-floors", str(out / "floors-0.parquet"),
                      "--threads", "1"]) == 0
    drafter = _drafter(model, "dspark")
    with torch.no_grad():
        drafter.markov_head.markov_w2.weight.normal_(std=0.5)
    ckpt = out / "final.pt"
    # the layout of final.pt: config, trainable weights and the training loader's checks
    torch.save({"drafter_config": dataclasses.asdict(drafter.cfg),
                "model": trainable_state(drafter), "trainable_layout": trainable_layout(drafter),
                "frozen_fingerprint": frozen_fingerprint(drafter)}, ckpt)
    results = []
    for run in ("one", "two"):
        o_paths, o_slots = out / run / "paths-0.parquet", out / run / "slots-0.parquet"
        assert run_stage(eval_cli.main, eval_cli.build_parser(),
                         ["--spec", json.dumps(dict(spec, variants=["dspark"])),
                          "--model-dir", str(model_dir), "--corpus", str(corpus),
                          "--anchors", str(anchors), "--rollouts", str(paths),
                          "--drafter", str(ckpt), "--out-paths", str(o_paths),
                          "--out-slots", str(o_slots), "--threads", "1"]) == 0
        results.append((sha256_file(o_paths), sha256_file(o_slots)))
    assert results[0] == results[1]
    # two drafters in one job share the target's side: the records of each are those of a
    # job of its own (and the labels go to the right files)
    torch.save({**torch.load(ckpt, weights_only=True),
                "drafter_config": dataclasses.asdict(_drafter(model, "dflash").cfg),
                "model": trainable_state(_drafter(model, "dflash")),
                "trainable_layout": trainable_layout(_drafter(model, "dflash"))},
               out / "dflash.pt")
    both = out / "both"
    assert run_stage(eval_cli.main, eval_cli.build_parser(),
                     ["--spec", json.dumps(dict(spec, variants=["dflash", "dspark"])),
                      "--model-dir", str(model_dir), "--corpus", str(corpus),
                      "--anchors", str(anchors), "--rollouts", str(paths),
                      "--drafter", str(out / "dflash.pt"), str(ckpt),
                      "--out-paths", str(both / "p-dflash.parquet"), str(both / "p-dspark.parquet"),
                      "--out-slots", str(both / "s-dflash.parquet"), str(both / "s-dspark.parquet"),
                      "--threads", "1"]) == 0
    assert (sha256_file(both / "p-dspark.parquet"), sha256_file(both / "s-dspark.parquet")) \
        == results[0]
    assert read_metadata(both / "p-dflash.parquet")["variant"] == "dflash"
    assert (read_table(both / "s-dflash.parquet").order == 0).all()
    # a label list that does not match the drafters is refused
    assert run_stage(eval_cli.main, eval_cli.build_parser(),
                     ["--spec", json.dumps(dict(spec, variants=["dspark"])),
                      "--model-dir", str(model_dir), "--corpus", str(corpus),
                      "--anchors", str(anchors), "--rollouts", str(paths),
                      "--drafter", str(out / "dflash.pt"), str(ckpt),
                      "--out-paths", str(out / "x.parquet"), "--out-slots", str(out / "y.parquet"),
                      "--threads", "1"]) == 2
    p = read_table(out / "one" / "paths-0.parquet")
    s = read_table(out / "one" / "slots-0.parquet")
    stored = read_table(paths)
    assert len(p) == len(stored) * GAMMA and len(s) == stored.anchor_id.nunique() * GAMMA
    assert (s.logp_mismatches == 0).all()
    assert ((p.accept > 0) & (p.accept <= 1)).all()
    torch.testing.assert_close(
        torch.tensor(p.accept.values),
        torch.minimum(torch.ones(len(p), dtype=torch.float64),
                      torch.tensor((p.q_tok / p.p_tok).values)))


def test_prefix_attention_self_chain_stays_on_its_support(model, stored):
    ev = _evaluate(model, _drafter(model, "prefix_attention"), stored)
    assert ev.order == 1 and (ev.q_self_tok > 0).all()  # drawn from the nominated lattice
    assert torch.isfinite(ev.tv_self).all() and torch.isfinite(ev.tv).all()
    assert ((ev.accept >= 0) & (ev.accept <= 1)).all()


@pytest.mark.parametrize("kind", ["dspark", "prefix_attention"])
def test_oracle_risk_is_at_least_the_order1_floor_on_every_anchor(model, smoke_domain_records,
                                                                 kind):
    """An order-1 drafter fed the target's predecessor proposes one q per (anchor, predecessor),
    so its oracle risk cannot fall below the in-sample order-1 floor of the same paths (the
    plug-in minimum over every such q): R^oracle_k >= T^(1)_k per anchor and slot."""
    from floorgap.data.anchors import anchor_contexts

    _, _, _, corpus, anchors, _ = smoke_domain_records
    table = read_table(anchors)
    contexts = anchor_contexts(read_table(corpus), table)
    drafter = _drafter(model, kind)
    if kind == "dspark":
        with torch.no_grad():
            drafter.markov_head.markov_w2.weight.normal_(std=1.0)  # a live predecessor correction
    checked = 0
    for a, ctx in zip(table.itertuples(index=False), contexts, strict=True):
        seed = int(a.anchor_seed)
        block = sample_block(model, ctx, n_paths=M, gamma=GAMMA, law=LAW, anchor_seed=seed,
                             forward_batch=M)
        paths, floors = anchor_records(a.anchor_id, block, store_top_k=4)
        tokens, logp = path_arrays(dataclass_rows(paths), GAMMA)
        ev = _evaluate_at(model, drafter, ctx, seed, tokens, logp)
        _, slots = anchor_eval_records(a.anchor_id, ev)
        t1 = {f.slot: f.t1_plugin for f in floors}
        for s in slots:
            assert s.risk_oracle >= t1[s.slot] - 1e-9, (a.anchor_id, s.slot)
            checked += 1
    assert checked == len(table) * GAMMA
