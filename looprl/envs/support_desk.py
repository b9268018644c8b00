"""The support desk: a customer, an orders database, three Python tools and one MCP tool.

Each task is one customer with one goal: the tracking number of an order (`status`), a refund
(`refund`) or a new shipping address (`address`). The customer's opening message does not give
the order number: the agent asks, and the simulated user (`customer`, scripted; or a model, with
`user={"kind": ..., "model": ...}`) answers with it, then ends the conversation at the agent's
next reply without a tool call. The agent reads the order with `lookup_order`, the refund rule
with `refund_policy` (an MCP server, `looprl.envs.support_policy`) and acts with `refund` or
`change_address`. The tools do what they are asked: keeping to the policy is the agent's job.

Each episode gets its own copy of the task's orders (`setup_state`), so concurrent episodes of
one task never see each other's changes. The reward (`resolved`) reads the episode's tool
results and the final database: the order read (and the policy, for a refund), the goal met,
exactly the allowed change made and no other; `policy_violation` counts refunds
and address changes the policy forbids (a refund of an order not delivered or past its window,
an address change of an order already shipped).
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
import sys
from typing import Annotated, Any

import looprl
from looprl.envs.support_policy import REFUND_DAYS, policy_text

SYSTEM_PROMPT = (
    "You are a customer support agent for an online shop. Ask the customer for their order "
    "number, look the order up, check the refund policy before any refund, and only refund or "
    "change an address when the policy allows it (addresses only before shipping). Then tell "
    "the customer what you did."
)
PERSONA = (
    "You are a customer of an online shop talking to its support agent. Your goal: {goal} Your "
    "order number is {order_id}; give it when asked. Write one or two short sentences per turn. "
    "When the agent has answered your request, write ###DONE###."
)
ITEMS = {
    "electronics": ["wireless headphones", "phone charger", "smart watch"],
    "clothing": ["wool coat", "running shoes", "rain jacket"],
    "books": ["cookbook", "travel guide", "box set of novels"],
    "toys": ["puzzle", "kite", "model train"],
}
STREETS = ["Elm Street", "Oak Avenue", "Mill Road", "Harbour Lane", "Station Road", "Park Row"]
TOWNS = ["Springfield", "Riverton", "Lakeside", "Northwood"]
KINDS = ("status", "refund", "address")
Orders = dict[str, dict[str, Any]]


def _address(rng: random.Random) -> str:
    return f"{rng.randint(1, 99)} {rng.choice(STREETS)}, {rng.choice(TOWNS)}"


def _order(rng: random.Random, order_id: str, status: str) -> dict[str, Any]:
    category = rng.choice(sorted(ITEMS))
    delivered = status == "delivered"
    return {
        "order_id": order_id, "item": rng.choice(ITEMS[category]), "category": category,
        "status": status, "days_since_delivery": rng.randint(1, 90) if delivered else None,
        "address": _address(rng), "tracking": f"TRK-{rng.randint(100000, 999999)}",
        "refunded": False,
    }  # fmt: skip


def allowed(kind: str, order: dict[str, Any]) -> bool:
    """Whether the policy allows the task's action on the order (a status lookup always is)."""
    if kind == "refund":
        days = order["days_since_delivery"]
        return order["status"] == "delivered" and days <= REFUND_DAYS[order["category"]]
    return kind == "status" or order["status"] == "processing"


def make_task(rng: random.Random) -> looprl.Task:
    """One customer: an orders table of three, a goal about one of them, its opening message."""
    ids = rng.sample(range(1000, 10000), 3)
    orders = [_order(rng, f"A{i}", rng.choice(["processing", "shipped", "delivered"])) for i in ids]
    target, kind = orders[0], rng.choice(KINDS)
    new_address = _address(rng)
    opening, goal = {
        "status": ("Hi, where is my {item}? I need its tracking number.",
                   "learn the tracking number of your {item}."),
        "refund": ("Hello, I would like a refund for my {item}.", "get a refund for your {item}."),
        "address": (f"Hi, please send my {{item}} to {new_address} instead.",
                    f"have your {{item}} sent to {new_address}."),
    }[kind]  # fmt: skip
    answer = target["tracking"] if kind == "status" else kind if allowed(kind, target) else "no"
    info = {"kind": kind, "order_id": target["order_id"], "new_address": new_address,
            "goal": goal.format(item=target["item"]), "orders": orders}  # fmt: skip
    prompt = [looprl.Message(role="user", content=opening.format(item=target["item"]))]
    digest = hashlib.sha256(json.dumps([prompt[0].content, info]).encode()).hexdigest()[:12]
    return looprl.Task(f"support-{digest}", prompt, answer, info, env="support_desk")


def generate_tasks(split: str, n: int, seed: int) -> list[looprl.Task]:
    """`n` customers of a split; the same (split, seed) gives the same tasks."""
    rng = random.Random(f"support_desk-{split}-{seed}")
    return [make_task(rng) for _ in range(n)]


def customer(messages: list[looprl.Message], task: looprl.Task) -> str | None:
    """The scripted customer: gives the order number at the agent's first reply, then ends."""
    if sum(m.role == "user" for m in messages) == 1:
        return f"My order number is {task.info['order_id']}."
    return None


# --- tools: the database is the episode's own copy (a hidden argument) ----------------------


