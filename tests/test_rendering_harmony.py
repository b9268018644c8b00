"""gpt-oss harmony on its typed-in chat template: channels, calls, stop tokens, token exactness.

The template is tests/data/templates/gpt-oss.jinja; the tokenizer is the tiny BPE with gpt-oss's
special tokens added (`families.json`). The engine below writes every character of a reply as
its own token(s), ids no tokenizer would give for the text, so a re-encoded sampled turn shows.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import datetime
from functools import cache
from typing import Any

import pytest
from helpers import family_tokenizer

from looprl.engines.base import GenerationRequest
from looprl.envs.calculator import correct_answer, load_environment
from looprl.envs.wordle import load_environment as load_wordle
from looprl.probe.tokens import mask_spans
from looprl.rendering.formats.harmony import HarmonyParser
from looprl.rendering.parser import BAD_ARGUMENTS, BAD_NAME, INVALID_JSON, UNCLOSED_TAG
from looprl.rendering.renderer import Renderer
from looprl.rollout.loop import rollout
from looprl.sft import teachers
from looprl.types import EpisodeResult, Generation, Message, ToolCall

MARKERS = re.compile(r"(<\|[a-z]+\|>)")
CALL_1 = (
    "<|channel|>analysis<|message|>First the product.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.calculate <|constrain|>json"
    '<|message|>{"expression": "681 * 151"}<|call|>'
)  # the recipient after the channel, as gpt-oss usually writes it
CALL_2 = (
    "<|channel|>analysis<|message|>Now add 995.<|end|>"
    '<|start|>assistant to=functions.calculate<|channel|>commentary json<|message|>{"expression": '
    '"102831 + 995"}<|call|>'
)  # the recipient before the channel, as the template writes it
ANSWER = (
    "<|channel|>analysis<|message|>Both done.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>The answer is 103826.<|return|>"
)


@cache
def tokenizer() -> Any:
    return family_tokenizer("gpt-oss")


class CharEngine:
    """Replies from a list, each harmony token as its one id and every other character as its
    own token(s); keeps what it returned. The replies carry their own stop token."""

    token_level = True

    def __init__(self, replies: list[str] | Callable[[list[Message]], str]) -> None:
        self.replies = replies
        self.outputs: list[list[int]] = []

    async def generate(self, request: GenerationRequest) -> Generation:
        if callable(self.replies):
            text = self.replies(request.messages)
        else:
            text = self.replies[sum(m.role == "assistant" for m in request.messages)]
        tok = tokenizer()
        ids = [i for part in MARKERS.split(text) for i in _char_ids(tok, part)]
        self.outputs.append(ids)
        return Generation(text=text, token_ids=ids, logprobs=[-0.5] * len(ids))

    async def close(self) -> None:
        """Nothing to release."""


def _char_ids(tok: Any, part: str) -> list[int]:
    if MARKERS.fullmatch(part):
        return [tok.convert_tokens_to_ids(part)]
    return [i for ch in part for i in tok.encode(ch, add_special_tokens=False)]


def _head(system: str, tools: bool = True) -> str:
    """The system and developer messages gpt-oss's template writes (calculator's tool)."""
    today = datetime.now().strftime("%Y-%m-%d")
    head = (
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
        f"Knowledge cutoff: 2024-06\nCurrent date: {today}\n\nReasoning: medium\n\n"
        "# Valid channels: analysis, commentary, final. Channel must be included for every "
        "message."
    )
    if not tools:
        return f"{head}<|end|><|start|>developer<|message|># Instructions\n\n{system}\n\n<|end|>"
    return (
        f"{head}\nCalls to these tools must go to the commentary channel: 'functions'.<|end|>"
        f"<|start|>developer<|message|># Instructions\n\n{system}\n\n# Tools\n\n## functions\n\n"
        "namespace functions {\n\n// Evaluate an arithmetic expression and return its value.\n"
        "type calculate = (_: {\n// The expression, e.g. (12 + 3) * 4.\nexpression: string,\n"
        "}) => any;\n\n} // namespace functions<|end|>"
    )


def _tool(content: str) -> str:
    return (
        "<|start|>functions.calculate to=assistant<|channel|>commentary<|message|>"
        f"{json.dumps(content)}<|end|>"
    )


async def _play(replies: list[str], env: Any = None) -> tuple[EpisodeResult, CharEngine, Renderer]:
    env = env or load_environment(max_tokens_per_turn=512, max_context_tokens=4096)
    renderer = Renderer(tokenizer(), env.tool_schemas)
    engine = CharEngine(replies)
    task = env.get_tasks("eval", 1, seed=0)[0]
    task.prompt = [*task.prompt[:-1], Message(role="user", content="What is 681 * 151 + 995?")]
    task.answer = "103826"
    return await rollout(env, engine, task, renderer=renderer), engine, renderer


def test_the_typed_in_template_writes_harmony() -> None:
    """A finished episode as the template writes it for training: the answer keeps its analysis
    and ends in <|return|>; the calls' analysis is dropped once a final answer follows."""
    renderer = Renderer(tokenizer(), load_environment().tool_schemas)
    call = ToolCall(name="calculate", arguments={"expression": "2 + 3"}, id="call_0")
    msgs = [
        Message(role="system", content="Be brief."),
        Message(role="user", content="What is 2 + 3?"),
        Message(role="assistant", tool_calls=[call], reasoning_content="Add them."),
        Message(role="tool", content="5", tool_call_id="call_0", name="calculate"),
        Message(role="assistant", content="It is 5.", reasoning_content="Done."),
    ]
    body = (
        "<|start|>user<|message|>What is 2 + 3?<|end|>"
        "<|start|>assistant to=functions.calculate<|channel|>commentary json"
        '<|message|>{"expression": "2 + 3"}<|call|>' + _tool("5")
    )
    answer = "<|start|>assistant<|channel|>analysis<|message|>Done.<|end|><|start|>assistant"
    answer += "<|channel|>final<|message|>It is 5.<|return|>"
    assert renderer.render_text(msgs, add_generation_prompt=False) == (
        _head("Be brief.") + body + answer
    )
    asking = renderer.render_text(msgs[:-1], add_generation_prompt=True)
    analysis = "<|start|>assistant<|channel|>analysis<|message|>Add them.<|end|>"
    assert asking == _head("Be brief.") + body.replace("<|start|>assistant to", analysis + "<|start|>assistant to") + "<|start|>assistant"  # fmt: skip


