"""Train against vLLM servers: token-level rollouts, weight sync after each step, several servers.

`VLLMEngine` is a `TrainableEngine`. It samples through vLLM's `/inference/v1/generate` with
prompt token ids in and sampled ids, logprobs and each token's weight version out
(`looprl.engines.vllm_client`), so the rollout's token-exact invariants hold as with
`TorchEngine`. It either starts its own servers
(`num_servers` of them, on the model directory it is given, stopped on every exit path) or uses
servers the user started (`base_urls`, never stopped by looprl).

- **Placement.** A request goes to the server its `affinity` (the task id) hashes to, so every
  turn of a group's episodes hits one server's prefix cache. A request whose server is dead
  goes to the next live one; a dead server that looprl started is restarted (and reloaded with
  the current weights) before the next step, and counted in `stats`.
- **LoRA.** With `lora_rank`, servers start with `--enable-lora` and `load_adapter(dir, version)`
  hot-loads each step's adapter as `policy-vN` (`/v1/load_lora_adapter`); requests name the
  adapter they were sampled with, and the previous one is unloaded.
- **In-flight updates** (`in_flight_updates = True`). `sync_weights` and `load_adapter` may run
  while requests are in flight, e.g. from a thread beside the event loop that samples. Each
  pauses every server with `mode=keep` (the engine step under way finishes, nothing runs until
  the resume), swaps the weights, labels them with the policy version, preempts the running
  requests (their keys and values are computed again by the new weights) and resumes: a request
  continues, its later tokens sampled by the new weights over its whole context, and
  `Generation.versions` splits at the exact token (vLLM stamps each step's output with the label).
  A running request cannot change adapter: an adapter sync aborts the requests in flight while
  paused and each client sends its request again, its tokens so far appended to the prompt.
- **Weight sync.** `sync_weights(state, version)` writes the weights as safetensors into a new
  directory under a RAM-backed folder (`/dev/shm` when it exists), atomically (write, then
  rename), and asks every server to reload from it (vLLM's `reload_weights`), then drops older
  weight directories. On GPUs vLLM's own weight-transfer API (NCCL) avoids the file: see
  docs/scaling.md.
- **RAM it leaves behind.** The weights folder and the model export (`owned_dirs`) are named
  after this process (`looprl.engines.ram_dirs`) and removed on close; if the process is killed
  first, the servers' shims remove them, and else the next trainer or vLLM engine to start does.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from looprl.console import console
from looprl.engines.base import GenerationRequest
from looprl.engines.ram_dirs import ram_dir
from looprl.engines.vllm_client import VLLMTokenClient
from looprl.engines.vllm_server import SERVED_NAME, VLLMServer, paused, post_admin, reload_weights
from looprl.types import Generation


class VLLMEngine:
    """Sample from vLLM servers and keep their weights in step with the trainer (module doc).

    `model_dir` is the Hugging Face directory the servers start from (needed unless `base_urls`
    are given); `tokenizer` decodes sampled ids for the parser; `max_concurrency` bounds the
    requests in flight per server; `owned_dirs` are removed when the engine closes (or fails to
    start).
    """

    token_level = True
    in_flight_updates = True  # sync_weights / load_adapter may run beside requests (module doc)

    def __init__(
        self,
        model_dir: str | Path | None,
        tokenizer: Any,
        *,
        base_urls: list[str] | None = None,
        num_servers: int = 1,
        max_concurrency: int = 64,
        max_model_len: int = 2048,
        seed: int = 0,
        startup_timeout: float = 300.0,
        served_name: str = SERVED_NAME,
        owned_dirs: list[Path] | None = None,
        lora_rank: int | None = None,
    ) -> None:
        if not base_urls and model_dir is None:
            raise ValueError("VLLMEngine needs model_dir (to start servers) or base_urls")
        self.tokenizer = tokenizer
        self.takes_adapters = lora_rank is not None
        self.served_name = served_name
        self.owned_dirs = list(owned_dirs or [])  # removed by close() (a model exported to RAM)
        self.policy_version = 0
        self._weights_root = ram_dir("weights")
        orphaned = (*self.owned_dirs, self._weights_root)  # the shims remove them if we die
        self.servers: list[VLLMServer] = []
        if base_urls:
            urls = list(base_urls)
        else:
            self.servers = [
                VLLMServer(model_dir or "", max_model_len=max_model_len, seed=seed + i,
                           startup_timeout=startup_timeout, extra_args=lora_args(lora_rank),
                           remove_if_orphaned=orphaned)
                for i in range(num_servers)
            ]  # fmt: skip
            urls = self._start_all()
        self.clients = [
            VLLMTokenClient(_root(url), served_name, tokenizer=tokenizer,
                            max_concurrency=max_concurrency, seed=seed)
            for url in urls
        ]  # fmt: skip
        self._current: Path | None = None
        self._current_adapter: Path | None = None
        self.stats = {"failovers": 0, "restarts": 0, "syncs": 0}

    def _start_all(self) -> list[str]:
        """Start the servers one after another (started together, one of two was unreachable
        in the tests) and return their URLs."""
        urls = []
        try:
            for server in self.servers:
                urls.append(server.start())
        except BaseException:
            self._stop_servers()
            self._remove_dirs()
            raise
        return urls

    async def generate(self, request: GenerationRequest) -> Generation:
        """Sample on the request's server; fail over to the next live one if it is down."""
        first = self._pick(request)
        gen = await self.clients[first].generate(request)
        # only servers looprl runs can be known dead; a live server's error is the request's own
        if gen.finish_reason != "error" or not self.servers or self.servers[first].alive():
            return gen
        for k in range(1, len(self.clients)):
            i = (first + k) % len(self.clients)
            if not self.servers[i].alive():
                continue
            self.stats["failovers"] += 1
            if self.stats["failovers"] == 1:
                console.print(
                    f"[yellow]warning:[/yellow] vLLM server {first} is down; its requests go to "
                    "the next live server until the next step restarts it",
                    highlight=False,
                )
            gen = await self.clients[i].generate(request)
            if gen.finish_reason != "error":
                return gen
        return gen

    def _pick(self, request: GenerationRequest) -> int:
        key = request.affinity or str(request.prompt_ids[:64] if request.prompt_ids else "")
        digest = hashlib.sha256(key.encode()).digest()
        return int.from_bytes(digest[:4], "little") % len(self.clients)

    def sync_weights(
        self, weights: Mapping[str, torch.Tensor] | None, *, version: int | None = None
    ) -> None:
        """Write `weights` to RAM and have every server reload them (None: nothing changed)."""
        self.policy_version = self.policy_version + 1 if version is None else version
        if weights is None:
            return
        self._restart_dead()
        final = self._weights_root / f"v{self.policy_version:06d}"
        tmp = self._weights_root / f".v{self.policy_version:06d}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        # a copy of each (tied embeddings share memory, which safetensors refuses)
        tensors = {k: v.detach().to("cpu", torch.float32).clone() for k, v in weights.items()}
        save_file(tensors, str(tmp / "model.safetensors"))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        with paused(self._roots(), version=self.policy_version):
            for client in self.clients:  # servers given by URL must see the folder (same disk)
                reload_weights(client.base_url, final)
        old, self._current = self._current, final
        if old is not None and old != final:
            shutil.rmtree(old, ignore_errors=True)
        self.stats["syncs"] += 1

    def load_adapter(self, adapter_dir: Path, *, version: int) -> None:
        """Hot-load a PEFT adapter on every server as `policy-vN`; requests name it from now on.

        A running request cannot change adapter, so while generation is paused each server
        aborts its requests: each returns its tokens so far and its client sends it again under
        the new adapter (`looprl.engines.vllm_client`). The previous adapter is unloaded after
        the resume (a request that named it keeps it until it ends).
        """
        self.policy_version = version
        self._restart_dead()
        name = f"{self.served_name}-v{version}"
        final = self._weights_root / name
        shutil.rmtree(final, ignore_errors=True)
        shutil.copytree(adapter_dir, final)
        previous = self.clients[0].model
        with paused(self._roots(), version=version):
            for client in self.clients:
                body = {"lora_name": name, "lora_path": str(final)}
                post_admin(f"{client.base_url}/v1/load_lora_adapter", body)
                client.model, client.adapter_version = name, version
                post_admin(f"{client.base_url}/abort_requests", {})
        if previous != self.served_name:
            for root in self._roots():
                post_admin(f"{root}/v1/unload_lora_adapter", {"lora_name": previous})
            shutil.rmtree(self._weights_root / previous, ignore_errors=True)
        self._current_adapter = final
        self.stats["syncs"] += 1

    def _roots(self) -> list[str]:
        """Each server's address without `/v1`, in client order."""
        return [client.base_url for client in self.clients]

    def _restart_dead(self) -> None:
        """Start dead servers that looprl runs again, with the current weights."""
        for i, server in enumerate(self.servers):
            if server.alive():
                continue
            console.print(
                f"[yellow]warning:[/yellow] vLLM server {i} ({server.base_url}) died; restarting "
                f"it (log: {server.log_path})",
                highlight=False,
            )
            url = server.restart()
            self.stats["restarts"] += 1
            self.clients[i].base_url = _root(url)
            if self._current is not None:
                server.reload_weights(self._current)
            if self._current_adapter is not None:
                body = {
                    "lora_name": self._current_adapter.name,
                    "lora_path": str(self._current_adapter),
                }
                post_admin(f"{_root(url)}/v1/load_lora_adapter", body)

    async def close(self) -> None:
        """Close connections and stop the servers looprl started."""
        for client in self.clients:
            await client.close()
        await asyncio.to_thread(self._stop_servers)
        self._remove_dirs()

    def _remove_dirs(self) -> None:
        """Remove the weights folder and the directories this engine owns (from RAM)."""
        for path in [self._weights_root, *self.owned_dirs]:
            shutil.rmtree(path, ignore_errors=True)

    def _stop_servers(self) -> None:
        for server in self.servers:
            server.stop()


def lora_args(rank: int | None) -> tuple[str, ...]:
    """vLLM flags for serving LoRA adapters of `rank` (none without one)."""
    if rank is None:
        return ()
    return ("--enable-lora", "--max-lora-rank", str(rank), "--max-loras", "2")


def _root(url: str) -> str:
    """A server's address without `/v1` (`http://HOST:PORT`)."""
    return url.rstrip("/").removesuffix("/v1")
