"""The mutual-information probe on a tiny random Llama: exact conditioned reads, the blind
mixture, the re-weighted mixture, the screen, and determinism."""

from __future__ import annotations

import math

import pytest
import torch

from floorgap.probes.mi import (MEASURE_KEY, SCREEN_KEY, anchor_cells, cell_starts,
                                conditioned_logprobs, measure_anchor, screen_anchor)
from floorgap.probes.rollouts import sample_block
from floorgap.sampling import SamplingLaw
from floorgap.seeds import derive_seed

GAMMA = 6
M = 7
ORDERS = (1, 2, 4)
SEED = 1234
CTX = [3, 17, 5, 40, 22, 9, 31, 2, 11]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread, as the stages run under ``--threads 1``: with two, the CPU kernels'
    blocking (and so the last bits) can differ between forwards of the same shape."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      initializer_range=0.3, tie_word_embeddings=False)
    m = LlamaForCausalLM(cfg).eval()
    m.requires_grad_(False)
    return m


@torch.inference_mode()
def _full_logp(model, ids: list[int], token: int) -> float:
    """log p(token | ids) from one fresh forward of the whole sequence (no cache)."""
    logits = model(input_ids=torch.tensor([ids])).logits[0, -1].double()
    return float(torch.log_softmax(logits, -1)[token])


def _measure(model, **kw):
    return measure_anchor(model, CTX, n_paths=M, gamma=GAMMA, orders=ORDERS, law=SamplingLaw(),
                          anchor_seed=SEED, forward_batch=4, **kw)


@pytest.fixture(scope="module")
def measured(model):
    return _measure(model)


def test_cell_starts():
    # m < k < 6: start j scores k = j + m; m=1 -> j 1..4, m=2 -> j 1..3, m=4 -> j 1
    assert cell_starts(6, (1, 2, 4)) == {1: 5, 2: 4, 3: 5, 4: 5}
    assert cell_starts(7, (1,)) == {1: 2, 2: 3, 3: 4, 4: 5, 5: 6}
    assert cell_starts(2, (1,)) == {}
    assert cell_starts(3, (2,)) == {}


def test_conditioned_reads_equal_full_forwards(model):
    gen = torch.Generator().manual_seed(5)
    prefixes = torch.randint(0, 64, (5, GAMMA), generator=gen)
    z_star = torch.randint(0, 64, (GAMMA,), generator=gen)
    starts = {1: 4, 2: 5, 4: 5}
    out = conditioned_logprobs(model, CTX, prefixes, z_star, starts, law=SamplingLaw(),
                               forward_batch=3)
    for j, last in starts.items():
        assert out[j].shape == (5, last - j + 1)
        for s in range(5):
            for i in range(last - j + 1):
                ids = CTX + prefixes[s, :j].tolist() + z_star[j:j + i].tolist()
                want = _full_logp(model, ids, int(z_star[j + i]))
                # float32 rounding only: the paths' attention (shared prefix) and the full
                # forward's (sdpa) sum in different orders
                assert abs(float(out[j][s, i]) - want) < 1e-5, (j, s, i)


def test_conditioned_reads_under_a_temperature(model):
    gen = torch.Generator().manual_seed(6)
    prefixes = torch.randint(0, 64, (2, GAMMA), generator=gen)
    z_star = torch.randint(0, 64, (GAMMA,), generator=gen)
    law = SamplingLaw(temperature=0.7)
    out = conditioned_logprobs(model, CTX, prefixes, z_star, {2: 4}, law=law, forward_batch=2)
    with torch.inference_mode():
        ids = CTX + prefixes[1, :2].tolist() + z_star[2:4].tolist()
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1].double()
    want = float(torch.log(law.probs(logits))[int(z_star[4])])
    assert abs(float(out[2][1, 2]) - want) < 2e-6
    truncated = SamplingLaw(top_k=5)
    out = conditioned_logprobs(model, CTX, prefixes, z_star, {2: 4}, law=truncated,
                               forward_batch=2)
    want = float(torch.log(truncated.probs(logits))[int(z_star[4])])
    assert out[2][1, 2].item() == pytest.approx(want, abs=2e-6) or (
        math.isinf(want) and math.isinf(out[2][1, 2].item()))


def test_blind_and_teacher_losses_match_independent_forwards(model, measured):
    block = sample_block(model, CTX, n_paths=M, gamma=GAMMA, law=SamplingLaw(),
                         anchor_seed=derive_seed(SEED, MEASURE_KEY), forward_batch=4)
    assert torch.equal(block.tokens, measured.tokens)
    z = measured.tokens[0].tolist()
    L = measured.losses
    for k in range(1, GAMMA):
        c_kk = -_full_logp(model, CTX + z[:k], z[k])
        ps = [math.exp(_full_logp(model, CTX + measured.tokens[s, :k].tolist(), z[k]))
              for s in range(1, M)]
        c_k0 = -math.log(sum(ps) / (M - 1))
        assert abs(float(L.c_kk[k]) - c_kk) < 1e-5, k
        assert abs(float(L.c_k0[k]) - c_k0) < 1e-5, k
    # slot 0: nothing is realised yet, so there is no cell (the records start at slot 1)
    assert math.isnan(float(L.c_k0[0])) and math.isnan(float(L.c_kk[0]))


