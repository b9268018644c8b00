"""`looprl eval`: flags typed by `EvalConfig`, every mistake found before a directory is made.

Order of checks, cheapest first and all before any work: the flags (pydantic: sampling settings,
counts), the API key variable, the environment and its `--env.KEY` arguments, then the policy
(`--policy MODULE:FN` imports), the server (`--base-url`: one `GET /models` that finds a dead
server, a refused key and a model the server does not serve) or the model name, then the output
directory. Only then does the evaluation start and write anything.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from looprl.cli.fields import (
    UsageError,
    add_model_flags,
    config_from_args,
    did_you_mean,
    nearest,
    usage_error,
)
from looprl.envs.base import Environment
from looprl.eval.run import EvalConfig

SHORT = {"num_tasks": "-n", "rollouts": "-r", "model": "-m", "base_url": "-b"}

EPILOG = """\
environment and engine options:
  --env.KEY VALUE     an argument of the environment's load_environment (e.g. --env.max_turns 3);
                      a value is read as JSON when it parses, else as a string
  --engine.KEY VALUE  where rollouts are sampled (looprl config show lists the [engine] fields)

examples:
  looprl eval calculator -m tiny -n 20 -r 4
  looprl eval calculator -b http://localhost:8000/v1 -m MODEL --api-key-var OPENAI_API_KEY
  looprl eval calculator --policy looprl.sft.teachers:calculator --save-sft runs/warm/calc.jsonl
