"""The drafter stage on the smoke target: training data (drafter_data) and training (drafter)."""

from __future__ import annotations

import json

import pytest
import torch

from floorgap.stages import drafters as train_cli
from floorgap.stages import drafter_data as data_cli
from floorgap.stages._cli import run_stage
from floorgap.models.examples import block_index, load_drafter_data, sequence
from floorgap.models.checkpoints import load_final
from floorgap.models.drafter_training import heldout_sequences
from floorgap.records import read_table
from floorgap.sampling import SamplingLaw


def _data_spec(cfg, target, **overrides):
    td = dict(cfg["drafters"]["training_data"], prompts_per_domain=2, top_k_targets=8,
              **overrides)
    return {"target": target, "domains": [{"name": "gsm8k", **cfg["domains"]["gsm8k"]}],
            "training_data": td, "corpus": cfg["corpus"], "gamma": cfg["anchors"]["gamma"],
            "evaluation_law": cfg["evaluation_law"], "seed": cfg["seed"]}


def _make_data(smoke_domain_records, out):
    cfg, target, model_dir, corpus, _, _ = smoke_domain_records
    spec = _data_spec(cfg, target)
    assert run_stage(data_cli.main, data_cli.build_parser(),
                     ["--spec", json.dumps(spec), "--model-dir", str(model_dir), "--corpus",
                      str(corpus), "--out", str(out), "--threads", "1"]) == 0
    return load_drafter_data(out)


@pytest.fixture(scope="module")
def train_data(smoke_domain_records):
    out = smoke_domain_records[-1] / "drafters" / "train_data.pt"
    return out, _make_data(smoke_domain_records, out)


def test_training_data_deterministic_and_disjoint(smoke_domain_records, train_data, tmp_path):
    cfg, _, _, corpus, _, _ = smoke_domain_records
    _, data = train_data
    again = _make_data(smoke_domain_records, tmp_path / "again.pt")
    for key, value in data.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, again[key]), key
    assert data["seq_prompt_ids"] == again["seq_prompt_ids"]
    evaluation = set(read_table(corpus)["prompt_id"])
    assert evaluation and not evaluation & set(data["seq_prompt_ids"])
    assert sorted(data["metadata"]["excluded_prompt_ids"]["gsm8k"]) == sorted(evaluation)
    gamma = cfg["anchors"]["gamma"]
    n_seq = len(data["seq_prompt_ids"])
    resp = data["seq_offsets"].diff() - data["seq_prompt_len"]
    assert n_seq > 0 and (resp >= gamma).all()
    assert torch.equal(data["pos_offsets"].diff(), resp)      # one target row per response token
    assert data["target_ids"].shape == data["target_vals"].shape == (int(resp.sum()), 8)
    seq, ctx = block_index(data, gamma)                        # every response position a start
    assert len(seq) == int((resp - gamma + 1).sum())
    for s in range(n_seq):
        c = ctx[seq == s]
        lp = int(data["seq_prompt_len"][s])
        assert c.tolist() == list(range(lp, lp + int(resp[s]) - gamma + 1))


def test_topk_targets_match_fresh_forward(smoke_domain_records, train_data):
    from floorgap.models.targets import load_target

    cfg, target, model_dir, *_ = smoke_domain_records
    _, data = train_data
    law = SamplingLaw.from_spec(cfg["evaluation_law"])      # targets: the evaluation law
    model, _ = load_target(model_dir, target["dtype"], "cpu")
    for s in range(len(data["seq_prompt_ids"])):
        ids = sequence(data, s)[None]
        lp = int(data["seq_prompt_len"][s])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, lp - 1:-1]
        vals, top = law.probs(logits).topk(8, dim=-1)
        a, b = int(data["pos_offsets"][s]), int(data["pos_offsets"][s + 1])
        torch.testing.assert_close(data["target_vals"][a:b], vals.float(), atol=1e-5, rtol=1e-4)
        keep = vals > 1e-4                                             # ids of clearly kept mass
        assert torch.equal(data["target_ids"][a:b].long()[keep], top[keep])