def test_reweighted_losses_match_independent_forwards(model, measured):
    z = measured.tokens[0].tolist()
    L = measured.losses
    for k in range(GAMMA):
        for jm, m in enumerate(ORDERS):
            if m >= k:
                assert math.isnan(float(L.c_km[k, jm])) and math.isnan(float(L.ess[k, jm]))
                continue
            logw, logp = [], []
            for s in range(1, M):
                head = measured.tokens[s, :k - m].tolist()
                logw.append(sum(_full_logp(model, CTX + head + z[k - m:i], z[i])
                                for i in range(k - m, k)))
                logp.append(_full_logp(model, CTX + head + z[k - m:k], z[k]))
            w = torch.tensor(logw, dtype=torch.float64)
            p = torch.tensor(logp, dtype=torch.float64)
            c_km = -float(torch.logsumexp(w + p, 0) - torch.logsumexp(w, 0))
            ess = float(torch.exp(w).sum() ** 2 / torch.exp(2 * w).sum())
            assert abs(float(L.c_km[k, jm]) - c_km) < 1e-5, (k, m)
            assert abs(float(L.ess[k, jm]) - ess) < 1e-4 * ess, (k, m)
            assert 1 - 1e-9 <= float(L.ess[k, jm]) <= M - 1 + 1e-9


def test_screen_is_leave_one_out_at_the_final_slot(model):
    S = 5
    res = screen_anchor(model, CTX, n_paths=S, gamma=GAMMA, law=SamplingLaw(), anchor_seed=SEED,
                        forward_batch=4)
    block = sample_block(model, CTX, n_paths=S, gamma=GAMMA, law=SamplingLaw(),
                         anchor_seed=derive_seed(SEED, SCREEN_KEY), forward_batch=4)
    k = GAMMA - 1
    want = []
    for r in range(S):
        zr = int(block.tokens[r, k])
        own = _full_logp(model, CTX + block.tokens[r, :k].tolist(), zr)
        others = [math.exp(_full_logp(model, CTX + block.tokens[s, :k].tolist(), zr))
                  for s in range(S) if s != r]
        want.append(-math.log(sum(others) / (S - 1)) + own)
    torch.testing.assert_close(res.per_path, torch.tensor(want, dtype=torch.float64),
                               atol=1e-5, rtol=0)
    assert res.value == pytest.approx(sum(want) / S, abs=1e-5)


def test_deterministic_and_independent_of_chunking(model, measured):
    again = _measure(model)
    chunked = _measure(model, chunk_paths=3)
    for other in (again, chunked):
        assert torch.equal(other.tokens, measured.tokens)
        for name in ("c_kk", "c_k0", "c_km", "ess"):
            a, b = getattr(other.losses, name), getattr(measured.losses, name)
            assert torch.equal(torch.nan_to_num(a, nan=-1.0), torch.nan_to_num(b, nan=-1.0))
    s1 = screen_anchor(model, CTX, n_paths=4, gamma=GAMMA, law=SamplingLaw(), anchor_seed=SEED,
                       forward_batch=4)
    s2 = screen_anchor(model, CTX, n_paths=4, gamma=GAMMA, law=SamplingLaw(), anchor_seed=SEED,
                       forward_batch=4, chunk_paths=2)
    assert torch.equal(s1.per_path, s2.per_path)
    # the measurement, the screen and the rollouts draw different paths
    rollout = sample_block(model, CTX, n_paths=M, gamma=GAMMA, law=SamplingLaw(),
                           anchor_seed=SEED, forward_batch=4)
    assert not torch.equal(rollout.tokens, measured.tokens)


def test_anchor_cells_layout(measured):
    class Anchor:
        anchor_id, prompt_id, domain, pi = "d:p@3", "d:p", "d", 0.25

    screen = type("S", (), {"value": 0.7})()
    rows = anchor_cells(Anchor, screen, measured, screened=True, gamma=GAMMA, orders=ORDERS)
    assert len(rows) == (GAMMA - 1) * len(ORDERS)
    assert {(r.slot, r.order) for r in rows} == {(k, m) for k in range(1, GAMMA) for m in ORDERS}
    cell = next(r for r in rows if r.slot == 3 and r.order == 1)
    assert cell.c_km == float(measured.losses.c_km[3, 0])
    assert cell.token == int(measured.tokens[0, 3]) and cell.screen == 0.7
    out = anchor_cells(Anchor, screen, None, screened=False, gamma=GAMMA, orders=ORDERS)
    assert len(out) == len(rows) and all(math.isnan(r.c_k0) and not r.screened for r in out)