"""


def register(sub: Any) -> None:
    """Add `looprl eval` to the command line."""
    p = sub.add_parser(
        "eval",
        help="evaluate a model, a server or a scripted policy on an environment",
        description="Evaluate on an environment's tasks: pass@k, reward, errors; results.jsonl "
        "and metadata.json in --output.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("env", help=EvalConfig.model_fields["env"].description)
    add_model_flags(p, EvalConfig, skip=("env", "env_kwargs"), short=SHORT)
    p.set_defaults(func=run_eval_command)


def parse_overrides(items: list[str], *prefixes: str) -> dict[str, dict[str, Any]]:
    """Turn `--prefix.key value` pairs into one dict per prefix (values parsed as JSON when possible)."""
    from looprl.trainer.config import ConfigError, parse_cli_overrides

    try:
        parsed = parse_cli_overrides(items)
    except ConfigError as exc:
        raise usage_error(str(exc), "write --section.field VALUE") from None
    out: dict[str, dict[str, Any]] = {prefix: {} for prefix in prefixes}
    for key, value in parsed.items():
        prefix, _, rest = key.partition(".")
        if prefix not in out:
            shapes = " or ".join(f"--{p}.KEY VALUE" for p in prefixes)
            close = nearest(prefix, list(prefixes))
            fix = f"did you mean --{close}.{rest}?" if close else f"options look like {shapes}"
            raise UsageError(f"unrecognized argument --{key}", fix)
        out[prefix][rest] = value
    return out


def run_eval_command(args: argparse.Namespace, dotted: list[str]) -> int:
    """`looprl eval`: check everything, run, print the summary; 1 if the evaluation failed."""
    from looprl.eval.run import UNSCORED, evaluate_and_report, first_error

    overrides = parse_overrides(dotted, "env", "engine")
    values = {k: v for k, v in vars(args).items() if k in EvalConfig.model_fields}
    values.update(env_kwargs=overrides["env"], engine=overrides["engine"])
    cfg: EvalConfig = config_from_args(EvalConfig, values, names={"env": "ENV"})
    env = check_eval(cfg)
    output = output_dir(cfg)
    cfg = cfg.model_copy(update={"output": output})
    try:
        outcome = evaluate_and_report(cfg, env)
    except KeyboardInterrupt:
        from looprl.cli.interrupts import eval_interrupted

        raise eval_interrupted(args.argv, output) from None
    if outcome.status != "failed":
        return 0
    if outcome.headline.startswith(UNSCORED):
        print(
            f"error: {outcome.headline} — fix the reward function, then rerun into a new "
            "--output (--resume does not score finished groups again)",
            file=sys.stderr,
        )
        return 1
    errored = outcome.summary["rollout_errors"]
    print(
        f"error: evaluation failed: {errored} of {outcome.summary['episodes']} episodes errored; "
        f"first: {first_error(outcome.episodes)} — fix the cause and rerun with --resume "
        "(finished groups are kept)",
        file=sys.stderr,
    )
    return 1


def check_eval(cfg: EvalConfig) -> Environment:
    """Every check that needs no evaluation (see the module doc); the loaded environment."""
    from looprl.eval.run import load_policy

    if cfg.api_key_var and cfg.api_key_var not in os.environ:
        raise UsageError(
            f"--api-key-var {cfg.api_key_var}: no such environment variable is set",
            f"export {cfg.api_key_var}=YOUR_KEY first, or name the variable that holds the key",
        )
    if cfg.policy and cfg.base_url:
        raise UsageError("--policy and --base-url both given", "a scripted policy needs no server")
    env = load_env(cfg.env, cfg.env_kwargs)
    if cfg.policy:
        try:
            load_policy(cfg.policy)
        except ValueError as exc:
            raise usage_error(str(exc), "pass --policy MODULE:FN") from None
    elif cfg.base_url:
        served = preflight(cfg.base_url, cfg.api_key_value())
        check_served_model(cfg.base_url, served, cfg.model)
    else:
        check_model(cfg.model, "--model")
    return env


def check_model(name: str, flag: str) -> None:
    """A model name that resolves to nothing is a UsageError naming `flag` (the model is not loaded)."""
    from looprl.models.loading import resolve_model_path

    try:
        resolve_model_path(name)
    except ValueError as exc:
        what, _, fix = str(exc).partition(": use ")
        raise UsageError(f"{flag} {name}: {what}", f"use {fix}" if fix else str(exc)) from None


def load_env(name: str, kwargs: dict[str, Any]) -> Environment:
    """`load_environment(name, **kwargs)`; a bad name or argument is a UsageError with the fix.

    Arguments that `load_environment` declares are checked against their annotations first
    (`--env.max_turns abc` is refused before the environment runs); an unexpected name gets the
    nearest declared one.
    """
    from looprl.envs.registry import load_environment

    params = env_parameters(name)
    for key, value in kwargs.items():
        _check_env_value(key, value, params.get(key))
    try:
        return load_environment(name, **kwargs)
    except ValueError as exc:
        found = re.search(r"unexpected keyword argument '(\w+)'", str(exc))
        if found:
            flags = [f"--env.{p}" for p in params]
            hint = did_you_mean(f"--env.{found[1]}", flags)
            raise UsageError(
                f"environment {name} takes no argument --env.{found[1]}",
                hint or f"its declared arguments are {', '.join(flags) or 'none'}",
            ) from None
        raise usage_error(str(exc), "see looprl env list") from None


def _check_env_value(key: str, value: Any, param: inspect.Parameter | None) -> None:
    """Refuse a value that does not fit a plain annotation (int, float, bool, str) of `key`."""
    from pydantic import TypeAdapter, ValidationError

    if param is None or param.annotation not in (int, float, bool, str):
        return
    try:
        TypeAdapter(param.annotation).validate_python(value, strict=param.annotation is not float)
    except ValidationError:
        kind = param.annotation.__name__
        raise UsageError(
            f"--env.{key} {value}: expected {kind}",
            f"pass --env.{key} as {kind} (default {param.default!r})",
        ) from None


def env_parameters(name: str) -> dict[str, inspect.Parameter]:
    """The declared keyword parameters of a bundled, installed or importable environment's
    `load_environment` (annotations resolved); empty when it cannot be inspected."""
    from looprl.envs.registry import find_registered

    if name.endswith(".py"):
        return {}
    try:
        row = find_registered(name)
        module, _, function = (row.target if row else name).partition(":")
        factory = getattr(importlib.import_module(module), function or "load_environment")
        sig = inspect.signature(factory, eval_str=True)
    except Exception:  # a module that fails to import: load_environment then names the problem
        return {}
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {k: p for k, p in sig.parameters.items() if p.kind in kinds}


def preflight(base_url: str, api_key: str | None) -> list[str] | None:
    """One `GET {base_url}/models` before any episode; the ids of the models the server lists.

    A dead server or a refused key (401, 403) is a UsageError. None when the server has no
    usable model list (some servers lack the route): the model is then not checked.
    """
    import httpx

    url = base_url.rstrip("/") + "/models"
    key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
    try:
        reply = httpx.get(url, headers={"Authorization": f"Bearer {key}"}, timeout=10.0)
    except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
        raise UsageError(
            f"--base-url {base_url} is not a usable URL ({exc})",
            "write it as http://HOST:PORT/v1",
        ) from None
    except httpx.TransportError as exc:
        raise UsageError(
            f"no server answers at {base_url} (GET {url}: {type(exc).__name__}: {exc})",
            "start the OpenAI-compatible server (e.g. vllm serve MODEL --port 8000) or fix "
            "--base-url (it ends in /v1)",
        ) from None
    if reply.status_code in (401, 403):
        sent = _key_source(api_key)
        raise UsageError(
            f"the server at {base_url} refused the API key (HTTP {reply.status_code}; sent {sent})",
            "export the key and pass --api-key-var NAME (the environment variable holding it; "
            "OPENAI_API_KEY is read when the flag is not given)",
        )
    return served_models(reply) if reply.status_code == 200 else None


def _key_source(api_key: str | None) -> str:
    """Where the key sent came from, for the refusal's message (never the key itself)."""
    if api_key:
        return "the key from --api-key-var or --api-key"
    if os.environ.get("OPENAI_API_KEY"):
        return "$OPENAI_API_KEY"
    return "no key"


