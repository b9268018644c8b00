"""The RL training loop: sample groups -> score -> advantages -> update -> sync -> eval -> log -> checkpoint."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable, Coroutine
from functools import partial
from pathlib import Path
from typing import Any

from looprl.console import console
from looprl.engines.base import TrainableEngine
from looprl.eval.run import EvalJob, run_eval
from looprl.eval.summary import summarize
from looprl.files import write_text_atomically
from looprl.models.weights import frozen_copy
from looprl.rendering.renderer import Renderer
from looprl.rendering.templates import set_chat_template
from looprl.rollout.loop import RolloutConfig
from looprl.trainer import distributed as D
from looprl.trainer import setup as S
from looprl.trainer.async_batches import Ahead, AheadSource, Batch
from looprl.trainer.batch import StalenessBound, samples_from_groups
from looprl.trainer.collect import Collector, step_seed
from looprl.trainer.config import ConfigError, TrainConfig
from looprl.trainer.curriculum.sampler import task_sampler
from looprl.trainer.metrics import batch_metrics, eval_metrics, update_metrics
from looprl.trainer.monitors.core import Monitors
from looprl.trainer.nonfinite import NonFiniteGuard
from looprl.trainer.precision import compute_dtype
from looprl.trainer.progress import ErroredBatches, NoGradientWarning, StepPhases
from looprl.trainer.run_config import absolute_paths
from looprl.trainer.run_lock import RunLock, check_run_free, run_stamp
from looprl.trainer.run_summary import RunStatus, write_run_summary
from looprl.trainer.stream_shared import open_shared_stream
from looprl.trainer.streaming import StreamSource, open_stream
from looprl.trainer.update import UpdateContext, ValueHead, train_on_batch
from looprl.trainer.wandb_logger import WandbLogger, for_run
from looprl.types import EpisodeResult, SamplingParams


class Trainer:
    """Owns one training run. `Trainer(cfg).run()` trains, evaluates, checkpoints and exports."""

    def __init__(
        self, cfg: TrainConfig, *, run_dir: Path | None = None, resume: bool = False
    ) -> None:
        self.cfg = cfg = absolute_paths(cfg)  # config.json holds no path of this folder's
        self.env = S.load_env(cfg)  # before any heavy work: a bad env name fails fast
        name = cfg.run.name or f"{self.env.name}-{cfg.algorithm.preset}-{run_stamp()}"
        self.run_dir = run_dir or Path(cfg.run.output_dir) / name
        check_run_free(self.run_dir)  # a live trainer there: one line, nothing written
        S.check_servers(cfg)  # engine.base_urls: each an http(s) URL where a server answers
        metrics = self.run_dir / "metrics.jsonl"
        if not resume and metrics.is_file() and metrics.stat().st_size > 0:
            raise ConfigError(  # before anything is written: the earlier run stays intact
                f"{self.run_dir} already holds a training run; continue it with --resume, or "
                "start a new one under another name (--run.name NAME or --run-dir DIR)"
            )
        if D.torchrun_world_size() > 1:  # before any process group: a refusal costs nothing
            refused = D.unsupported(cfg)
            if refused:
                raise ConfigError("not yet supported with several processes: " + "; ".join(refused))
        if resume:  # under the number of processes that wrote the checkpoint, or one clear line
            from looprl.trainer.checkpoint.sharded import check_resume_world

            check_resume_world(self.run_dir, D.torchrun_world_size())
        self.resume = resume
        self.dist: D.Dist | None = None  # set by _setup under torchrun
        self.is_main = True  # rank 0 (or the only process): it alone logs and writes files
        self._lock: RunLock | None = None  # rank 0's hold on the run directory, for the run
        self._closers: list[
            Callable[[], Coroutine[Any, Any, None]]
        ] = []  # run on a failed run's way out
        self.step = 0
        self.cursor = 0
        self.stopped_early = False  # set when trainer.early_stop_metric reached its value
        self.phases = StepPhases(cfg.trainer.steps, out=None)  # _loop's, shown on rank 0
        self.tasks = task_sampler(cfg, self.env)  # the seeded stream, or by curriculum and hint
        self._monitor_state: dict[str, Any] = {}  # the monitors' episode pools, from a checkpoint
        self._stream_state: dict[str, Any] | None = None

    # ---------------------------------------------------------------- set-up
    def _setup(self) -> None:
        """Everything a run needs, in order: process group, policy and placement, algorithm,
        renderer, update context, run directory, evaluation tasks and sampling."""
        cfg = self.cfg
        S.seed_everything(cfg.trainer.seed)
        self.dist, self.device = D.init_distributed(
            S.pick_device(cfg.trainer.device),
            cfg.trainer.collective_timeout_s,
            cfg.trainer.main_phase_timeout_s,
        )
        self.is_main = self.dist is None or self.dist.is_main
        self._build_policy()
        # one place decides TIS: off when the sampler holds the trainer's very weights
        self.algo = cfg.algorithm.resolve(sampler_shares_weights=self.placement.shares_weights)
        set_chat_template(self.tokenizer, cfg.model.chat_template)
        self.renderer = Renderer(
            self.tokenizer, self.env.tool_schemas, parser=cfg.model.parser,
            keep_reasoning=cfg.model.keep_reasoning,
        )  # fmt: skip
        self._build_update()
        self._open_run()
        self.eval_tasks = self.env.get_tasks("eval", cfg.trainer.eval_tasks, seed=cfg.trainer.seed)
        self.sampling = SamplingParams(
            max_tokens=cfg.rollout.max_tokens or self.env.limits.max_tokens_per_turn,
            temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k,
        )  # fmt: skip
        self.collector = Collector(
            cfg, self.env, self.engine, self.renderer, self.sampling,
            self.tasks, self.algo.dynamic_sampling, self.dist,
            self.placement.main_only,
        )  # fmt: skip

    def _build_policy(self) -> None:
        """The model (LoRA-wrapped when asked), its tokenizer, and where it generates."""
        from looprl.engines.placement import make_placement
        from looprl.models.loading import load_model

        cfg = self.cfg
        model, self.tokenizer = load_model(cfg.model.name, device=str(self.device))
        if cfg.model.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        self.model = S.wrap_lora(model, cfg) if cfg.model.lora else model
        self.model.eval()
        self.placement = make_placement(  # before sharding: a copy is taken of the full model
            self.model, self.tokenizer, cfg.engine, group=self.dist,
            generate_ahead=cfg.trainer.max_async_steps > 0, seed=cfg.trainer.seed,
            max_model_len=self.env.limits.max_context_tokens,
        )  # fmt: skip
        self._closers.append(self.engine.close)
        D.wait_for_main(self.dist)  # rank 0 may be starting vLLM servers: a slow wait

    @property
    def engine(self) -> TrainableEngine:
        """The engine rollouts sample from (the placement's)."""
        return self.placement.engine

    def _build_update(self) -> None:
        """Value head, reference model, sharding (under torchrun), optimizer, schedule, context."""
        cfg = self.cfg
        hidden = int(getattr(self.model, "config").hidden_size)  # noqa: B009
        self.value_head = ValueHead(hidden).to(self.device) if self.algo.uses_value_head else None
        self.ref_model = frozen_copy(self.model) if self.algo.kl_coef > 0 else None
        dtype = compute_dtype(cfg.model.dtype, self.device, self._warn)  # None: float32
        D.shard_all(self.dist, self.model, self.ref_model, self.value_head, dtype)
        self.optimizer = S.make_optimizer(self.model, self.value_head, cfg.optim)
        self.scheduler = S.make_scheduler(self.optimizer, cfg.optim, cfg.trainer.steps)
        ref = None if self.ref_model is None else D.for_scoring(self.ref_model, self.dist, dtype)
        self.ctx = UpdateContext(
            model=D.for_scoring(self.model, self.dist, dtype), optimizer=self.optimizer,
            scheduler=self.scheduler, algo=self.algo, pad_id=self.tokenizer.pad_token_id or 0,
            device=self.device, temperature=cfg.rollout.temperature,
            micro_batch_tokens=cfg.trainer.micro_batch_tokens, grad_clip=cfg.optim.grad_clip,
            value_head=self.value_head, ref_model=ref, dist=self.dist,
            shared_prefix=cfg.trainer.shared_prefix,
            prefix_row_tokens=cfg.trainer.prefix_row_tokens,
            skip_uniform_steps=cfg.trainer.skip_uniform_steps,
        )  # fmt: skip

    def _open_run(self) -> None:
        """Restore or start the run directory and its logger (rank 0 alone writes files)."""
        from looprl.trainer.logger import MetricsLogger

        if self.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._lock = RunLock(self.run_dir)  # before restoring or writing anything
        restored = self.resume and self._restore()  # False: a new run, or no checkpoint yet
        if self.is_main:  # the config the run goes on with (a resume changed safe fields only)
            record = json.dumps(self._config_record(), indent=2)
            write_text_atomically(self.run_dir / "config.json", record)
        if not restored:
            self.placement.first_sync(self.model)  # servers by URL may hold other weights
        self.logger: MetricsLogger | D.SilentLogger = D.SilentLogger()
        self.wandb: WandbLogger | None = None  # run.wandb: the logger mirrors rows to it
        if self.is_main:
            config = self._config_record()
            self.wandb = for_run(self.cfg.run, self.run_dir, config, resume=self.resume)
            self.logger = MetricsLogger(
                self.run_dir,
                tensorboard=self.cfg.run.tensorboard,
                resume_step=self.step if self.resume else None,
                total_steps=self.cfg.trainer.steps,
                tracker=self.wandb,
            )
        self.monitors = Monitors.for_run(  # reward-hacking monitors; a resume replays their history
            self.cfg.monitors, self.env.rubric, self.run_dir, main=self.is_main,
            resume=self.resume, state=self._monitor_state,
        )  # fmt: skip

    def _warn(self, message: str) -> None:
        if self.is_main:
            console.print(f"[yellow]warning:[/yellow] {message}", highlight=False, soft_wrap=True)

    def _config_record(self) -> dict[str, Any]:
        return {
            "config": self.cfg.model_dump(),
            "algorithm": dataclasses.asdict(self.algo),
            "model": self.cfg.model.name,
        }

    def _restore(self) -> bool:
        """Load the newest intact checkpoint; False when the run has none (it starts at step 0)."""
        from rich.markup import escape

        from looprl.trainer.checkpoint.sharded import resume_any
        from looprl.trainer.checkpoint.single import NoIntactCheckpoint

        try:  # the newest intact checkpoint; damaged newer ones are named and set aside
            resumed = resume_any(  # under torchrun: every rank its shards (sharded checkpoint)
                self.dist, self.run_dir, modules=self._modules(),
                optimizer=self.optimizer, scheduler=self.scheduler,
                warn=lambda msg: console.print(f"[yellow]warning:[/yellow] {escape(msg)}"),
            )  # fmt: skip
        except NoIntactCheckpoint as exc:
            raise SystemExit(f"error: {exc}") from None  # a message for the user, no traceback
        if resumed is None:
            console.print(f"[yellow]no checkpoint in {self.run_dir}; starting from step 0[/yellow]")
            return False
        state = resumed.state
        self.step, self.cursor = int(state["step"]), int(state["cursor"])
        self._monitor_state = state.get("monitors", {})
        self._stream_state = state.get("stream")  # streaming: the groups the checkpoint kept
        self.tasks.load_state(state.get("curriculum"))
        self._sync(self.step)  # the engine samples from the restored weights, as that version
        console.print(f"resumed from {resumed.path} (step {self.step})")
        return True

    # ---------------------------------------------------------------- the loop
    def run(self) -> dict[str, float]:
        """Train to `trainer.steps` (or early stop); returns the last step's metrics.

        However it ends, `RUN/summary.json` says how (`looprl.trainer.run_summary`).
        """
        start, error = time.monotonic(), None
        status: RunStatus = "failed"
        try:
            self._setup()
            if self.is_main:
                from looprl.trainer.logger import config_summary  # the full config: config.json

                summary = config_summary(
                    self.cfg, algorithm=self.algo.name, env=self.env.name,
                    run_dir=self.run_dir, device=str(self.device),
                )  # fmt: skip
                console.print(summary, highlight=False, soft_wrap=True)
            last = asyncio.run(self._loop())
            D.close_distributed(self.dist)
            status = "stopped early" if self.stopped_early else "finished"
            return last
        except BaseException as exc:  # an error or Ctrl-C: stop what the run started (vLLM servers)
            status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
            error = f"{type(exc).__name__}: {exc}"
            note = D.explain_failure(self.dist, exc, self.cfg.trainer.collective_timeout_s)
            if note:
                from rich.markup import escape

                console.print(f"[bold red]error:[/bold red] {escape(note)}", highlight=False)
            for close in self._closers:
                asyncio.run(close())
            raise
        finally:
            self.env.close()  # MCP servers and the like stop with the run
            if hasattr(self, "logger"):
                self.logger.close()
            self._write_summary(status, error, time.monotonic() - start)
            if self._lock is not None:
                self._lock.release()

    def _write_summary(self, status: RunStatus, error: str | None, seconds: float) -> None:
        """`RUN/summary.json` (rank 0, once it holds the run directory); a phase status is cleared."""
        self.phases.end()
        if self._lock is not None:
            write_run_summary(
                self.run_dir, status=status, steps=self.cfg.trainer.steps, seconds=seconds,
                error=error,
            )  # fmt: skip

    async def _loop(self) -> dict[str, float]:
        """Each step: its batch (generated ahead, or streaming groups), update, sync, log."""
        cfg = self.cfg.trainer
        last: dict[str, float] = {}
        source = self.source = self._source()
        phases = self.phases = StepPhases(cfg.steps, out=console if self.is_main else None)
        no_gradient = NoGradientWarning(self.cfg.rollout.rollouts_per_task, self._warn)
        nonfinite = NonFiniteGuard(cfg.max_nonfinite_steps, self.algo.updates_per_batch)
        errored = ErroredBatches(cfg.max_skipped_steps, self.run_dir, self._warn)
        if cfg.eval_before and self.step == 0:
            first = await self._evaluate(0)  # the starting point of every eval curve
            self.monitors.observe(0, first)  # and of the held-out monitor
            self.logger.log(0, first)
        while self.step < cfg.steps:
            step = self.step + 1
            phases.begin(step)
            phases.enter("generating")
            batch = await source.take(step)
            phases.enter("training")
            metrics = await source.train(self._update, batch.groups)
            phases.enter("syncing weights")
            metrics.update(self._sync(step))
            source.synced()
            metrics.update(
                batch.metrics(step), **self._rollout_metrics(batch.groups, batch.seconds)
            )
            metrics.update(self.tasks.metrics(step))
            self.step = step
            if cfg.eval_every and step % cfg.eval_every == 0 or step == cfg.steps:
                phases.enter("evaluating")
                metrics.update(await self._evaluate(step))
            metrics.update(self.monitors.observe(step, metrics, batch.groups))
            metrics.update(errored.observe(step, metrics, batch.groups))
            phases.end()
            self.logger.log(step, metrics)
            no_gradient.check(step, metrics)
            nonfinite.observe(step, metrics)
            self._save_rollouts(step, batch.groups)
            errored.stop_if_stuck(step)
            last = metrics
            if step % cfg.save_every == 0 or step == cfg.steps:
                self._checkpoint()
                self._plot()
            if self._early_stop(metrics):  # rank 0's verdict, so every rank leaves the loop
                if self.is_main:
                    console.print(
                        f"early stop: {cfg.early_stop_metric} reached "
                        f"{metrics[cfg.early_stop_metric or '']:.3f}"
                    )
                if step % cfg.save_every:
                    self._checkpoint()
                self.stopped_early = True
                break
        await source.close()
        errored.check_trained()  # a run that never updated exports nothing
        no_gradient.finish()  # a line when most steps had most groups scored alike
        self._export()
        self._plot()
        await self.engine.close()
        return last

    def _source(self) -> AheadSource | StreamSource:
        """Where the loop's batches come from: streaming groups, or `Ahead` batches (k >= 0)."""
        if not self.cfg.trainer.streaming:
            ahead = Ahead(self._collect_chained, self.step + 1)
            return AheadSource(ahead, self.cfg.trainer, release=self.placement.release_idle_memory)
        opened = open_stream if self.dist is None else partial(open_shared_stream, self.dist)
        return opened(
            cfg=self.cfg, env=self.env, engine=self.engine, renderer=self.renderer,
            sampling=self.sampling, task_at=lambda p: self.tasks.draw(p, 1)[0],
            dynamic=self.algo.dynamic_sampling, cursor=self.cursor, saved=self._stream_state,
            step=self.step, run_dir=self.run_dir if self.is_main else None,
            in_flight=self.placement.in_flight_updates,
        )  # fmt: skip

    async def _collect_chained(self, step: int, after: asyncio.Task[Batch] | None) -> Batch:
        """Step `step`'s batch, from the task cursor the previous batch left (awaited first)."""
        if after is not None:
            await asyncio.wait({after})
        version = self.engine.policy_version
        groups, seconds, used = await self.collector.collect(step, self.cursor)
        self.cursor += used
        for ep in (ep for g in groups for ep in g):
            ep.policy_version = version
        return Batch(groups, seconds, version, self.cfg.trainer.max_async_steps)

    def _update(self, groups: list[list[EpisodeResult]]) -> dict[str, float]:
        """Advantages and the optimizer update for one batch; returns training metrics. The
        weights it updates are policy version `self.step`, which `StalenessBound` measures from."""
        t0 = time.perf_counter()
        max_len = self.sampling.max_tokens * self.env.limits.max_turns
        bound = StalenessBound(self.step, self.cfg.trainer.staleness_bound)
        samples, adv_stats = samples_from_groups(groups, self.algo, max_len, bound)
        stats = train_on_batch(self.ctx, samples, trained_version=self.step)
        return update_metrics({**adv_stats, **stats}, time.perf_counter() - t0)

    def _sync(self, version: int) -> dict[str, float]:
        """The engine samples the new weights from now on, as `version` (the placement's way)."""
        return self.placement.sync(self.model, version)

    def _rollout_metrics(self, groups: list[list[EpisodeResult]], gen_s: float) -> dict[str, float]:
        episodes = [ep for g in groups for ep in g]
        summary = summarize(
            episodes, rollouts_per_task=self.cfg.rollout.rollouts_per_task, generate_seconds=gen_s
        )
        out = batch_metrics(summary, len(episodes))
        out["time/score"] = sum(ep.timings.get("score", 0.0) for ep in episodes)
        return out

    async def _evaluate(self, step: int) -> dict[str, float]:
        """Held-out evaluation through the one evaluation path; saved under eval/step_XXXXXX/.

        Under torchrun rank 0 evaluates with its engine while the others wait for it.
        """
        if not self.is_main:
            D.wait_for_main(self.dist)
            return {}
        cfg = self.cfg.trainer
        sampling = SamplingParams(
            **{**self.sampling.to_dict(), "temperature": cfg.eval_temperature}
        )
        job = EvalJob(
            env=self.env, engine=self.engine, tasks=self.eval_tasks,
            rollouts_per_task=cfg.eval_rollouts, renderer=self.renderer,
            config=RolloutConfig(sampling=sampling, seed=step_seed(cfg.seed, 0, "eval")),
            output=self.run_dir / "eval" / f"step_{step:06d}",
            metadata={"kind": "eval", "step": step, "model": self.cfg.model.name,
                      "sampling": sampling.to_dict()},
        )  # fmt: skip
        outcome = await run_eval(job)
        D.wait_for_main(self.dist)
        return {**eval_metrics(outcome.summary), "time/eval": outcome.seconds}

    def _save_rollouts(self, step: int, groups: list[list[EpisodeResult]]) -> None:
        from looprl.trainer.logger import save_rollouts

        n = self.cfg.trainer.save_rollouts
        episodes = [ep for g in groups for ep in g]
        if n and self.is_main:
            save_rollouts(self.run_dir, step, episodes[:n])
        if self.wandb is not None:
            self.wandb.log_rollouts(step, episodes)

    def _checkpoint(self) -> None:
        from looprl.trainer.checkpoint.sharded import save_sharded
        from looprl.trainer.checkpoint.single import save_checkpoint

        NonFiniteGuard.check_weights(self._modules().values(), self.dist, "the checkpoint")
        extra = {"step": self.step, "cursor": self.cursor, "monitors": self.monitors.state()}
        extra.update(self.source.state())  # streaming: its cursor and its unfinished groups
        extra["curriculum"] = self.tasks.state()
        if self.dist is not None:  # each rank writes its shards (torch.distributed.checkpoint)
            save_sharded(
                self.dist, self.run_dir, self.step, modules=self._modules(), optimizer=self.optimizer,
                scheduler=self.scheduler, extra_state=extra,
                keep_last=self.cfg.trainer.keep_last,
            )  # fmt: skip
            return
        save_checkpoint(
            self.run_dir, self.step, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
            extra_state=extra, value_head=self.value_head,
            keep_last=self.cfg.trainer.keep_last, adapter_only=self.cfg.model.lora,
        )  # fmt: skip

    def _modules(self) -> dict[str, Any]:
        """What a checkpoint holds besides the optimizer: policy, reference model, value head."""
        return {"policy": self.model, "reference": self.ref_model, "value_head": self.value_head}

    def _early_stop(self, metrics: dict[str, float]) -> bool:
        cfg = self.cfg.trainer
        if cfg.early_stop_metric is None or cfg.early_stop_value is None:
            return False
        value = metrics.get(cfg.early_stop_metric)
        return D.from_main(self.dist, value is not None and value >= cfg.early_stop_value)

    def _plot(self) -> None:
        from looprl.trainer.plots import plot_run

        if self.is_main:
            path = plot_run(self.run_dir)
            if self.wandb is not None:
                self.wandb.log_plot(self.step, path)

    def _export(self) -> None:
        from looprl.trainer.checkpoint.single import export_hf

        NonFiniteGuard.check_weights(self._modules().values(), self.dist, "final/")
        model = self.placement.final_model(self.model)  # under FSDP a full copy: every rank
        if self.is_main:
            export_hf(model, self.tokenizer, self.run_dir / "final")
            console.print(f"final model: {self.run_dir / 'final'}")
        D.wait_for_main(self.dist)
