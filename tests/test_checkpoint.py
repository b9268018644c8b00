"""Checkpoints: atomic writes, pruning, bit-exact resume, tied weights, PEFT adapters, HF export."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors import safe_open

from looprl.trainer import checkpoint as ckpt
from looprl.trainer.checkpoint import (
    export_hf,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)

CHAT_TEMPLATE = (
    "{% for m in messages %}<s> {{ m['role'] }} {{ m['content'] }} </s> {% endfor %}"
    "{% if add_generation_prompt %}<s> assistant {% endif %}"
)
WORDS = [
    "<pad>",
    "<unk>",
    "<s>",
    "</s>",
    "user",
    "assistant",
    "system",
    "hello",
    "world",
    "2",
    "+",
    "=",
]


def tiny_llama(seed: int = 0) -> Any:
    """A random 2-layer Llama with tied input/output embeddings."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(WORDS),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,
    )
    return LlamaForCausalLM(config).eval()


def tiny_tokenizer() -> Any:
    """A word-level tokenizer over WORDS with a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        chat_template=CHAT_TEMPLATE,
    )


def lora(model: Any) -> Any:
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    return get_peft_model(model, config)


class Net(torch.nn.Module):
    """A small MLP with dropout (consumes torch RNG in training mode)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def make_training(
    seed: int,
) -> tuple[Net, torch.nn.Linear, torch.optim.Optimizer, Any, torch.Generator]:
    torch.manual_seed(seed)
    net, head = Net(), torch.nn.Linear(8, 1)
    opt = torch.optim.AdamW([*net.parameters(), *head.parameters()], lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    return net, head, opt, sched, torch.Generator().manual_seed(seed + 1)


def train_steps(
    net: Net, head: torch.nn.Linear, opt: Any, sched: Any, gen: torch.Generator, n: int
) -> list[float]:
    """n steps whose data depends on python random, numpy, torch global RNG and a named generator."""
    losses = []
    net.train()
    for _ in range(n):
        x = torch.randn(4, 8) + random.gauss(0.0, 1.0)
        y = torch.from_numpy(np.random.rand(4, 1).astype(np.float32))
        x = x + torch.randn(4, 8, generator=gen)
        loss = ((net(x) - y) ** 2).mean() + head(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    return losses


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def test_resume_is_bit_exact(tmp_path: Path) -> None:
    seed_all(7)
    net, head, opt, sched, gen = make_training(0)
    straight = train_steps(net, head, opt, sched, gen, 6)
    final_weights = {k: v.clone() for k, v in net.state_dict().items()}
    straight_lr = sched.get_last_lr()

    seed_all(7)
    net, head, opt, sched, gen = make_training(0)
    first = train_steps(net, head, opt, sched, gen, 3)
    path = save_checkpoint(
        tmp_path,
        3,
        model=net,
        optimizer=opt,
        scheduler=sched,
        value_head=head,
        extra_state={"cursor": 12, "best": 0.5},
        generators={"sampler": gen},
    )
    seed_all(999)  # the rest of the process moves on; load must restore everything
    train_steps(net, head, opt, sched, gen, 2)

    net2, head2, opt2, sched2, gen2 = make_training(123)  # fresh objects, different init
    state = load_checkpoint(
        path,
        model=net2,
        optimizer=opt2,
        scheduler=sched2,
        value_head=head2,
        generators={"sampler": gen2},
    )
    assert state == {"step": 3, "cursor": 12, "best": 0.5}
    resumed = train_steps(net2, head2, opt2, sched2, gen2, 3)

    assert first + resumed == straight  # exact float equality, not approximate
    for k, v in net2.state_dict().items():
        assert torch.equal(v, final_weights[k]), k
    assert sched2.get_last_lr() == straight_lr
    assert sched2.last_epoch == 6


def test_checkpoint_layout(tmp_path: Path) -> None:
    net, head, opt, sched, _ = make_training(0)
    path = save_checkpoint(
        tmp_path, 42, model=net, optimizer=opt, scheduler=sched, extra_state={"a": [1, 2]}
    )
    assert path == tmp_path / "checkpoints" / "step_000042"
    names = sorted(p.name for p in path.iterdir())
    assert names == [
        "COMPLETE",
        "model.safetensors",
        "optimizer.pt",
        "rng.pt",
        "scheduler.pt",
        "state.json",
    ]
    assert json.loads((path / "state.json").read_text()) == {"a": [1, 2], "step": 42}
    assert json.loads((path / "COMPLETE").read_text())["weights"] == "full"
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_000042"]


def test_bad_arguments_fail_clearly(tmp_path: Path) -> None:
    net, _, opt, sched, _ = make_training(0)
    with pytest.raises(ValueError, match="keep_last"):
        save_checkpoint(
            tmp_path, 1, model=net, optimizer=opt, scheduler=sched, extra_state={}, keep_last=0
        )
    with pytest.raises(ValueError, match="disagrees"):
        save_checkpoint(
            tmp_path, 1, model=net, optimizer=opt, scheduler=sched, extra_state={"step": 2}
        )
    with pytest.raises(TypeError, match="JSON"):
        save_checkpoint(
            tmp_path, 1, model=net, optimizer=opt, scheduler=sched, extra_state={"x": object()}
        )
    with pytest.raises(ValueError, match="PEFT"):
        save_checkpoint(
            tmp_path,
            1,
            model=net,
            optimizer=opt,
            scheduler=sched,
            extra_state={},
            adapter_only=True,
        )
    assert latest_checkpoint(tmp_path) is None
    assert not any((tmp_path / "checkpoints").iterdir())  # failed saves leave nothing behind


def test_crash_during_write_leaves_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    net, _, opt, sched, _ = make_training(0)
    first = save_checkpoint(tmp_path, 1, model=net, optimizer=opt, scheduler=sched, extra_state={})

    real = ckpt._torch_save

    def failing(obj: Any, path: Path) -> None:
        if path.name == "rng.pt":
            raise OSError("disk full")
        real(obj, path)

    monkeypatch.setattr(ckpt, "_torch_save", failing)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, 2, model=net, optimizer=opt, scheduler=sched, extra_state={})
    assert latest_checkpoint(tmp_path) == first
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000001"]


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_latest_ignores_tmp_and_incomplete_dirs(tmp_path: Path) -> None:
    net, _, opt, sched, _ = make_training(0)
    save_checkpoint(tmp_path, 1, model=net, optimizer=opt, scheduler=sched, extra_state={})
    second = save_checkpoint(tmp_path, 2, model=net, optimizer=opt, scheduler=sched, extra_state={})
    root = tmp_path / "checkpoints"
    # A run killed between writing and renaming leaves a complete-looking temp dir...
    killed = root / f"step_000003.tmp-{dead_pid()}"
    killed.mkdir()
    for f in second.iterdir():
        (killed / f.name).write_bytes(f.read_bytes())
    # ...and a directory with the final name but no COMPLETE marker is not a checkpoint either.
    (root / "step_000004").mkdir()
    assert latest_checkpoint(tmp_path) == second
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1, 2]
    with pytest.raises(FileNotFoundError, match="COMPLETE"):
        load_checkpoint(root / "step_000004", model=net)

    save_checkpoint(
        tmp_path, 5, model=net, optimizer=opt, scheduler=sched, extra_state={}, keep_last=10
    )
    assert not killed.exists()  # the dead writer's leftover is cleaned on the next save
    assert latest_checkpoint(tmp_path) == root / "step_000005"