def served_models(reply: Any) -> list[str] | None:
    """The model ids of a `/models` reply (`{"data": [{"id": ...}, ...]}`); None if it has none."""
    try:
        data = reply.json().get("data")
    except (ValueError, AttributeError):
        return None
    if not isinstance(data, list):
        return None
    ids = [str(m["id"]) for m in data if isinstance(m, dict) and m.get("id") is not None]
    return ids or None


def check_served_model(base_url: str, served: list[str] | None, model: str) -> None:
    """A `--model` the server does not list is a UsageError naming what it serves."""
    if served is None or model in served:
        return
    shown = ", ".join(served[:8]) + (f" and {len(served) - 8} more" if len(served) > 8 else "")
    choice = nearest(model, served) or served[0]
    raise UsageError(f"the server at {base_url} serves {shown}, not {model}", f"pass -m {choice}")


def output_dir(cfg: EvalConfig) -> Path:
    """`--output`, or a fresh `runs/eval-ENV-MODEL-TIME` (the latest such one with --resume)."""
    name = (cfg.policy or cfg.model).replace(":", "-")
    model = Path(name).name.replace("/", "_")
    env = Path(cfg.env).stem
    if cfg.output is not None:
        out = cfg.output
    elif cfg.resume:
        candidates = sorted(Path("runs").glob(f"eval-{env}-{model}-*"))
        if not candidates:
            raise UsageError(
                f"--resume found no runs/eval-{env}-{model}-* directory", "pass --output DIR"
            )
        out = candidates[-1]
    else:
        out = Path("runs") / f"eval-{env}-{model}-{time.strftime('%Y%m%d-%H%M%S')}"
    if out.exists() and any(out.iterdir()) and not cfg.resume:
        raise UsageError(
            f"{out} already holds results",
            "pass --resume to continue it or choose another --output",
        )
    return out