async def test_a_tool_episode_is_token_exact() -> None:
    """Reasoning, two calls and an answer: one segment, the sampled ids exactly as returned
    (never re-encoded), between them exactly the tokens the template writes, no glue after
    <|call|>."""
    ep, engine, renderer = await _play([CALL_1, CALL_2, ANSWER])
    assert not ep.errors and not ep.tool_errors and ep.stop_reason == "done"
    assert correct_answer(ep) == 1.0
    [traj] = ep.trajectories
    traj.check()
    spans = mask_spans(traj.token_ids, traj.mask)
    assert [ids for m, ids in spans if m == 1] == engine.outputs
    system = "You are a careful assistant. Use the calculate tool for arithmetic, then reply "
    system += "with 'The answer is N.'"
    results = [m.content for m in ep.messages if m.role == "tool"]
    assert results == ["102831", "103826"]
    context = [
        _head(system) + "<|start|>user<|message|>What is 681 * 151 + 995?<|end|><|start|>assistant",
        _tool(results[0]) + "<|start|>assistant",
        _tool(results[1]) + "<|start|>assistant",
    ]
    assert [ids for m, ids in spans if m == 0] == [renderer.encode(c) for c in context]
    replies = [m for m in ep.messages if m.role == "assistant"]
    assert [m.reasoning_content for m in replies] == ["First the product.", "Now add 995.", "Both done."]  # fmt: skip
    assert [m.content for m in replies] == ["", "", "The answer is 103826."]
    assert [c.arguments for m in replies for c in m.tool_calls] == [
        {"expression": "681 * 151"},
        {"expression": "102831 + 995"},
    ]


@pytest.mark.parametrize(
    ("text", "reasoning", "content", "calls"),
    [
        (ANSWER, "Both done.", "The answer is 103826.", []),
        (CALL_1, "First the product.", "", [("calculate", {"expression": "681 * 151"})]),
        (CALL_2, "Now add 995.", "", [("calculate", {"expression": "102831 + 995"})]),
        # an earlier answer closes with <|end|>, a cut one with nothing: the text is the same
        ("<|channel|>final<|message|>Four.<|end|>", "", "Four.", []),
        ("<|channel|>final<|message|>Four.", "", "Four.", []),
        ("<|channel|>final<|message|>Four.<|end|><|start|>assistant<|channel|>fin", "", "Four.", []),
        # a preamble on the commentary channel is answer text; no harmony tokens: all answer
        ("<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant<|channel|>"
         "final<|message|>Four.<|return|>", "", "Let me check.\n\nFour.", []),
        ("Plain text.", "", "Plain text.", []),
        ("<|channel|>analysis<|message|>Thinking, cut off", "Thinking, cut off", "", []),
    ],
)  # fmt: skip
def test_parse_splits_channels(text: str, reasoning: str, content: str, calls: list[Any]) -> None:
    turn = Renderer(tokenizer()).parse(text)
    assert (turn.reasoning, turn.content, turn.errors) == (reasoning, content, [])
    assert [(c.name, c.arguments) for c in turn.calls] == calls


def _call(recipient: str, body: str, end: str = "<|call|>") -> str:
    return f"<|channel|>commentary to={recipient} json<|message|>{body}{end}"