def test_keep_last_prunes_but_never_the_new_one(tmp_path: Path) -> None:
    net, _, opt, sched, _ = make_training(0)
    for step in range(1, 6):
        save_checkpoint(
            tmp_path, step, model=net, optimizer=opt, scheduler=sched, extra_state={}, keep_last=2
        )
    assert [s for s, _ in list_checkpoints(tmp_path)] == [4, 5]
    # Resumed from an older step: the newly written one survives even when newer ones exist.
    save_checkpoint(
        tmp_path, 3, model=net, optimizer=opt, scheduler=sched, extra_state={}, keep_last=1
    )
    assert [s for s, _ in list_checkpoints(tmp_path)] == [3, 5]
    # Saving the same step again replaces it atomically.
    save_checkpoint(
        tmp_path, 5, model=net, optimizer=opt, scheduler=sched, extra_state={"v": 2}, keep_last=None
    )
    assert load_checkpoint(tmp_path / "checkpoints" / "step_000005", model=net)["v"] == 2
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "step_000003",
        "step_000005",
    ]


def test_tied_llama_round_trip(tmp_path: Path) -> None:
    model = tiny_llama(0)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    path = save_checkpoint(tmp_path, 1, model=model, optimizer=opt, scheduler=None, extra_state={})
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
    assert len({"lm_head.weight", "model.embed_tokens.weight"} & keys) == 1  # stored once

    other = tiny_llama(1)
    opt2 = torch.optim.AdamW(other.parameters(), lr=1e-3)
    load_checkpoint(path, model=other, optimizer=opt2)
    for (k, a), b in zip(model.state_dict().items(), other.state_dict().values(), strict=True):
        assert torch.equal(a, b), k
    assert other.lm_head.weight.data_ptr() == other.model.embed_tokens.weight.data_ptr()
    with pytest.raises(ValueError, match="without a scheduler"):
        load_checkpoint(
            path, model=other, scheduler=torch.optim.lr_scheduler.LambdaLR(opt2, lambda s: 1.0)
        )


