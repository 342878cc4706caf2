"""The service's state: the live compiled model, readiness, prediction and the verified swap."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from stejax.serve._batcher import MicroBatcher, Overloaded
from stejax.serve._config import ServeConfig
from stejax.serve._inputs import RequestError, parse_body
from stejax.serve._metrics import Metrics
from stejax.serve._model import CompiledModel, Prediction, ServedModel, compile_model
from stejax.serve._sources import ModelSource, Refused

__all__ = ["Busy", "Service", "SwapResult"]

logger = logging.getLogger("stejax.serve")

# Bodies above this are parsed in a worker thread so that the event loop keeps answering.
_PARSE_INLINE_BYTES = 64 * 1024
# Previous verified models kept compiled for rollback (artifact mode).
_HISTORY = 3


class Busy(Exception):
    """A reload or rollback is already running."""


@dataclasses.dataclass(frozen=True)
class SwapResult:
    """The outcome of a reload or rollback.

    Attributes:
      swapped: whether the live model changed.
      version: the live version afterwards.
      previous: the version live before.
      failures: why a candidate was refused (empty when swapped).
    """

    swapped: bool
    version: str | None
    previous: str | None
    failures: tuple[str, ...] = ()


class Service:
    """One model source served under one :class:`ServeConfig`.

    The live model is one reference, replaced in a single assignment: a request
    reads it once on arrival and runs on that model to the end, so a swap never
    changes a request in flight. :meth:`start` verifies and compiles the first
    model in the background; :attr:`ready` turns true when every bucket is
    compiled and the model passed its gate.
    """

    def __init__(self, source: ModelSource, config: ServeConfig, *, metrics: Metrics | None = None) -> None:
        self.source = source
        self.config = config
        self.metrics = metrics if metrics is not None else Metrics()
        self.live: CompiledModel | None = None
        self.history: list[CompiledModel] = []
        self.failure: str | None = None  # why start-up failed, if it did
        self.last_swap: SwapResult | None = None
        self._batcher: MicroBatcher | None = None
        self._device: ThreadPoolExecutor | None = None
        self._admin: ThreadPoolExecutor | None = None
        self._swapping = False
        self._tasks: set[asyncio.Task] = set()

    @property
    def ready(self) -> bool:
        return self.live is not None

    @property
    def state(self) -> str:
        """``"ready"``, ``"starting"`` or ``"failed"``."""
        return "ready" if self.ready else ("failed" if self.failure else "starting")

    # ------------------------------------------------------------------ life cycle

    async def start(self) -> None:
        """Start the workers and, in the background, verify and compile the first model."""
        cores = os.cpu_count() or 1
        workers = 1 if self.config.micro_batching else min(4, cores)
        self._device = ThreadPoolExecutor(workers, thread_name_prefix="stejax-device")
        self._admin = ThreadPoolExecutor(1, thread_name_prefix="stejax-admin")
        if self.config.micro_batching:
            max_queued_rows = self.config.max_queued_rows
            if max_queued_rows is None:  # ServeConfig.__post_init__ replaces None with the default bound
                raise ValueError("Service: expected ServeConfig.max_queued_rows resolved to an int; got None.")
            self._batcher = MicroBatcher(
                max_rows=self.config.max_bucket,
                wait_s=self.config.batch_wait_ms / 1000,
                max_queued_rows=max_queued_rows,
                executor=self._device,
                on_batch=self._on_batch,
            )
            self._batcher.start()
        self._spawn(self._start_model())

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._batcher is not None:
            await self._batcher.stop()
        for pool in (self._device, self._admin):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)

    def _spawn(self, coroutine) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _start_model(self) -> None:
        logger.info("stejax serve: verifying and compiling %s", self.source.description)
        try:
            compiled = await self._off_loop(self._verified_compiled, self.source.first)
        except Refused as error:
            self.failure = str(error)
            logger.error("stejax serve: not ready: %s", error)
            return
        except Exception as error:
            self.failure = f"{type(error).__name__}: {error}"
            logger.exception("stejax serve: not ready")
            return
        self._make_live(compiled)
        logger.info("stejax serve: ready: %s, buckets %s", compiled.version, list(self.config.buckets))

    async def _off_loop(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._admin, fn, *args)

    def _verified_compiled(self, get_model, *args) -> CompiledModel:
        model: ServedModel = get_model(*args)
        return compile_model(model, self.config.buckets)

    def _make_live(self, compiled: CompiledModel) -> None:
        self.live = compiled  # one assignment: requests already holding the old model keep it
        self.metrics.set_version(compiled.version)

    def _on_batch(self, rows: int, bucket: int) -> None:
        self.metrics.batch_fill.observe(rows / bucket)

    # ------------------------------------------------------------------ prediction

    async def predict(
        self, read_body: Callable[[], Awaitable[bytes]], content_type: str | None
    ) -> tuple[CompiledModel, Prediction]:
        """Read, parse, check and run one request on the live model.

        ``read_body`` is awaited for the body; while it and the parsing run,
        the micro-batcher knows a request is on its way (see
        :meth:`MicroBatcher.arriving`).

        Raises:
          RequestError: 503 before the model is ready or when the queue is full;
            413 and 415 and 422 for the body (see :func:`parse_body`); 422 when
            the model's outputs are not finite.
        """
        model = self.live
        if model is None:
            raise RequestError(503, f"not ready: {self.state}; see /readyz.", invalid_input=False)
        batcher = self._batcher
        announced = batcher is not None
        if batcher is not None:
            batcher.arriving()
        try:
            body = await read_body()
            spec = model.model
            args = (body, content_type, spec.input_shape, spec.input_dtype)
            if len(body) > _PARSE_INLINE_BYTES:
                x = await asyncio.to_thread(parse_body, *args, max_rows=self.config.max_rows)
            else:
                x = parse_body(*args, max_rows=self.config.max_rows)
            chunks = np.split(x, np.cumsum(self.config.chunks(len(x)))[:-1])
            try:
                if batcher is not None:
                    futures = batcher.submit(model, chunks)
                    announced = False
                    batcher.arrived()
                    parts = await asyncio.gather(*futures)
                else:
                    loop = asyncio.get_running_loop()
                    parts = await asyncio.gather(*(self._run_direct(loop, model, c) for c in chunks))
            except Overloaded as error:
                raise RequestError(503, f"overloaded: {error} Retry shortly.", invalid_input=False) from None
        finally:
            if announced and batcher is not None:
                batcher.arrived()
        if len(parts) == 1:
            prediction = parts[0]
        else:
            prediction = Prediction(
                np.concatenate([p.logits for p in parts]),
                np.concatenate([p.probabilities for p in parts]),
                np.concatenate([p.classes for p in parts]),
                bucket=max(p.bucket for p in parts),
            )
        finite = np.isfinite(prediction.logits).all(axis=1) & np.isfinite(prediction.probabilities).all(axis=1)
        if not finite.all():
            bad = np.flatnonzero(~finite)
            self.metrics.nonfinite_outputs.inc(len(bad))
            raise RequestError(
                422,
                f"outputs: the model's logits are not finite for {len(bad)} row(s), the first row {int(bad[0])}; "
                "expected inputs within the range the model was trained on.",
                invalid_input=False,
            )
        return model, prediction

    async def _run_direct(self, loop, model: CompiledModel, x: np.ndarray) -> Prediction:
        prediction = await loop.run_in_executor(self._device, model.predict, x)
        self._on_batch(len(x), prediction.bucket)
        return prediction

    # ------------------------------------------------------------------ swap and rollback

    async def reload(self, path: str | os.PathLike) -> SwapResult:
        """Verify ``path`` off the event loop and make it live only if it passes.

        Traffic goes on meanwhile on the live model. Runs to the end even if
        the caller goes away.

        Raises:
          Busy: another reload or rollback is running.
        """
        target = Path(path)
        return await self._exclusive(lambda old: self._reload(old, target))

    async def rollback(self) -> SwapResult:
        """Make the previous verified model live again (see the source's ``rollback``).

        Raises:
          Busy: another reload or rollback is running.
        """
        return await self._exclusive(self._rollback)

    async def _exclusive(self, swap: Callable[[CompiledModel], Coroutine[Any, Any, SwapResult]]) -> SwapResult:
        """Run ``swap(live model)`` unless a swap is running or no model is live yet."""
        old = self.live
        if self._swapping or old is None:
            raise Busy("a reload or rollback is running" if old is not None else f"not ready: {self.state}")
        self._swapping = True  # set before the first await: a second caller sees it at once
        coroutine = swap(old)

        async def run() -> SwapResult:
            try:
                return await coroutine
            finally:
                self._swapping = False

        # Shielded: a client that disconnects does not cancel a verification half-way.
        return await asyncio.shield(self._spawn(run()))

    async def _reload(self, old: CompiledModel, path: Path) -> SwapResult:
        logger.info("stejax serve: reload: verifying %s", path)
        try:
            compiled = await self._off_loop(self._verified_compiled, self.source.candidate, path)
        except Refused as error:
            return self._refused(error.outcome, old, error.failures)
        except Exception as error:
            logger.exception("stejax serve: reload: %s failed", path)
            return self._refused("refused", old, [f"{type(error).__name__}: {error}"])
        self.history = [*self.history, old][-_HISTORY:]
        self._make_live(compiled)
        return self._swapped("swapped", old, compiled)

    async def _rollback(self, old: CompiledModel) -> SwapResult:
        history = [c.model for c in self.history]
        try:
            model = await self._off_loop(self.source.rollback, old.model, history)
        except Refused as error:
            return self._refused("rollback_refused", old, error.failures)
        except Exception as error:
            logger.exception("stejax serve: rollback failed")
            return self._refused("rollback_refused", old, [f"{type(error).__name__}: {error}"])
        kept = [c for c in self.history if c.model is model or c.version == model.version]
        compiled = kept[-1] if kept else await self._off_loop(compile_model, model, self.config.buckets)
        self.history = [c for c in self.history if c is not compiled]
        self._make_live(compiled)
        return self._swapped("rolled_back", old, compiled)

    def _refused(self, outcome: str, old: CompiledModel, failures: list[str]) -> SwapResult:
        self.metrics.reloads.labels(outcome=outcome).inc()
        result = SwapResult(False, old.version, old.version, tuple(failures))
        self.last_swap = result
        logger.warning("stejax serve: %s: %s", outcome.replace("_", " "), "; ".join(failures))
        return result

    def _swapped(self, outcome: str, old: CompiledModel, new: CompiledModel) -> SwapResult:
        self.metrics.reloads.labels(outcome=outcome).inc()
        result = SwapResult(True, new.version, old.version)
        self.last_swap = result
        logger.info("stejax serve: %s: %s -> %s", outcome.replace("_", " "), old.version, new.version)
        return result

    def describe(self) -> dict[str, Any]:
        """The live model's contract and the service's bounds, for ``GET /v1/model``."""
        live = self.live
        info: dict[str, Any] = {
            "state": self.state,
            "buckets": list(self.config.buckets),
            "max_rows": self.config.max_rows,
            "max_body_bytes": self.config.max_body_bytes,
            "oversize": self.config.oversize,
        }
        if live is not None:
            info.update(
                model_version=live.version,
                input_shape=list(live.model.input_shape),
                input_dtype=live.model.input_dtype.name,
                n_classes=live.model.n_classes,
            )
        return info
