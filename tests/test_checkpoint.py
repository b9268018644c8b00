"""Checkpoints: atomic writes, pruning, bit-exact resume, tied weights, PEFT adapters, HF export."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import small_llama
from safetensors import safe_open

from looprl.trainer.checkpoint import single as ckpt
from looprl.trainer.checkpoint.single import (
    CheckpointDamaged,
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
    return small_llama(
        seed, vocab_size=len(WORDS), tie_word_embeddings=True, pad_token_id=0, bos_token_id=2,
        eos_token_id=3,
    ).eval()  # fmt: skip


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

    real = ckpt.torch_save_synced

    def failing(obj: Any, path: Path) -> None:
        if path.name == "rng.pt":
            raise OSError("disk full")
        real(obj, path)

    monkeypatch.setattr(ckpt, "torch_save_synced", failing)
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
    with pytest.raises(CheckpointDamaged, match="manifest COMPLETE is missing"):
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


# ---------------------------------------------------------------- damaged checkpoints


def save_steps(run_dir: Path, steps: list[int], **kwargs: Any) -> dict[int, Path]:
    """Checkpoints of a small training run at `steps` (a few training steps between saves)."""
    net, head, opt, sched, gen = make_training(0)
    paths = {}
    for step in steps:
        train_steps(net, head, opt, sched, gen, 1)
        paths[step] = save_checkpoint(
            run_dir, step, model=net, optimizer=opt, scheduler=sched,
            extra_state={"cursor": 10 * step}, generators={"sampler": gen}, **kwargs,
        )  # fmt: skip
    return paths


def rewrite_manifest(path: Path, edit: Any) -> None:
    """Apply `edit` to the parsed manifest of checkpoint `path` and write it back."""
    manifest = json.loads((path / "COMPLETE").read_text())
    (path / "COMPLETE").write_text(json.dumps(edit(manifest)))


def replace_file(path: Path, name: str, data: bytes) -> None:
    """Replace a file and record its new size and hash: damage that the hashes cannot see."""
    import hashlib

    (path / name).write_bytes(data)

    def edit(m: dict[str, Any]) -> dict[str, Any]:
        m["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        return m

    rewrite_manifest(path, edit)


def truncate(path: Path, name: str) -> None:
    data = (path / name).read_bytes()
    (path / name).write_bytes(data[: len(data) // 2])


def flip_byte(path: Path, name: str) -> None:
    data = bytearray((path / name).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (path / name).write_bytes(bytes(data))


def empty(path: Path) -> None:
    for f in path.iterdir():
        f.unlink()


def drop_files_key(m: dict[str, Any]) -> dict[str, Any]:
    m["files"].pop("state.json")
    return m


def bad_size(m: dict[str, Any]) -> dict[str, Any]:
    m["files"]["rng.pt"]["size"] = "big"
    return m


# name -> (how to damage a checkpoint directory, the reason resume must report)
DAMAGE = {
    "truncated": (
        lambda p: truncate(p, "model.safetensors"),
        r"model\.safetensors has \d+ bytes, manifest says \d+",
    ),
    "flipped_byte": (
        lambda p: flip_byte(p, "optimizer.pt"),
        r"optimizer\.pt has sha256 [0-9a-f]{12}\.\.\., manifest says [0-9a-f]{12}\.\.\. \(its bytes changed",
    ),
    "missing_file": (lambda p: (p / "rng.pt").unlink(), r"rng\.pt is missing"),
    "missing_manifest": (
        lambda p: (p / "COMPLETE").unlink(),
        r"manifest COMPLETE is missing \(the directory holds model\.safetensors, ",
    ),
    "unreadable_manifest": (
        lambda p: (p / "COMPLETE").write_bytes(b"\xff\xfe{"),
        r"manifest COMPLETE cannot be read \(UnicodeDecodeError",
    ),
    "manifest_is_a_directory": (
        lambda p: ((p / "COMPLETE").unlink(), (p / "COMPLETE").mkdir()),
        r"manifest COMPLETE cannot be read \(IsADirectoryError",
    ),
    "invalid_json_manifest": (
        lambda p: (p / "COMPLETE").write_text('{"step": 2, "weig'),
        r"manifest COMPLETE is not valid JSON",
    ),
    "manifest_not_an_object": (
        lambda p: (p / "COMPLETE").write_text("[1, 2]"),
        r"manifest COMPLETE holds a JSON list, expected an object",
    ),
    "manifest_wrong_step": (
        lambda p: rewrite_manifest(p, lambda m: {**m, "step": 7}),
        r"manifest COMPLETE says step 7 but the directory is step 2",
    ),
    "manifest_lists_no_state": (
        lambda p: rewrite_manifest(p, drop_files_key),
        r"manifest COMPLETE does not list state\.json",
    ),
    "manifest_bad_entry": (
        lambda p: rewrite_manifest(p, bad_size),
        r"manifest COMPLETE entry for rng\.pt: size='big' is not a byte count",
    ),
    "safetensors_fails_to_load": (
        lambda p: replace_file(p, "model.safetensors", b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage"),
        r"model\.safetensors cannot be loaded",
    ),
    "torch_file_fails_to_load": (
        lambda p: replace_file(p, "scheduler.pt", b"not a zip archive"),
        r"scheduler\.pt cannot be loaded",
    ),
    "state_json_fails_to_load": (
        lambda p: replace_file(p, "state.json", b"[1"),
        r"state\.json cannot be read \(JSONDecodeError",
    ),
    "empty_directory": (empty, r"manifest COMPLETE is missing \(the directory holds nothing\)"),
}


def snapshot(path: Path) -> dict[str, bytes]:
    """Every file under `path` by relative name (to show that nothing was changed)."""
    return {
        str(f.relative_to(path)): f.read_bytes() for f in sorted(path.rglob("*")) if f.is_file()
    }


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_resume_falls_back_past_a_damaged_checkpoint(tmp_path: Path, kind: str) -> None:
    damage, reason = DAMAGE[kind]
    paths = save_steps(tmp_path, [1, 2])
    damage(paths[2])
    damaged_bytes = snapshot(paths[2])

    net, head, opt, sched, gen = make_training(5)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    with pytest.raises(CheckpointDamaged, match=reason) as err:
        load_checkpoint(
            paths[2], model=net, optimizer=opt, scheduler=sched, value_head=head,
            generators={"sampler": gen}, warn=lambda _m: None,
        )  # fmt: skip
    assert err.value.path == paths[2] and "step_000002" in str(err.value)
    for k, v in net.state_dict().items():  # a damaged checkpoint changes nothing
        assert torch.equal(v, before[k]), k

    warnings: list[str] = []
    resumed = ckpt.resume_latest(
        tmp_path, model=net, optimizer=opt, scheduler=sched, generators={"sampler": gen},
        warn=warnings.append,
    )  # fmt: skip
    assert resumed is not None
    assert resumed.path == paths[1] and resumed.state == {"step": 1, "cursor": 10}
    [message] = warnings
    assert re.match(
        rf"checkpoint step_000002 is damaged: {reason}.*; resuming from step_000001 "
        r"\(kept as step_000002\.damaged for inspection\)$",
        message,
    ), message
    kept = tmp_path / "checkpoints" / "step_000002.damaged"
    assert resumed.damaged == [(kept, message.split(" is damaged: ")[1].split("; resuming")[0])]
    assert snapshot(kept) == damaged_bytes  # moved aside, not changed or deleted
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1]


def test_fallback_resume_continues_bit_exact(tmp_path: Path) -> None:
    """Checkpoints at steps 3 and 5, the one at 5 damaged: resuming from 3 reproduces steps 4-6."""
    seed_all(7)
    net, head, opt, sched, gen = make_training(0)
    straight = train_steps(net, head, opt, sched, gen, 6)
    final_weights = {k: v.clone() for k, v in net.state_dict().items()}

    seed_all(7)
    net, head, opt, sched, gen = make_training(0)
    kw: dict[str, Any] = {"value_head": head, "generators": {"sampler": gen}, "keep_last": 2}
    first = train_steps(net, head, opt, sched, gen, 3)
    save_checkpoint(tmp_path, 3, model=net, optimizer=opt, scheduler=sched, extra_state={}, **kw)
    train_steps(net, head, opt, sched, gen, 2)
    five = save_checkpoint(
        tmp_path, 5, model=net, optimizer=opt, scheduler=sched, extra_state={}, **kw
    )
    flip_byte(five, "rng.pt")

    net2, head2, opt2, sched2, gen2 = make_training(123)
    resumed = ckpt.resume_latest(
        tmp_path, model=net2, optimizer=opt2, scheduler=sched2, value_head=head2,
        generators={"sampler": gen2}, warn=lambda _m: None,
    )  # fmt: skip
    assert resumed is not None and resumed.state == {"step": 3}
    kw["generators"] = {"sampler": gen2}
    resumed_losses = []
    for step in (4, 5, 6):  # the resumed run saves (and prunes) as it goes
        resumed_losses += train_steps(net2, head2, opt2, sched2, gen2, 1)
        save_checkpoint(
            tmp_path, step, model=net2, optimizer=opt2, scheduler=sched2, extra_state={}, **kw
        )
    assert first + resumed_losses == straight  # exact float equality
    for k, v in net2.state_dict().items():
        assert torch.equal(v, final_weights[k]), k
    assert [s for s, _ in list_checkpoints(tmp_path)] == [5, 6]
    assert (tmp_path / "checkpoints" / "step_000005.damaged" / "rng.pt").is_file()
    again = ckpt.resume_latest(tmp_path, model=Net(), warn=pytest.fail)  # no warning now
    assert again is not None and again.path.name == "step_000006"


def test_no_intact_checkpoint_is_one_clear_error_and_deletes_nothing(tmp_path: Path) -> None:
    paths = save_steps(tmp_path, [1, 2, 3])
    truncate(paths[3], "model.safetensors")
    (paths[2] / "COMPLETE").write_text("not json")
    (paths[1] / "optimizer.pt").unlink()
    leftover = tmp_path / "checkpoints" / f"step_000004.tmp-{dead_pid()}"
    leftover.mkdir()
    before = snapshot(tmp_path)

    with pytest.raises(ckpt.NoIntactCheckpoint) as err:
        ckpt.resume_latest(tmp_path, model=Net(), warn=lambda _m: None)
    text = str(err.value)
    assert "none of the 3 checkpoint(s)" in text
    assert re.search(r"step_000003: model\.safetensors has \d+ bytes, manifest says \d+", text)
    assert "step_000002: manifest COMPLETE is not valid JSON" in text
    assert "step_000001: optimizer.pt is missing" in text
    assert "Nothing was deleted" in text and "without --resume" in text and "--run-dir" in text
    assert [p for p, _ in err.value.tried] == [paths[3], paths[2], paths[1]]
    assert snapshot(tmp_path) == before and leftover.is_dir()


def test_no_checkpoint_at_all_resumes_nothing(tmp_path: Path) -> None:
    assert ckpt.resume_latest(tmp_path, model=Net()) is None  # no checkpoints directory
    root = tmp_path / "checkpoints"
    root.mkdir()
    assert ckpt.resume_latest(tmp_path, model=Net()) is None  # an empty one
    (root / f"step_000001.tmp-{dead_pid()}").mkdir()  # only a write that never finished
    assert ckpt.resume_latest(tmp_path, model=Net()) is None


def test_resume_ignores_leftovers_of_an_interrupted_write(tmp_path: Path) -> None:
    paths = save_steps(tmp_path, [1, 2])
    root = tmp_path / "checkpoints"
    # A writer killed before its rename leaves a temp dir (here even a complete-looking one).
    killed = root / f"step_000003.tmp-{dead_pid()}"
    killed.mkdir()
    for f in paths[2].iterdir():
        (killed / f.name).write_bytes(f.read_bytes())
    rewrite_manifest(killed, lambda m: {**m, "step": 3})
    half = root / f"step_000004.tmp-{dead_pid()}"
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"partial")
    warnings: list[str] = []
    resumed = ckpt.resume_latest(tmp_path, model=Net(), warn=warnings.append)
    assert resumed is not None and resumed.path == paths[2] and not warnings
    assert killed.is_dir() and half.is_dir()  # resume deletes nothing; the next save cleans up


def test_checkpoint_without_hashes_still_loads_with_a_warning(tmp_path: Path) -> None:
    """A manifest as the previous version wrote it: step, weights and time, no file list."""
    paths = save_steps(tmp_path, [1, 2])
    for p in paths.values():
        rewrite_manifest(p, lambda m: {"step": m["step"], "weights": "full", "time": m["time"]})
    warnings: list[str] = []
    state = load_checkpoint(paths[2], model=Net(), warn=warnings.append)
    assert state == {"step": 2, "cursor": 20}
    assert len(warnings) == 1 and "step_000002 has no file hashes" in warnings[0]
    with pytest.warns(UserWarning, match="no file hashes"):  # the default: a Python warning
        load_checkpoint(paths[2], model=Net())

    # Without hashes, damage is found by parsing: a truncated file still falls back.
    truncate(paths[2], "optimizer.pt")
    net, _, opt, sched, _ = make_training(0)
    with pytest.raises(CheckpointDamaged, match=r"optimizer\.pt cannot be loaded"):
        load_checkpoint(paths[2], model=net, optimizer=opt, warn=lambda _m: None)
    warnings.clear()
    resumed = ckpt.resume_latest(
        tmp_path, model=net, optimizer=opt, scheduler=sched, warn=warnings.append
    )
    assert resumed is not None and resumed.path == paths[1]
    assert any(m.startswith("checkpoint step_000002 is damaged: optimizer.pt") for m in warnings)


def test_manifest_records_size_and_hash_of_every_file(tmp_path: Path) -> None:
    import hashlib

    path = save_steps(tmp_path, [1])[1]
    manifest = json.loads((path / "COMPLETE").read_text())
    assert manifest["format"] == 2
    assert sorted(manifest["files"]) == sorted(
        p.name for p in path.iterdir() if p.name != "COMPLETE"
    )
    for name, entry in manifest["files"].items():
        data = (path / name).read_bytes()
        assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    ckpt.verify_checkpoint(path)  # an intact checkpoint passes, without loading into anything
    replace_file(path, "rng.pt", (path / "rng.pt").read_bytes())  # re-recorded: still intact
    ckpt.verify_checkpoint(path)


def test_saving_over_a_damaged_checkpoint_keeps_it(tmp_path: Path) -> None:
    paths = save_steps(tmp_path, [1, 2])
    flip_byte(paths[2], "model.safetensors")
    damaged = snapshot(paths[2])
    net, _, opt, sched, _ = make_training(0)
    with pytest.warns(
        UserWarning, match=r"step_000002 is damaged .*moved it to step_000002\.damaged"
    ):
        save_checkpoint(tmp_path, 2, model=net, optimizer=opt, scheduler=sched, extra_state={})
    assert snapshot(tmp_path / "checkpoints" / "step_000002.damaged") == damaged
    ckpt.verify_checkpoint(paths[2])  # the new one
    # An intact checkpoint of the same step is simply replaced (no warning, nothing kept).
    save_checkpoint(tmp_path, 2, model=net, optimizer=opt, scheduler=sched, extra_state={"v": 1})
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "step_000001",
        "step_000002",
        "step_000002.damaged",
    ]


def test_pruning_after_fallback_keeps_intact_checkpoints(tmp_path: Path) -> None:
    """keep_last=2 with the two newest damaged: resume from step 1; pruning never counts them."""
    paths = save_steps(tmp_path, [1, 2, 3], keep_last=3)
    truncate(paths[2], "rng.pt")
    flip_byte(paths[3], "state.json")
    net, head, opt, sched, gen = make_training(0)
    resumed = ckpt.resume_latest(
        tmp_path, model=net, optimizer=opt, scheduler=sched, generators={"sampler": gen},
        warn=lambda _m: None,
    )  # fmt: skip
    assert resumed is not None and resumed.path == paths[1]
    save_checkpoint(
        tmp_path, 2, model=net, optimizer=opt, scheduler=sched, extra_state={}, keep_last=2
    )
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1, 2]
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step_000001", "step_000002", "step_000002.damaged", "step_000003.damaged"]


def test_trainer_resume_warns_or_exits_with_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The `looprl train --resume` call site: warnings on the console, SystemExit without traceback."""
    from types import SimpleNamespace

    from looprl.trainer.trainer import Trainer

    paths = save_steps(tmp_path, [1, 2])
    truncate(paths[2], "model.safetensors")
    net, _, opt, sched, _ = make_training(0)
    trainer: Any = SimpleNamespace(
        run_dir=tmp_path, model=net, engine_model=net, optimizer=opt, scheduler=sched,
        value_head=None, step=0, cursor=0, _sync=lambda version: {}, dist=None,
        _modules=lambda: {"policy": net, "value_head": None},
        tasks=SimpleNamespace(load_state=lambda state: None),
    )  # fmt: skip
    Trainer._restore(trainer)
    assert (trainer.step, trainer.cursor) == (1, 10)
    out = " ".join(capsys.readouterr().out.split())
    assert "warning: checkpoint step_000002 is damaged: model.safetensors has" in out
    assert "resuming from step_000001" in out

    (paths[1] / "state.json").unlink()
    with pytest.raises(SystemExit, match=r"(?s)error: cannot resume.*step_000001: state\.json"):
        Trainer._restore(trainer)