def test_drafter_cli_trains_resumes_and_loads(smoke_domain_records, train_data, tmp_path):
    from floorgap.models.targets import load_target

    cfg, target, model_dir, *_ = smoke_domain_records
    data_path, data = train_data
    spec = {"target": target, "variant": {"name": "ours", **cfg["drafters"]["variants"]["ours"]},
            "taps": cfg["drafters"]["taps"], "train": dict(cfg["drafters"]["train"], epochs=1),
            "gamma": cfg["anchors"]["gamma"], "seed": cfg["seed"]}
    final, ckpts, log = tmp_path / "ours" / "final.pt", tmp_path / "ours" / "checkpoints", tmp_path / "log.jsonl"
    argv = ["--spec", json.dumps(spec), "--model-dir", str(model_dir), "--data", str(data_path),
            "--out", str(final), "--checkpoints", str(ckpts), "--train-log", str(log),
            "--threads", "1", "--no-progress"]
    assert run_stage(train_cli.main, train_cli.build_parser(), argv) == 0
    first = torch.load(final, weights_only=True)
    epoch_ckpt = ckpts / "epoch-0001.pt"
    stamp = epoch_ckpt.stat().st_mtime_ns
    records = [json.loads(line) for line in log.read_text().splitlines()]
    epoch = [r for r in records if r["kind"] == "epoch"]
    assert len(epoch) == 1 and epoch[0]["tokens_per_s"] > 0
    # the blocks of the sequences outside the held-out share; the held-out ones score the epoch
    held = heldout_sequences(data, cfg["drafters"]["train"]["heldout"], cfg["seed"])
    seq = block_index(data, cfg["anchors"]["gamma"])[0]
    assert held and epoch[0]["examples"] == int((~torch.isin(seq, torch.tensor(held))).sum())
    assert epoch[0]["heldout"]["blocks"] == int(torch.isin(seq, torch.tensor(held)).sum())
    assert first["kept_epoch"] == 1

    # Same output again: every epoch is checkpointed, so nothing is trained.
    assert run_stage(train_cli.main, train_cli.build_parser(), argv) == 0
    second = torch.load(final, weights_only=True)
    assert epoch_ckpt.stat().st_mtime_ns == stamp
    assert second["model"].keys() == first["model"].keys()
    for k in first["model"]:
        assert torch.equal(first["model"][k], second["model"][k])

    model, _ = load_target(model_dir, target["dtype"], "cpu")
    drafter = load_final(final, model)
    assert drafter.cfg.kind == "prefix_attention" and drafter.cfg.taps == cfg["drafters"]["taps"]
    params = dict(drafter.named_parameters())
    for k, v in first["model"].items():
        assert torch.equal(params[k].detach(), v)


def test_a_target_scaled_drafter_records_the_targets_residual_scale(smoke_domain_records,
                                                                     train_data, tmp_path):
    """init: target_scaled starts the layers as the target's last ones and scales the block
    rows by the residual scale measured on the first training sequences, kept in the drafter's
    config (so the evaluation rebuilds it)."""
    from floorgap.models.drafter_training import SCALE_SEQUENCES, split_sequences
    from floorgap.models.from_target import residual_scale
    from floorgap.models.targets import load_target

    cfg, target, model_dir, *_ = smoke_domain_records
    data_path, data = train_data
    variant = dict(cfg["drafters"]["variants"]["dflash"], name="dflash", init="target_scaled")
    spec = {"target": target, "variant": variant, "taps": cfg["drafters"]["taps"],
            "train": dict(cfg["drafters"]["train"], epochs=1), "gamma": cfg["anchors"]["gamma"],
            "seed": cfg["seed"]}
    final, log = tmp_path / "scaled" / "final.pt", tmp_path / "stage.log"
    argv = ["--spec", json.dumps(spec), "--model-dir", str(model_dir), "--data", str(data_path),
            "--out", str(final), "--checkpoints", str(tmp_path / "ckpt"), "--train-log",
            str(tmp_path / "train.jsonl"), "--threads", "1", "--no-progress", "--log", str(log)]
    assert run_stage(train_cli.main, train_cli.build_parser(), argv) == 0
    model, _ = load_target(model_dir, target["dtype"], "cpu")
    train_seqs, _ = split_sequences(data, spec)
    expected = residual_scale(model, [sequence(data, i) for i in train_seqs[:SCALE_SEQUENCES]],
                              int(variant["layers"]))
    drafter = load_final(final, model)
    assert drafter.cfg.input_scale == pytest.approx(expected) and expected != pytest.approx(1.0)
    assert "block rows scaled by" in log.read_text()
    assert "fusion starts as tap 0" in log.read_text()


