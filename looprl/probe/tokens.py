"""Token-exactness of one rendered episode: what `looprl env check` and the tests hold episodes to.

An episode rendered token by token (`looprl.rollout.transcript`) is token-exact when its one
trajectory splits into runs of mask 0 (prompt, environment messages, template glue) and mask 1
(sampled tokens) such that: the first run is the rendered prompt; there is one sampled run per
assistant turn, decoding to the text the model sampled; decoding the whole trajectory gives the
chat template's rendering of the conversation with each assistant message as sampled (only the
template's closing whitespace may follow); and every environment message sits in a masked run.
"""

from __future__ import annotations

from typing import Any

from looprl.envs.base import Environment
from looprl.rendering.renderer import Renderer
from looprl.types import EpisodeResult, Message


def mask_spans(token_ids: list[int], mask: list[int]) -> list[tuple[int, list[int]]]:
    """The trajectory as runs `(mask value, token ids)` of equal mask."""
    spans: list[tuple[int, list[int]]] = []
    for token, bit in zip(token_ids, mask, strict=True):
        if spans and spans[-1][0] == bit:
            spans[-1][1].append(token)
        else:
            spans.append((bit, [token]))
    return spans


def token_problems(episode: EpisodeResult, env: Environment, tokenizer: Any) -> list[str]:
    """What breaks token-exactness in `episode` (rendered with `tokenizer`), one line each; none
    when it is token-exact as the module docstring states."""
    if len(episode.trajectories) != 1:
        return [f"{len(episode.trajectories)} trajectories, expected 1 (a template break)"]
    traj = episode.trajectories[0]
    traj.check()
    renderer = Renderer(tokenizer, env.for_task(episode.task).tool_schemas)
    spans = mask_spans(traj.token_ids, traj.mask)
    assistant = [m for m in episode.messages if m.role == "assistant"]
    sampled = [ids for bit, ids in spans if bit == 1]
    if not len(sampled) == len(assistant) == episode.num_turns:
        return [
            f"{len(sampled)} sampled spans for {len(assistant)} assistant messages and "
            f"{episode.num_turns} turns"
        ]
    problems = [
        f"turn {i}: sampled tokens decode to {tokenizer.decode(ids, skip_special_tokens=True)!r},"
        f" the message holds {msg.raw!r}"
        for i, (ids, msg) in enumerate(zip(sampled, assistant, strict=True))
        if tokenizer.decode(ids, skip_special_tokens=True) != msg.raw
    ]
    if spans[0] != (0, renderer.prompt_ids(episode.task.prompt)):
        problems.append("the first masked span is not the rendered prompt")
    as_sampled = [
        Message(role="assistant", content=m.raw) if m.role == "assistant" else m
        for m in episode.messages
    ]
    rendered = renderer.render_text(as_sampled, add_generation_prompt=False)
    decoded = tokenizer.decode(traj.token_ids, skip_special_tokens=False)
    if not (rendered.startswith(decoded) and rendered[len(decoded) :].strip() == ""):
        problems.append("the tokens do not decode to the chat template's rendering")
    env_text = "".join(
        tokenizer.decode(ids, skip_special_tokens=False) for bit, ids in spans[1:] if bit == 0
    )
    for msg in episode.messages[len(episode.task.prompt) :]:
        if msg.role != "assistant" and msg.content not in env_text:
            problems.append(f"a {msg.role} message is not in a masked span: {msg.content[:60]!r}")
    return problems
