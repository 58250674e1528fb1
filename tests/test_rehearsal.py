"""`floorgap rehearsal`: the overlay changes only sizes where the paper config has them, the
derived config keeps the paper run's structure (names, kinds, formats, taps, tasks) and its SLURM
requests, and the stand-in checkpoints are read by the import as the releases they stand in for.
The rehearsal itself runs through SLURM in CI (`.ci/run`)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from conftest import REHEARSAL_OVERLAY, REPO, snakemake
from floorgap.cli import dry_run_jobs
from floorgap.config import resolve
from floorgap.errors import StageError
from floorgap.rehearsal import Rehearsal, apply_overlay, build_standins, rehearsal_config

PAPER = REPO / "workflow" / "configs" / "qwen3-4b.yaml"
CROSS = REPO / "workflow" / "configs" / "paper-cross-target.yaml"


def _derive(paper: Path, out: Path) -> Rehearsal:
    return rehearsal_config(yaml.safe_load(paper.read_text()),
                            yaml.safe_load(REHEARSAL_OVERLAY.read_text()), out,
                            serving_python="/opt/vllm/bin/python")


def test_the_overlay_replaces_only_what_the_config_has() -> None:
    config = {"a": {"x": 1, "y": [1, 2]}, "d": {"p": {"n": 5}, "q": {"n": 6, "m": 1}}, "z": 3}
    overlay = {"a": {"x": 9, "new": 1}, "d": {"*": {"n": 0}}, "absent": {"k": 1}}
    out = apply_overlay(config, overlay)
    assert out == {"a": {"x": 9, "y": [1, 2]}, "d": {"p": {"n": 0}, "q": {"n": 0, "m": 1}},
                   "z": 3}
    assert config["d"]["p"]["n"] == 5  # the input is not changed


def test_the_rehearsal_keeps_the_paper_runs_structure(tmp_path: Path) -> None:
    paper = yaml.safe_load(PAPER.read_text())
    before = copy.deepcopy(paper)
    reh = rehearsal_config(paper, yaml.safe_load(REHEARSAL_OVERLAY.read_text()), tmp_path,
                           serving_python="/opt/vllm/bin/python")
    assert paper == before  # the paper config itself is left as it was
    cfg = reh.config
    assert list(cfg["targets"]) == list(paper["targets"])
    target = cfg["targets"]["qwen3-4b"]
    assert target["device"] == "cpu" and target["placement"] == "cuda"
    assert target["dtype"] == paper["targets"]["qwen3-4b"]["dtype"]
    assert target["source"]["architecture"] == "qwen3"
    assert target["source"]["num_hidden_layers"] > max(paper["drafters"]["taps"])
    assert cfg["drafters"]["taps"] == paper["drafters"]["taps"]
    assert cfg["anchors"]["gamma"] == paper["anchors"]["gamma"]
    for group in ("variants",):
        assert list(cfg["drafters"][group]) == list(paper["drafters"][group])
    assert list(cfg["drafters"]["components"]["arms"]) == \
        list(paper["drafters"]["components"]["arms"])
    for name, entry in paper["drafters"]["variants"].items():
        if "checkpoint" in entry:  # a release, now a local folder in the same layout
            got = cfg["drafters"]["variants"][name]["checkpoint"]
            # except the served DeepSpec DFlash: z-lab's layout, which vLLM's CPU build serves
            want = "dflash" if name == "dflash" else entry["checkpoint"]["format"]
            assert got["format"] == want and "hub" not in got
            assert reh.checkpoints[got["path"]]["hub"] == entry["checkpoint"]["hub"]
    assert list(cfg["serving"]["tasks"]) == list(paper["serving"]["tasks"])
    assert cfg["serving"]["concurrency"] == paper["serving"]["concurrency"]
    assert cfg["serving"]["temperatures"] == paper["serving"]["temperatures"]
    # sizes shrink; no hub source is left
    assert cfg["rollouts"]["paths"] < paper["rollouts"]["paths"]
    assert "hf:" not in yaml.safe_dump(cfg) and "hub" not in yaml.safe_dump(cfg["targets"])
    # what cannot be served on the CPU is left out, and said
    assert cfg["serving"]["engine"] == "vllm" and cfg["serving"]["systems"] == ["ar", "dflash"]
    assert any("dspark" in line and "DSpark method" in line for line in reh.untested)
    resolve(copy.deepcopy(cfg))


def _with_a_gemma4_target(folder: Path) -> Path:
    """The cross-target config plus a Gemma-4 target (the paper's fourth, which has no stand-in)."""
    cfg = yaml.safe_load(CROSS.read_text())
    cfg["targets"]["gemma-4-12b"] = {**cfg["targets"]["qwen3-14b"],
                                     "source": {"kind": "hub", "id": "google/gemma-4-12B-it"}}
    path = folder / "with-gemma4.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def test_a_target_without_a_stand_in_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(StageError, match="gemma-4-12b.*no CPU stand-in.*google/gemma-4-12B-it"):
        _derive(_with_a_gemma4_target(tmp_path), tmp_path)


def test_the_cross_target_config_has_a_stand_in_for_every_target(tmp_path: Path) -> None:
    reh = _derive(CROSS, tmp_path)
    assert list(reh.config["targets"]) == ["qwen3-4b", "qwen3-8b", "qwen3-14b"]


def _requests(config: Path, work: Path) -> dict[str, set[tuple[bool, str]]]:
    res = snakemake("-n", "--cores", "all", "--configfile", str(config), cwd=work)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out: dict[str, set[tuple[bool, str]]] = {}
    for rule, _, resources in dry_run_jobs(res.stdout):
        out.setdefault(rule, set()).add((int(resources.get("gpu", 0)) > 0,
                                         resources.get("slurm_partition", "")))
    return out


@pytest.mark.slow
def test_every_rehearsal_job_asks_slurm_what_the_paper_job_asks(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    reh = _derive(PAPER, tmp_path / "reh")
    _tiny_tokenizer(tmp_path / "reh" / "tokenizers" / "qwen3")
    build_standins(reh)  # the drafters rule reads the stand-in folders
    config = tmp_path / "reh" / "config.yaml"
    config.write_text(yaml.safe_dump(reh.config, sort_keys=False))
    (tmp_path / "paper").mkdir()
    paper = _requests(PAPER, tmp_path / "paper")
    rehearsal = _requests(config, tmp_path / "reh")
    assert set(paper) == set(rehearsal)
    for rule, asked in rehearsal.items():
        assert asked == paper[rule], rule
    assert any(gpu for asked in rehearsal.values() for gpu, _ in asked)


def test_the_stand_in_releases_read_as_the_releases(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from floorgap.models.engine_formats import describe_folder

    reh = _derive(PAPER, tmp_path)
    # a small vocabulary keeps the test quick; the workflow's stand-ins use the Qwen3 tokenizer
    tok = tmp_path / "tokenizers" / "qwen3"
    _tiny_tokenizer(tok)
    build_standins(reh)
    for folder, how in reh.checkpoints.items():
        seen = describe_folder(Path(folder))
        assert seen["layout"] == how["format"], seen
        assert seen["kind"] == how["kind"] and seen["gamma"] == 7, seen
        assert seen["taps"] == how["taps"], seen
        assert (Path(folder) / "STAND_IN.json").is_file()


def _tiny_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(120)} | {"<unk>": 120, "<|im_end|>": 121}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>",
                                   eos_token="<|im_end|>")
    fast.save_pretrained(str(folder))


def test_the_command_refuses_a_config_it_cannot_rehearse(tmp_path: Path) -> None:
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "floorgap", "rehearsal", "--configfile",
                          str(_with_a_gemma4_target(tmp_path)), "--out", str(tmp_path / "r")],
                         cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 2 and "no CPU stand-in for google/gemma-4-12B-it" in res.stderr
    assert not (tmp_path / "r" / "config.yaml").exists()