def test_drafter_cli_exports_every_epoch_and_shares_seed_keys(smoke_domain_records, train_data,
                                                              tmp_path):
    """export_epochs writes epoch-<e>.pt in the final format (the last equals final.pt); two
    arms with one seed_key and the same architecture train to the same weights."""
    from floorgap.models.targets import load_target
    from floorgap.probes.drafter_eval import load_trained_drafter

    cfg, target, model_dir, *_ = smoke_domain_records
    data_path, _ = train_data
    arm = dict(cfg["drafters"]["variants"]["dspark"], seed_key="components")

    def run(name, export):
        spec = {"target": target, "variant": {"name": name, **arm},
                "taps": cfg["drafters"]["taps"], "train": dict(cfg["drafters"]["train"], epochs=2),
                "gamma": cfg["anchors"]["gamma"], "seed": cfg["seed"], "export_epochs": export}
        out = tmp_path / name
        argv = ["--spec", json.dumps(spec), "--model-dir", str(model_dir), "--data",
                str(data_path), "--out", str(out / "final.pt"), "--checkpoints",
                str(out / "checkpoints"), "--epochs-dir", str(out / "epochs"), "--threads", "1",
                "--no-progress"]
        assert run_stage(train_cli.main, train_cli.build_parser(), argv) == 0
        return out

    a, b = run("arm_a", True), run("arm_b", False)
    assert sorted(p.name for p in (a / "epochs").iterdir()) == ["epoch-1.pt", "epoch-2.pt"]
    assert list((b / "epochs").iterdir()) == []  # created, empty: not a trajectory variant
    final_a = torch.load(a / "final.pt", weights_only=True)
    final_b = torch.load(b / "final.pt", weights_only=True)
    last = torch.load(a / "epochs" / "epoch-2.pt", weights_only=True)
    first = torch.load(a / "epochs" / "epoch-1.pt", weights_only=True)
    assert last["epoch"] == 2 and first["epoch"] == 1
    assert [r["epoch"] for r in last["epochs"]] == [1, 2]
    for k, v in final_a["model"].items():
        assert torch.equal(last["model"][k], v)
        assert torch.equal(final_b["model"][k], v)  # same seed key, same draws
    assert any(not torch.equal(first["model"][k], v) for k, v in final_a["model"].items())
    model, _ = load_target(model_dir, target["dtype"], "cpu")
    drafter = load_trained_drafter(a / "epochs" / "epoch-1.pt", model)
    params = dict(drafter.named_parameters())
    for k, v in first["model"].items():
        assert torch.equal(params[k].detach(), v)