@pytest.mark.slow
def test_cli_records_are_deterministic(smoke_domain_records):
    """The stage CLI on the smoke target: one row per anchor x slot x order, byte-identical
    records from two runs, and screened-out anchors kept with their screen value."""
    import json

    from floorgap.stages import mi as mi_cli
    from floorgap.stages._cli import run_stage
    from floorgap.records import read_metadata, read_table, sha256_file

    cfg, target, model_dir, corpus, anchors, out = smoke_domain_records
    gamma = int(cfg["anchors"]["gamma"])
    mi_cfg = {k: v for k, v in cfg["mi"].items() if k != "ess_gates"}
    # a threshold between the anchors' screen values puts some on each side
    outs = []
    for name, threshold in (("a", mi_cfg["threshold_nats"]), ("b", mi_cfg["threshold_nats"]),
                            ("c", None)):
        if threshold is None:
            vals = sorted(read_table(outs[0]).drop_duplicates("anchor_id").screen)
            threshold = (vals[0] + vals[-1]) / 2 if vals[0] < vals[-1] else vals[0]
        spec = {"target": target, "mi": dict(mi_cfg, threshold_nats=threshold),
                "law": cfg["evaluation_law"], "gamma": gamma,
                "forward_batch": cfg["rollouts"]["forward_batch"]}
        path = out / f"mi-{name}.parquet"
        assert run_stage(mi_cli.main, mi_cli.build_parser(),
                         ["--spec", json.dumps(spec), "--model-dir", str(model_dir),
                          "--corpus", str(corpus), "--anchors", str(anchors),
                          "--out", str(path), "--threads", "1"]) == 0
        outs.append(path)
    assert sha256_file(outs[0]) == sha256_file(outs[1])
    table = read_table(outs[0])
    n_anchors = len(read_table(anchors))
    assert len(table) == n_anchors * (gamma - 1) * len(mi_cfg["orders"])
    assert list(table.columns[:6]) == ["anchor_id", "prompt_id", "domain", "pi", "slot", "order"]
    meta = read_metadata(outs[0])
    assert meta["anchors"] == n_anchors and meta["screened"] == table.drop_duplicates(
        "anchor_id").screened.sum()
    split = read_table(outs[2])
    per = split.drop_duplicates("anchor_id")
    # the screen does not depend on the threshold; the measurement is unchanged where it runs
    assert per.screen.tolist() == table.drop_duplicates("anchor_id").screen.tolist()
    assert 0 < per.screened.sum() < len(per)
    both = split.screened & table.screened
    assert both.any()
    for col in ("c_k0", "c_km", "c_kk", "ess", "token"):
        assert split[both][col].fillna(-1).tolist() == table[both][col].fillna(-1).tolist()
    assert split[~split.screened].c_k0.isna().all()


def test_every_term_of_a_ratio_comes_from_one_pass(model, measured, monkeypatch):
    """C_{k,k}, C_{k,0} and C_{k,m} are read from the same teacher-forced pass: shifting every
    log-probability of that pass by a constant shifts all three losses alike, so the recovery
    numerator C_{k,0} - C_{k,m} and denominator C_{k,0} - C_{k,k} do not move. (When C_{k,k}
    and C_{k,0} came from the float32 probabilities read while sampling, they did not shift
    and every difference moved by the constant.)"""
    import floorgap.probes.mi as mi_probe

    real = mi_probe.conditioned_logprobs
    calls = []

    def shifted(*args, **kwargs):
        calls.append(1)
        return {j: v + 0.5 for j, v in real(*args, **kwargs).items()}

    monkeypatch.setattr(mi_probe, "conditioned_logprobs", shifted)
    moved = _measure(model)
    assert len(calls) == 1
    a, b = measured.losses, moved.losses
    deep = slice(1, GAMMA)
    torch.testing.assert_close(b.c_kk[deep], a.c_kk[deep] - 0.5, rtol=0, atol=1e-12)
    torch.testing.assert_close(b.c_k0[deep], a.c_k0[deep] - 0.5, rtol=0, atol=1e-12)
    num_a, num_b = a.c_k0.unsqueeze(-1) - a.c_km, b.c_k0.unsqueeze(-1) - b.c_km
    torch.testing.assert_close(num_b, num_a, rtol=0, atol=1e-12, equal_nan=True)
    torch.testing.assert_close((b.c_k0 - b.c_kk)[deep], (a.c_k0 - a.c_kk)[deep], rtol=0,
                               atol=1e-12)
