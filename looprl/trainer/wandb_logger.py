"""Weights & Biases mirror of a training run: metrics each step, the config, rollouts and the plot.

`run.wandb = true` turns it on; it needs the `wandb` extra (`pip install -e '.[wandb]'`),
imported only then. The run directory stays the record (metrics.jsonl, TensorBoard, rollouts,
plots); W&B gets a copy:

- every metrics row the trainer logs, at its step (the evaluation before training at step 0);
- the resolved config (`config.json`'s content) as the W&B run config;
- a `rollouts` table of a few episodes per step (`run.wandb_rollouts`, spread over the groups):
  task id, reward, reward functions, stop reason, turns, errors, prompt and conversation;
- the training plot (`plots/curves.png`) as an image each time it is drawn.

Mode: `offline` unless `run.wandb_mode` or the `WANDB_MODE` variable says otherwise; nothing
leaves the machine, and `wandb sync DIR/wandb/offline-run-*` uploads it later. Files go under
`run.wandb_dir`, else the `WANDB_DIR` variable, else the run directory. A resumed run continues the same W&B
run (its id is kept in `wandb_run_id` in the run directory).

W&B stays quiet: no banner or summary (`silent`), no capture of the console (`console="off"`),
no system-metrics sampler and no git or code capture. `close()` finishes the run; a run that
dies is finished by wandb's own exit hook, which does not wait on a network in offline mode.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from looprl.types import EpisodeResult, Message

if TYPE_CHECKING:
    from looprl.trainer.config import RunSection

WANDB_EXTRA = "wandb"
RUN_ID_FILE = "wandb_run_id"
MODES = ("offline", "online", "disabled")
TABLE_COLUMNS = (
    "step",
    "task_id",
    "reward",
    "rewards",
    "stop_reason",
    "turns",
    "tool_calls",
    "errors",
    "prompt",
    "conversation",
)


def import_wandb() -> Any:
    """The `wandb` module, or an ImportError that names the extra to install."""
    try:
        import wandb
    except ImportError:
        raise ImportError(
            "run.wandb = true needs the wandb package: pip install -e '.[wandb]' "
            "(or set run.wandb = false)"
        ) from None
    return wandb


def resolve_mode(mode: str | None) -> str:
    """`mode` when given, else the `WANDB_MODE` variable, else `offline`; checked against MODES."""
    chosen = mode or os.environ.get("WANDB_MODE") or "offline"
    if chosen not in MODES:
        raise ValueError(f"W&B mode {chosen!r} (from WANDB_MODE); choose one of {list(MODES)}")
    return chosen


class WandbLogger:
    """One W&B run mirroring a looprl run; see the module docstring for what is logged."""

    def __init__(
        self,
        run_dir: str | Path,
        *,
        config: Mapping[str, Any],
        project: str = "looprl",
        entity: str | None = None,
        mode: str | None = None,
        directory: str | Path | None = None,
        rollouts: int = 4,
        resume: bool = False,
    ) -> None:
        wandb = import_wandb()
        self._wandb = wandb
        self.run_dir = Path(run_dir)
        self.rollouts = rollouts
        self.mode = resolve_mode(mode)
        out = Path(directory or os.environ.get("WANDB_DIR") or self.run_dir)
        out.mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(
            mode=self.mode, silent=True, console="off", x_disable_stats=True,
            x_disable_machine_info=True, disable_git=True, disable_code=True,
        )  # fmt: skip
        run_id = self._run_id(resume)
        # wandb advertises Weave in three console lines when mcp, openai or verifiers are
        # imported (silent=True does not cover it); a user who wants Weave sets this to false
        os.environ.setdefault("WANDB_DISABLE_WEAVE", "true")
        try:
            self.run = wandb.init(
                project=project, entity=entity, dir=str(out), name=self.run_dir.name,
                id=run_id, resume="allow", config=dict(config), settings=settings,
                reinit="finish_previous",
            )  # fmt: skip
        except Exception as exc:  # wandb raises its own errors (no login, no network online)
            raise RuntimeError(
                f"W&B could not start a run in {self.mode} mode ({exc}); log in with `wandb "
                "login`, or use run.wandb_mode = 'offline' (upload later with `wandb sync`)"
            ) from exc

    def _run_id(self, resume: bool) -> str:
        """The W&B run id: the one this run directory used before when resuming, else a new one."""
        path = self.run_dir / RUN_ID_FILE
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if resume and path.is_file():
            return path.read_text(encoding="utf-8").strip()
        run_id = uuid.uuid4().hex[:8]  # the length and alphabet of W&B's own ids
        path.write_text(run_id + "\n", encoding="utf-8")
        return run_id

    def log(self, step: int, row: Mapping[str, Any]) -> None:
        """A metrics row at `step` (its `step` key dropped, null values left out)."""
        values = {k: v for k, v in row.items() if k != "step" and v is not None}
        self.run.log(values, step=int(step))

    def log_rollouts(self, step: int, episodes: Sequence[EpisodeResult]) -> None:
        """A `rollouts` table of up to `rollouts` episodes, spread over the batch."""
        if not self.rollouts or not episodes:
            return
        stride = max(1, len(episodes) // self.rollouts)
        chosen = list(episodes[::stride])[: self.rollouts]
        table = self._wandb.Table(columns=list(TABLE_COLUMNS))
        for ep in chosen:
            table.add_data(*episode_row(step, ep))
        self.run.log({"rollouts": table}, step=int(step))

    def log_plot(self, step: int, path: str | Path) -> None:
        """The training plot (a PNG file) as the `plot` image at `step`."""
        self.run.log({"plot": self._wandb.Image(str(path))}, step=int(step))

    def close(self) -> None:
        """Finish the W&B run (writes its last records; nothing to upload in offline mode)."""
        if self.run is not None:
            self.run.finish()
            self.run = None


def episode_row(step: int, episode: EpisodeResult) -> list[Any]:
    """One table row of an episode, in the order of TABLE_COLUMNS."""
    prompt = [m for m in episode.messages[: len(episode.task.prompt)]]
    conversation = episode.messages[len(episode.task.prompt) :]
    return [
        int(step),
        episode.task.id,
        float(episode.reward),
        json.dumps(episode.rewards, sort_keys=True),
        episode.stop_reason,
        episode.num_turns,
        episode.num_tool_calls,
        "; ".join(f"{e['kind']}: {e['message']}" for e in episode.errors),
        _text(prompt),
        _text(conversation),
    ]


def _text(messages: Sequence[Message]) -> str:
    """Messages as `role: text` blocks; an assistant's text is what it sampled."""
    return "\n\n".join(
        f"{m.role}: {(m.raw or m.content) if m.role == 'assistant' else m.content}"
        for m in messages
    )


def for_run(
    run: RunSection, run_dir: Path, config: Mapping[str, Any], *, resume: bool
) -> WandbLogger | None:
    """The W&B logger a run's `[run]` section asks for (None when `run.wandb` is false)."""
    if not run.wandb:
        return None
    return WandbLogger(
        run_dir, config=config, project=run.wandb_project, entity=run.wandb_entity,
        mode=run.wandb_mode, directory=run.wandb_dir, rollouts=run.wandb_rollouts, resume=resume,
    )  # fmt: skip