def test_block_batches_cover_every_block_once_per_sequence(smoke_domain_records, train_data):
    """Grouped batches: each holds blocks of one sequence, an epoch covers every block once,
    the order is keyed by (seed, epoch), a batch equals its blocks taken one by one, and block
    budgets keep nested sets of whole sequences."""
    from floorgap.models.examples import BlockExamples
    from floorgap.models.targets import load_target

    cfg, target, model_dir, *_ = smoke_domain_records
    _, data = train_data
    gamma = cfg["anchors"]["gamma"]
    model, _ = load_target(model_dir, target["dtype"], "cpu")
    ds = BlockExamples(data, model, cfg["drafters"]["taps"], gamma, seed=5)
    batches = ds.epoch_batches(4, seed=9, epoch=0)
    assert sorted(torch.cat(batches).tolist()) == list(range(len(ds)))
    assert all(len(ds.block_seq[b].unique()) == 1 for b in batches)
    assert all(torch.equal(a, b) for a, b in zip(batches, ds.epoch_batches(4, seed=9, epoch=0)))
    assert any(not torch.equal(a, b) for a, b in zip(batches, ds.epoch_batches(4, 9, 1)))
    batch = ds.gather(batches[0])
    for row, i in enumerate(batches[0].tolist()):
        one = ds.gather(torch.tensor([i]))
        n = int(batch["prefix_mask"][row].sum())
        assert n == one["features"].shape[1] == int(one["prefix_mask"].sum())
        assert torch.equal(batch["features"][0, :n], one["features"][0])
        for key in ("committed", "block_tokens", "target_ids", "target_vals"):
            assert torch.equal(batch[key][row], one[key][0]), key
    small = BlockExamples(data, model, cfg["drafters"]["taps"], gamma, seed=5, max_blocks=1)
    assert len(small.sequences) == 1 and set(small.sequences) <= set(ds.sequences)
    # streamed features (train.features: stream): nothing held, every batch the same
    streamed = BlockExamples(data, model, cfg["drafters"]["taps"], gamma, seed=5, stream=True)
    assert streamed.prepare() == 0.0 and streamed.features is None
    for b in batches:
        got, want = streamed.gather(b), ds.gather(b)
        assert streamed.features is None
        for key, value in want.items():
            assert torch.equal(got[key], value), key


