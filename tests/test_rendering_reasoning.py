"""Reasoning in rollouts (token level), decoding that keeps format markers, template overrides."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from looprl.engines.base import GenerationRequest
from looprl.envs.calculator import load_environment
from looprl.kit import final_answer_text, final_reasoning
from looprl.rendering.renderer import Renderer
from looprl.rendering.templates import CHATML_TOOLS_TEMPLATE, set_chat_template
from looprl.rollout.loop import rollout
from looprl.trainer.config import TrainConfig
from looprl.types import EpisodeResult, Generation, Message

TEMPLATES = Path(__file__).parent / "data" / "templates"
LOGPROB = -0.25


class CharEngine:
    """A token-level engine that writes each character as its own token(s): ids no tokenizer
    would give for the text, so any re-encoding of sampled text would show."""

    token_level = True

    def __init__(self, tokenizer: Any, replies: list[str]) -> None:
        self.tokenizer = tokenizer
        self.replies = replies
        self.outputs: list[list[int]] = []

    async def generate(self, request: GenerationRequest) -> Generation:
        text = self.replies[sum(m.role == "assistant" for m in request.messages)]
        ids = [i for ch in text for i in self.tokenizer.encode(ch, add_special_tokens=False)]
        ids += self.tokenizer.encode("<|im_end|>", add_special_tokens=False)
        self.outputs.append(ids)
        return Generation(text=text, token_ids=ids, logprobs=[LOGPROB] * len(ids))

    async def close(self) -> None:
        """Nothing to release."""


async def _reasoning_episode(tokenizer: Any, keep: bool) -> tuple[EpisodeResult, CharEngine]:
    env = load_environment()
    task = env.get_tasks("eval", 1, seed=1)[0]
    expr = task.info["expression"]
    call = json.dumps({"name": "calculate", "arguments": {"expression": expr}})
    replies = [
        f"<think>\nI will use the tool.\n</think>\n\n<tool_call>\n{call}\n</tool_call>",
        f"<think>\nCopy its result.\n</think>\n\nThe answer is {task.answer}.",
    ]
    engine = CharEngine(tokenizer, replies)
    charwise = [i for ch in replies[0] for i in tokenizer.encode(ch, add_special_tokens=False)]
    assert tokenizer.encode(replies[0], add_special_tokens=False) != charwise
    renderer = Renderer(tokenizer, env.tool_schemas, keep_reasoning=keep)
    ep = await rollout(env, engine, task, renderer=renderer)
    await env.rubric.score(ep)
    return ep, engine


def _sampled(ep: EpisodeResult) -> list[list[int]]:
    runs: list[list[int]] = []
    for traj in ep.trajectories:
        previous = 0
        for token, mask in zip(traj.token_ids, traj.mask, strict=True):
            if mask and not previous:
                runs.append([])
            if mask:
                runs[-1].append(token)
            previous = mask
    return runs


@pytest.mark.parametrize("keep", [True, False])
async def test_reasoning_is_split_and_sampled_ids_stay_exact(tiny_tokenizer: Any, keep: bool):
    ep, engine = await _reasoning_episode(tiny_tokenizer, keep)
    assert not ep.errors and ep.num_tool_calls == 1 and not ep.tool_errors
    first, last = (m for m in ep.messages if m.role == "assistant")
    assert (first.reasoning_content, first.content) == ("I will use the tool.", "")
    assert last.reasoning_content == "Copy its result."
    assert last.content == f"The answer is {ep.task.answer}."
    assert final_answer_text(ep) == last.content and final_reasoning(ep) == "Copy its result."
    assert ep.rewards["correct_answer"] == 1.0
    assert _sampled(ep) == engine.outputs  # never decoded and re-encoded
    for traj in ep.trajectories:
        traj.check()
        assert all(lp == LOGPROB for lp, m in zip(traj.logprobs, traj.mask, strict=True) if m)
    # kept: one segment whose context holds both thoughts as sampled; dropped: the second
    # turn's prompt is re-rendered without the first thought (as Qwen3's template does)
    assert len(ep.trajectories) == (1 if keep else 2)
    if not keep:
        second = ep.trajectories[1]
        prompt = tiny_tokenizer.decode(second.token_ids[: second.mask.index(1)])
        assert "I will use the tool." not in prompt and ep.task.answer in prompt


def test_past_reasoning_goes_back_to_the_template(tiny_tokenizer: Any) -> None:
    """Kept reasoning is rendered inline for templates that ignore `reasoning_content`."""
    msgs = [
        Message(role="user", content="q"),
        Message(role="assistant", content="A", reasoning_content="R"),
    ]
    kept = Renderer(tiny_tokenizer).render_text(msgs, add_generation_prompt=False)
    dropped = Renderer(tiny_tokenizer, keep_reasoning=False)
    assert "<|im_start|>assistant\n<think>\nR\n</think>\n\nA<|im_end|>" in kept
    assert "R" not in dropped.render_text(msgs, add_generation_prompt=False).split("assistant")[1]


def _family(name: str) -> Any:
    spec = importlib.util.spec_from_file_location("families", TEMPLATES / "families.py")
    assert spec is not None and spec.loader is not None
    module: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.family_tokenizer(name)


def test_qwen3_reads_reasoning_content_itself() -> None:
    renderer = Renderer(_family("qwen3"))
    msgs = [
        Message(role="user", content="q"),
        Message(role="assistant", content="A", reasoning_content="R"),
        Message(role="user", content="next"),
    ]
    text = renderer.render_text(msgs[:2], add_generation_prompt=False)
    assert text.endswith("<|im_start|>assistant\n<think>\nR\n</think>\n\nA<|im_end|>\n")
    assert "R" not in renderer.render_text(msgs, add_generation_prompt=True).split("assistant")[1]


@pytest.mark.parametrize(
    ("family", "text", "kept"),
    [
        ("llama3.1", '<|python_tag|>{"name": "a"}<|eot_id|>', '<|python_tag|>{"name": "a"}'),
        ("mistral-v0.3", '[TOOL_CALLS] [{"name": "a"}]</s>', '[TOOL_CALLS] [{"name": "a"}]'),
        ("qwen3", "<think>x</think><tool_call>{}</tool_call><|im_end|>",
         "<think>x</think><tool_call>{}</tool_call>"),
    ],
)  # fmt: skip
def test_decode_keeps_the_markers_the_format_needs(family: str, text: str, kept: str) -> None:
    tok = _family(family)
    renderer = Renderer(tok)
    assert renderer.decode(renderer.encode(text)) == kept
    if family != "qwen3":  # a plain decode would drop the control token the parser needs
        assert tok.decode(renderer.encode(text), skip_special_tokens=True) != kept


def test_chat_template_override(tmp_path: Path) -> None:
    tok = _family("qwen3")
    set_chat_template(tok, "looprl")
    assert tok.chat_template == CHATML_TOOLS_TEMPLATE
    own = (TEMPLATES / "qwen2.5.jinja").read_text()
    set_chat_template(tok, str(TEMPLATES / "qwen2.5.jinja"))
    assert tok.chat_template == own
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": "{{ messages }}"}))
    set_chat_template(tok, str(config))
    assert tok.chat_template == "{{ messages }}"
    with pytest.raises(ValueError, match="--model.chat_template: no such file"):
        set_chat_template(tok, str(tmp_path / "missing.jinja"))
    with pytest.raises(ValueError, match="(?s)chat_template.*no such file"):
        TrainConfig.model_validate({"model": {"chat_template": str(tmp_path / "missing")}})
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    bare = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()))
    with pytest.warns(UserWarning, match="im_start"):
        set_chat_template(bare, "looprl")