def _find(db: Orders, order_id: str) -> dict[str, Any]:
    if order_id not in db:
        raise ValueError(f"no order {order_id!r}; ask the customer for their order number")
    return db[order_id]


def lookup_order(order_id: str, db: Annotated[Orders, looprl.Hidden("db")]) -> str:
    """Look up an order by its number (like A1234): item, category, status, address, tracking."""
    return json.dumps(_find(db, order_id))


def refund(order_id: str, db: Annotated[Orders, looprl.Hidden("db")]) -> str:
    """Refund an order in full."""
    order = _find(db, order_id)
    if order["refunded"]:
        raise ValueError(f"order {order_id} is already refunded")
    order["refunded"] = True
    return f"Refunded order {order_id}."


def change_address(
    order_id: str, new_address: str, db: Annotated[Orders, looprl.Hidden("db")]
) -> str:
    """Change the shipping address of an order."""
    _find(db, order_id)["address"] = new_address
    return f"The shipping address of order {order_id} is now {new_address}."


class SupportDesk(looprl.ToolEnv):
    """A `ToolEnv` whose episodes each get their own copy of the task's orders (`state["db"]`)."""

    async def setup_state(self, task: looprl.Task) -> dict[str, Any]:
        """The base state plus `db`: a deep copy of the task's orders by number."""
        state = await super().setup_state(task)
        state["db"] = {o["order_id"]: copy.deepcopy(o) for o in task.info["orders"]}
        return state


# --- rubric: the final database -------------------------------------------------------------


def _changes(episode: looprl.EpisodeResult) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the task's orders, the episode's final orders), in the same order."""
    before = episode.task.info["orders"]
    db = episode.state.get("db", {})
    return before, [db.get(o["order_id"], o) for o in before]


def policy_violation(episode: looprl.EpisodeResult) -> float:
    """Refunds and address changes the policy forbids, on any order (metric)."""
    count = 0
    for old, new in zip(*_changes(episode), strict=True):
        count += new["refunded"] and not allowed("refund", old)
        count += new["address"] != old["address"] and not allowed("address", old)
    return float(count)


def informed(episode: looprl.EpisodeResult, target: dict[str, Any]) -> bool:
    """Whether the agent read what its decision needs: the target order (`lookup_order`) and,
    for a refund, the rule of its category (`refund_policy`). Doing nothing is right when the
    policy forbids the action, but only after checking."""
    read = [m.content for m in episode.messages if m.role == "tool"]
    needed = [json.dumps(target)]
    if episode.task.info["kind"] == "refund":
        needed.append(policy_text(target["category"]))
    return all(text in read for text in needed)


def resolved(episode: looprl.EpisodeResult) -> float:
    """1.0 when the agent read the order (and the policy, for a refund), the final database is
    exactly what the policy and the goal ask for, and a status request was answered with the
    tracking number (the reward)."""
    info, (before, after) = episode.task.info, _changes(episode)
    target = next(o for o in before if o["order_id"] == info["order_id"])
    want = copy.deepcopy(before)
    changed = next(o for o in want if o["order_id"] == info["order_id"])
    if info["kind"] == "refund" and allowed("refund", target):
        changed["refunded"] = True
    if info["kind"] == "address" and allowed("address", target):
        changed["address"] = info["new_address"]
    told = info["kind"] != "status" or target["tracking"] in looprl.final_answer_text(episode)
    return float(informed(episode, target) and after == want and told)


def load_environment(
    user: str | dict[str, Any] = "scripted",
    max_turns: int = 8,
    max_tokens_per_turn: int = 128,
    max_context_tokens: int = 2048,
    **kwargs: Any,
) -> SupportDesk:
    """The support desk (reward: `resolved`; metrics: policy violations, tool use).

    `user`: "scripted" (`customer`), or a model playing the customer with `PERSONA`: a table
    `{kind = "torch" | "openai", model = ..., base_url = ...}` as a judge's.
    """
    return SupportDesk(
        name="support_desk",
        tools=[lookup_order, refund, change_address],
        mcp=[{"command": [sys.executable, "-m", "looprl.envs.support_policy"]}],
        user=customer if user == "scripted" else model_user(user),
        rubric=looprl.Rubric(
            [resolved, policy_violation, looprl.used_tool, looprl.tool_call_validity],
            [1.0, 0.0, 0.0, 0.0],
        ),
        train_tasks=lambda n, seed: generate_tasks("train", n, seed),
        eval_tasks=lambda n, seed: generate_tasks("eval", n, seed),
        limits=looprl.Limits(max_turns, max_tokens_per_turn, max_context_tokens),
        system_prompt=kwargs.pop("system_prompt", SYSTEM_PROMPT),
        **kwargs,
    )


def model_user(spec: Any) -> looprl.ModelUser:
    """A model playing the customer, from `{kind, model, base_url}` (ValueError naming the fix)."""
    keys = set(spec) if isinstance(spec, dict) else set()
    if not {"kind", "model"} <= keys <= {"kind", "model", "base_url"}:
        raise ValueError(
            f"user must be 'scripted' or a table {{kind = 'torch' | 'openai', model = ..., "
            f"base_url = ...}}, got {spec!r}"
        )
    return looprl.ModelUser.from_model(
        spec["kind"], spec["model"], PERSONA, base_url=spec.get("base_url"), end_marker="###DONE###"
    )
