"""A folder against the weights it was exported from (floorgap.probes.export_fidelity): a
faithful export reads back to the same proposals; each injected fault of the kind engines meet
(block rows shifted by one, the wrong mask token, the taps' feature columns permuted) shows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from floorgap.models.export_faults import inject_fault
from floorgap.sampling import SamplingLaw

from conftest import permute_taps

LAW = SamplingLaw(temperature=1.0, top_p=1.0, top_k=0)
#: A mean TV(q_ref, q) above this at some slot is a fault (the report's threshold).
TOLERANCE = 0.01


@pytest.fixture(scope="module")
def target():
    import transformers

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False))
    return model.eval()


def _drafter(target, kind: str):
    from floorgap.models.drafters import DrafterConfig, build_drafter

    torch.manual_seed(1)
    d = build_drafter(DrafterConfig(kind=kind, gamma=3, hidden_size=32, n_layers=1, n_heads=4,
                                    intermediate_size=64, taps=[0, 1], markov_rank=4), target)
    with torch.no_grad():  # away from the initialisation, so every input moves q
        for p in d.parameters():
            if p.requires_grad:
                p.add_(0.3 * torch.randn_like(p))
    return d.eval()


def _anchors(n: int = 6) -> tuple[list[list[int]], list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(2)
    contexts = [torch.randint(0, 90, (12,), generator=gen).tolist() for _ in range(n)]
    blocks = [torch.randint(0, 90, (3,), generator=gen) for _ in range(n)]
    return contexts, blocks


def _edit_config(folder: Path, edit) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    edit(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))


def _shift_rows(cfg: dict) -> None:
    # the anchor-row vs mask-row confusion: the folder claims the other block convention
    cfg["sample_from_anchor"] = cfg["architectures"][0] == "DFlashDraftModel"


def _wrong_mask(cfg: dict) -> None:
    for where in (cfg, cfg.get("dflash_config", {})):
        if "mask_token_id" in where:
            where["mask_token_id"] = int(where["mask_token_id"]) - 1


FAULTS = {
    "correct": None,
    "rows-shifted": lambda f: _edit_config(f, _shift_rows),
    "wrong-mask-token": lambda f: _edit_config(f, _wrong_mask),
    "taps-permuted": permute_taps,
    # the target-layer index off by one: the features of layer L + 1 fed for L
    "taps-offset": lambda f: inject_fault(f, "taps-offset"),
}
#: What the diagnosis against the reference names for each fault.
NAMED = {"correct": None, "rows-shifted": "block layout flipped: the folder reads as ",
         "wrong-mask-token": "wrong mask token: the folder feeds the mask rows token ",
         "taps-permuted": "fc input columns permuted: the folder's fusion reads the taps' "
                          "feature blocks in the order (1, 0) of the trained one",
         "taps-offset": "target-layer index offset by +1: the folder taps layers [1, 2], the "
                        "weights were trained on [0, 1]"}


def fidelity(target, kind: str, fmt: str, fault: str, root: Path):
    """(slots, error): the comparison of the folder, exported with ``fault``, against the
    drafter it was exported from; a structural mismatch comes back as the error message."""
    from floorgap.models.engine_formats import export_drafter
    from floorgap.probes.drafter_eval import load_trained_drafter
    from floorgap.probes.export_fidelity import compare_drafters

    reference = _drafter(target, kind)
    folder = export_drafter(reference, root / f"{kind}-{fault}", fmt)
    if FAULTS[fault] is not None:
        FAULTS[fault](folder)
    contexts, blocks = _anchors()
    try:
        candidate = load_trained_drafter(folder, target, gamma=reference.gamma)
        return compare_drafters(target, reference, candidate, contexts, blocks, law=LAW), None
    except ValueError as exc:
        return None, str(exc)


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize(("kind", "fmt"), [("dflash", "dflash"), ("dspark", "dspark")])
def test_a_faithful_export_passes_and_each_fault_shows(target, kind, fmt, fault,
                                                       tmp_path) -> None:
    slots, error = fidelity(target, kind, fmt, fault, tmp_path)
    if fault == "correct":
        assert error is None and len(slots) == 3
        assert all(s.max_abs_dq < 1e-5 and s.argmax_agreement == 1.0 for s in slots)
        assert all(s.blocks == 6 for s in slots)
        return
    # a fault either reads as another structure (refused) or moves q at some slot
    assert error is not None or max(s.mean_tv for s in slots) > TOLERANCE, (fault, slots)


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize(("kind", "fmt"), [("dflash", "dflash"), ("dspark", "dspark")])
def test_each_fault_is_named_against_its_reference(target, kind, fmt, fault, tmp_path) -> None:
    """The diagnosis names the injected fault, from the folder's weights where it imports and
    from its config alone where it does not (the taps offset past the tiny target's layers);
    a faithful export gets none."""
    from floorgap.models.engine_formats import export_drafter
    from floorgap.probes.drafter_eval import load_trained_drafter
    from floorgap.probes.export_fidelity import diagnose_folder
    from floorgap.stages.export_fidelity import folder_causes

    reference = _drafter(target, kind)
    folder = export_drafter(reference, tmp_path / fault, fmt)
    if FAULTS[fault] is not None:
        FAULTS[fault](folder)
    try:
        candidate = load_trained_drafter(folder, target, gamma=reference.gamma)
        causes = diagnose_folder(reference, candidate.cfg, candidate.state_dict())
    except ValueError:
        causes = folder_causes(reference, str(folder))
    if NAMED[fault] is None:
        assert causes == []
    else:
        assert len(causes) == 1 and causes[0].startswith(NAMED[fault]), causes


def test_the_comparison_is_exact_against_itself(target) -> None:
    from floorgap.probes.export_fidelity import compare_drafters, proposals

    d = _drafter(target, "dspark")
    contexts, blocks = _anchors(3)
    slots = compare_drafters(target, d, d, contexts, blocks, law=LAW)
    assert [s.max_abs_dq for s in slots] == [0.0, 0.0, 0.0]
    q = proposals(target, d, contexts[0], blocks[0], LAW)
    assert q.shape == (3, 96) and torch.allclose(q.sum(-1), torch.ones(3, dtype=q.dtype))


def test_a_mismatched_structure_is_refused(target) -> None:
    from floorgap.probes.export_fidelity import compare_drafters

    contexts, blocks = _anchors(2)
    with pytest.raises(ValueError, match="drafts 3 slots of order 1, the reference 3 of order 0"):
        compare_drafters(target, _drafter(target, "dflash"), _drafter(target, "dspark"),
                         contexts, blocks, law=LAW)


def test_the_stage_writes_the_comparison_or_the_layout_error(smoke_target, smoke_domain_records,
                                                             tmp_path) -> None:
    """The export_fidelity stage on the smoke target's corpus and anchors: the reference as a
    final.pt record, a faithful folder, and one folder with each injected fault: the faithful
    one reads as its weights, each faulty one is flagged (a layout error, or a mean TV above
    the check's threshold at some slot)."""
    from floorgap.reports.check import FIDELITY_TV

    from dataclasses import asdict

    from floorgap.models.drafters import DrafterConfig, build_drafter
    from floorgap.models.engine_formats import export_drafter
    from floorgap.models.targets import load_target
    from floorgap.stages._cli import run_stage
    from floorgap.stages.export_fidelity import build_parser, main

    cfg, target, model_dir, corpus, anchors, _ = smoke_domain_records
    model = load_target(model_dir, "float32", "cpu")[0]
    gamma = int(cfg["anchors"]["gamma"])
    torch.manual_seed(4)
    dcfg = DrafterConfig(kind="dspark", gamma=gamma, hidden_size=model.config.hidden_size,
                         n_layers=1, n_heads=4, intermediate_size=64, taps=[0, 1], markov_rank=8)
    drafter = build_drafter(dcfg, model)
    reference = tmp_path / "final.pt"
    torch.save({"drafter_config": asdict(dcfg),
                "model": {n: p.detach() for n, p in drafter.named_parameters()
                          if p.requires_grad}}, reference)
    out = {}
    for fault in FAULTS:
        folder = export_drafter(drafter, tmp_path / fault, "dspark", num_target_layers=2)
        if FAULTS[fault] is not None:
            FAULTS[fault](folder)
        spec = {"target": target, "drafter": "mine", "folder": str(folder),
                "reference": str(reference), "law": cfg["evaluation_law"], "gamma": gamma,
                "anchors_per_domain": 2}
        out[fault] = tmp_path / f"{fault}.json"
        assert run_stage(main, build_parser(), [
            "--spec", json.dumps(spec), "--model-dir", str(model_dir), "--corpus", str(corpus),
            "--anchors", str(anchors), "--out", str(out[fault]), "--threads", "1"]) == 0
    good = json.loads(out["correct"].read_text())
    assert good["error"] is None and good["anchors"] == 2 and len(good["slots"]) == gamma
    assert all(s["max_abs_dq"] < 1e-5 for s in good["slots"])
    bad = json.loads(out["rows-shifted"].read_text())
    assert bad["slots"] == [] and "block rows" in bad["error"]
    for fault in ("wrong-mask-token", "taps-permuted"):
        record = json.loads(out[fault].read_text())
        assert record["error"] is not None or max(
            s["mean_tv"] for s in record["slots"]) > FIDELITY_TV, (fault, record)