def test_stored_features_are_the_computed_ones(smoke_domain_records, train_data, tmp_path):
    """A record written with store_features holds, per sequence, exactly the features training
    would compute (fp32 target, same taps), and BlockExamples reads them instead; other taps fall
    back to computing. The targets are the same as without features."""
    from floorgap.models.examples import BlockExamples
    from floorgap.models.from_target import target_features
    from floorgap.models.targets import load_target

    cfg, target, model_dir, corpus, _, _ = smoke_domain_records
    taps = cfg["drafters"]["taps"]
    spec = dict(_data_spec(cfg, target), features={"taps": taps, "dtype": "float32"})
    out = tmp_path / "with_features.pt"
    assert run_stage(data_cli.main, data_cli.build_parser(),
                     ["--spec", json.dumps(spec), "--model-dir", str(model_dir), "--corpus",
                      str(corpus), "--out", str(out), "--threads", "1"]) == 0
    stored = load_drafter_data(out)
    _, plain = train_data
    assert "features" not in plain and plain["metadata"]["features"] is None
    assert stored["metadata"]["features"] == {"taps": taps, "dtype": "float32"}
    for key in ("tokens", "target_ids", "target_vals"):
        assert torch.equal(stored[key], plain[key]), key
    model, _ = load_target(model_dir, target["dtype"], "cpu")
    assert stored["features"].shape[0] == stored["tokens"].shape[0]
    for s in range(len(stored["seq_prompt_ids"])):
        ids = sequence(stored, s)[None]
        with torch.no_grad():
            fresh = target_features(model, ids, torch.ones_like(ids), taps)[0]
        a, b = int(stored["seq_offsets"][s]), int(stored["seq_offsets"][s + 1])
        torch.testing.assert_close(stored["features"][a:b], fresh, rtol=1e-5, atol=1e-5)
    gamma = cfg["anchors"]["gamma"]
    read = BlockExamples(stored, model, taps, gamma, seed=5)
    computed = BlockExamples(plain, model, taps, gamma, seed=5)
    assert read.stored_features() and not computed.stored_features()
    assert not BlockExamples(stored, model, taps[:1], gamma, seed=5).stored_features()
    read.prepare(), computed.prepare()
    for s in read.sequences:
        torch.testing.assert_close(read.features[s], computed.features[s], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_drafter_cli_trains_under_torchrun_with_two_processes(smoke_domain_records, train_data,
                                                             tmp_path):
    """``train.processes: 2`` re-executes the stage under torchrun: both ranks train, rank 0
    writes final.pt, which records two processes and one epoch on the same blocks as one
    process."""
    cfg, target, model_dir, *_ = smoke_domain_records
    data_path, data = train_data
    spec = {"target": target, "variant": {"name": "dflash", **cfg["drafters"]["variants"]["dflash"]},
            "taps": cfg["drafters"]["taps"],
            "train": dict(cfg["drafters"]["train"], epochs=1, processes=2),
            "gamma": cfg["anchors"]["gamma"], "seed": cfg["seed"]}
    out = tmp_path / "dflash"
    argv = ["--spec", json.dumps(spec), "--model-dir", str(model_dir), "--data", str(data_path),
            "--out", str(out / "final.pt"), "--checkpoints", str(out / "checkpoints"),
            "--threads", "1", "--no-progress"]
    assert run_stage(train_cli.main, train_cli.build_parser(), argv) == 0
    final = torch.load(out / "final.pt", weights_only=True)
    epochs = spec["variant"].get("epochs", 1)
    assert final["processes"] == 2 and [e["epoch"] for e in final["epochs"]] == [
        e + 1 for e in range(epochs)]
    assert 1 <= final["kept_epoch"] <= epochs
    held = heldout_sequences(data, cfg["drafters"]["train"]["heldout"], cfg["seed"])
    seq = block_index(data, cfg["anchors"]["gamma"])[0]
    assert final["epochs"][0]["examples"] == int((~torch.isin(seq, torch.tensor(held))).sum())


def test_a_training_corpus_replaces_the_domains_and_skips_evaluation_texts(smoke_domain_records,
                                                                           tmp_path):
    """training_data.corpus: the prompts come from that one source (ShareGPT conversations, as
    Open-PerfectBlend stores them), labelled `training`, and no evaluation text is among them."""
    cfg, target, model_dir, corpus, _, _ = smoke_domain_records
    evaluation = read_table(corpus)
    taken = str(evaluation["prompt_text"].iloc[0])
    rows = [{"conversations": [{"from": "human", "value": text},
                               {"from": "gpt", "value": "an answer"}]}
            for text in (taken, "Name three prime numbers.", "Write a haiku about rain.")]
    path = tmp_path / "blend.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = _data_spec(cfg, target, corpus={"source": f"jsonl:{path}",
                                           "text_field": "conversations", "prompts": 2})
    out = tmp_path / "corpus_data.pt"
    assert run_stage(data_cli.main, data_cli.build_parser(),
                     ["--spec", json.dumps(spec), "--model-dir", str(model_dir), "--corpus",
                      str(corpus), "--out", str(out), "--threads", "1"]) == 0
    data = load_drafter_data(out)
    meta = data["metadata"]
    assert meta["domains"] == ["training"] and set(data["seq_domains"]) <= {"training"}
    assert meta["counts"]["training"]["selected"] == 2
    ids = set(data["seq_prompt_ids"])
    assert ids and all(i.startswith("training:") for i in ids)
    from floorgap.data.domains import prompt_id
    from floorgap.data.drafter_data import training_domains
    assert prompt_id("training", taken) not in ids
    # an evaluation text of any domain is excluded from the corpus under the corpus's label
    _, excluded, n = training_domains(spec, {"gsm8k": {prompt_id("gsm8k", taken)}})
    assert excluded == {"training": {prompt_id("training", taken)}} and n == {"training": 2}