def test_adapter_only_round_trip(tmp_path: Path) -> None:
    model = lora(tiny_llama(0))
    with torch.no_grad():  # LoRA B starts at zero; give the adapter non-trivial values
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.normal_()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    path = save_checkpoint(
        tmp_path, 1, model=model, optimizer=opt, scheduler=None, extra_state={}, adapter_only=True
    )
    assert not (path / "model.safetensors").exists()
    with safe_open(str(path / "adapter.safetensors"), framework="pt") as f:
        keys = list(f.keys())
    assert keys and all("lora_" in k for k in keys)

    fresh = lora(tiny_llama(0))  # same base weights, fresh adapter
    ids = torch.tensor([[2, 4, 7, 8, 3]])
    with torch.no_grad():
        assert not torch.equal(fresh(ids).logits, model(ids).logits)
        load_checkpoint(path, model=fresh)
        assert torch.equal(fresh(ids).logits, model(ids).logits)
    with pytest.raises(ValueError, match="adapter weights only"):
        load_checkpoint(path, model=tiny_llama(0))


def test_export_hf_loads_with_transformers(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok = tiny_llama(0), tiny_tokenizer()
    out = export_hf(model, tok, tmp_path / "final")
    loaded = AutoModelForCausalLM.from_pretrained(out)
    ids = torch.tensor([[2, 4, 7, 8, 3]])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
    tok2 = AutoTokenizer.from_pretrained(out)
    msgs = [{"role": "user", "content": "hello world"}]
    assert tok2.apply_chat_template(msgs, tokenize=False) == tok.apply_chat_template(
        msgs, tokenize=False
    )
    assert not [p for p in tmp_path.iterdir() if p.name != "final"]  # no temp dir left behind

    export_hf(tiny_llama(3), tok, out)  # an existing export is replaced
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    assert not torch.equal(reloaded.lm_head.weight, model.lm_head.weight)


def test_export_hf_merges_peft_without_touching_the_live_model(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = lora(tiny_llama(0))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.1)
    ids = torch.tensor([[2, 4, 7, 8, 3]])
    with torch.no_grad():
        expected = model(ids).logits
    out = export_hf(model, tiny_tokenizer(), tmp_path / "merged")
    assert not list(out.glob("adapter_*"))
    loaded = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, expected, rtol=1e-4, atol=1e-5)
        assert torch.equal(model(ids).logits, expected)  # the training model still has its adapter
    assert any("lora_A" in n for n, _ in model.named_parameters())


def test_clean_stale_tmp_spares_live_writers(tmp_path: Path) -> None:
    live = tmp_path / f"step_000001.tmp-{os.getppid()}"
    dead = tmp_path / f".final.old-{dead_pid()}"
    mine = tmp_path / f"step_000002.tmp-{os.getpid()}"
    other = tmp_path / "step_000003.tmp-notapid"
    for d in (live, dead, mine, other):
        d.mkdir()
    removed = ckpt.clean_stale_tmp(tmp_path)
    assert sorted(removed) == sorted([dead, mine])
    assert live.exists() and other.exists()