@pytest.mark.parametrize(
    ("text", "kind", "told"),
    [
        (_call("functions.calculate", '{"expression": 1'), INVALID_JSON, "not strict JSON"),
        (_call("functions.calculate", '{"x": NaN}'), INVALID_JSON, "not strict JSON"),
        (_call("functions.calculate", '["1 + 1"]'), BAD_ARGUMENTS, "one JSON object"),
        (_call("functions.calculate", "{}", "<|end|>"), UNCLOSED_TAG, "closed by <|end|>"),
        (_call("functions.calculate", "{}", ""), UNCLOSED_TAG, "never closed"),
        (_call("browser.search", "{}"), BAD_NAME, "not a function"),
        (_call("functions.", "{}"), BAD_NAME, "non-empty string"),
    ],
)
def test_malformed_calls_are_parse_errors(text: str, kind: str, told: str) -> None:
    turn = HarmonyParser().parse(text)
    [error] = turn.errors
    assert (turn.calls, error.kind, error.id) == ([], kind, "call_0")
    assert told in error.message and error.raw == text


async def test_a_malformed_call_reaches_the_model_token_exactly() -> None:
    """The bad call is answered by a tool message (the template renders it after the call as
    written) in the same segment; the engine's ids stay as sampled."""
    bad = _call("functions.calculate", '{"expression": 681 *')
    ep, engine, _ = await _play([bad, CALL_1, CALL_2, ANSWER])
    assert ep.tool_errors == {"malformed_json": 1} and not ep.errors
    first = next(m for m in ep.messages if m.role == "tool")
    assert first.content.startswith("Error: the arguments of 'calculate' are not strict JSON")
    [traj] = ep.trajectories
    assert [ids for m, ids in mask_spans(traj.token_ids, traj.mask) if m == 1] == engine.outputs
    assert correct_answer(ep) == 1.0


async def test_a_call_cut_before_its_stop_token_gets_it_as_glue() -> None:
    """A call turn that stopped before <|call|> (a stop string): the template's <|call|> is
    added with mask 0 before the tool message, never an answer's <|return|>."""
    cut = CALL_1.removesuffix("<|call|>")
    ep, _, renderer = await _play([cut, CALL_1, CALL_2, ANSWER])
    assert ep.tool_errors == {"malformed_json": 1}
    [traj] = ep.trajectories
    spans = mask_spans(traj.token_ids, traj.mask)
    error = next(m.content for m in ep.messages if m.role == "tool")
    glue = renderer.encode("<|call|>" + _tool(error) + "<|start|>assistant")
    assert spans[2] == (0, glue)


async def test_answers_before_a_user_turn_are_rewritten_so_each_turn_is_a_segment() -> None:
    """gpt-oss's template closes a past answer with <|end|> and drops its analysis: each user
    turn starts a new segment whose prompt is the template's own rendering (as Qwen3)."""
    env = load_wordle(max_tokens_per_turn=512, max_context_tokens=8192)

    def reply(messages: list[Message]) -> str:  # the teacher's guess, with its analysis
        guess = teachers.wordle(messages)
        return (
            f"<|channel|>analysis<|message|>Guess {guess[7:12]}.<|end|><|start|>assistant"
            f"<|channel|>final<|message|>{guess}<|return|>"
        )

    renderer = Renderer(tokenizer(), env.tool_schemas)
    engine = CharEngine(reply)
    task = env.get_tasks("eval", 1, seed=0)[0]
    ep = await rollout(env, engine, task, renderer=renderer)
    assert ep.stop_reason == "done" and not ep.errors
    assert len(ep.trajectories) == ep.num_turns > 1
    asked = [i for i, m in enumerate(ep.messages) if m.role == "assistant"]
    for k, traj in enumerate(ep.trajectories):
        spans = mask_spans(traj.token_ids, traj.mask)
        assert spans[0] == (0, renderer.prompt_ids(ep.messages[: asked[k]]))
        assert spans[1] == (1, engine.outputs[k])
    second_turn = ep.trajectories[1]
    second = renderer.tokenizer.decode(second_turn.token_ids[: second_turn.mask.index(1)])
    assert "<|channel|>final<|message|><guess>slate</guess><|end|>" in second
    assert "Guess slate." not in second


def test_a_call_turn_with_a_preamble_renders_its_analysis() -> None:
    """A commentary preamble before a call is answer text; the template takes one text for a
    call turn (its analysis), so the renderer gives it the reasoning alone instead of failing."""
    text = (
        "<|channel|>analysis<|message|>Plan.<|end|><|start|>assistant<|channel|>commentary"
        "<|message|>Checking.<|end|>" + CALL_2.split("<|end|>", 1)[1]
    )
    renderer = Renderer(tokenizer(), load_environment().tool_schemas)
    turn = renderer.parse(text)
    assert (turn.reasoning, turn.content, len(turn.calls)) == ("Plan.", "Checking.", 1)
    msgs = [
        Message(role="user", content="q"),
        Message(role="assistant", content=turn.content, tool_calls=turn.calls, reasoning_content="Plan."),
    ]  # fmt: skip
    rendered = renderer.render_text(msgs, add_generation_prompt=False)
    assert rendered.endswith(
        "<|start|>assistant<|channel|>analysis<|message|>Plan.<|end|><|start|>assistant "
        'to=functions.calculate<|channel|>commentary json<|message|>{"expression": "102831 + 995"}'
        "<|call|>"
    )