def test_a_bf16_data_pass_states_its_law_against_the_targets_own(smoke_domain_records,
                                                                 tmp_path) -> None:
    """training_data.dtype runs the data pass in a cast copy of the target: the record says so,
    its targets agree with a teacher-forced forward of that copy, and its law is compared with
    the target's own precision (TV stored)."""
    cfg, target, model_dir, corpus, _, _ = smoke_domain_records
    spec = _data_spec(cfg, target, dtype="bfloat16")
    out = tmp_path / "bf16.pt"
    assert run_stage(data_cli.main, data_cli.build_parser(),
                     ["--spec", json.dumps(spec), "--model-dir", str(model_dir), "--corpus",
                      str(corpus), "--out", str(out), "--threads", "1"]) == 0
    meta = load_drafter_data(out)["metadata"]
    assert meta["dtype"] == target["dtype"] == "float32" and meta["data_dtype"] == "bfloat16"
    agreement, law = meta["teacher_forced_agreement"], meta["precision_agreement"]
    assert agreement["dtype"] == "bfloat16" and agreement["mean_tv"] <= 0.05
    assert (law["dtype"], law["reference_dtype"]) == ("bfloat16", "float32")
    assert law["positions"] == agreement["positions"] > 0
    assert 0 < law["mean_tv"] <= law["p99_tv"] <= law["max_tv"] < 0.5


def test_a_killed_drafter_data_job_resumes_to_the_same_record(smoke_domain_records, tmp_path,
                                                             monkeypatch):
    """Finished response batches are journalled (tokens in the journal, targets and features
    in its batch folder): a job killed in its second batch, rerun, decodes only what is missing
    and writes the record an uninterrupted job writes; both are gone afterwards."""
    import floorgap.data.drafter_data as data_module

    cfg, target, model_dir, corpus, _, _ = smoke_domain_records
    spec = dict(_data_spec(cfg, target, batch_size=1),
                features={"taps": cfg["drafters"]["taps"], "dtype": "float32"})

    def run(out):
        return run_stage(data_cli.main, data_cli.build_parser(),
                         ["--spec", json.dumps(spec), "--model-dir", str(model_dir), "--corpus",
                          str(corpus), "--out", str(out), "--threads", "1"])

    assert run(tmp_path / "clean.pt") == 0
    real, calls = data_module.decode_with_targets, []

    def dies_in_the_second_batch(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt("killed")
        return real(*a, **k)

    monkeypatch.setattr(data_module, "decode_with_targets", dies_in_the_second_batch)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "cut.pt")
    journal = tmp_path / "cut.pt.journal.jsonl"
    batches = tmp_path / "cut.pt.journal.jsonl.batches"
    assert journal.exists() and len(list(batches.iterdir())) == 1
    assert not (tmp_path / "cut.pt").exists()
    monkeypatch.setattr(data_module, "decode_with_targets", real)
    assert run(tmp_path / "cut.pt") == 0
    clean, resumed = load_drafter_data(tmp_path / "clean.pt"), load_drafter_data(tmp_path / "cut.pt")
    for key, value in clean.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, resumed[key]), key
    assert clean["seq_prompt_ids"] == resumed["seq_prompt_ids"]
    assert resumed["metadata"]["resumed_batches"] == 1
    assert not journal.exists() and not batches.exists()


def test_more_processes_than_visible_gpus_is_refused_by_name(tmp_path, monkeypatch):
    """Each data-parallel rank trains on its own GPU: asking for more ranks than the job sees
    stops before anything loads, naming the setting and both fixes."""
    import argparse
    import logging

    from floorgap.errors import StageError

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    spec = {"target": {"name": "t", "device": "cuda", "dtype": "bfloat16"},
            "variant": {"name": "dflash", "kind": "dflash", "layers": 1},
            "train": {"processes": 2}}
    args = argparse.Namespace(spec=spec, data=tmp_path / "absent.pt", argv=[])
    with pytest.raises(StageError, match="processes is 2 but this job sees 1 GPU"):
        train_cli.main(args, logging.getLogger("test"))
