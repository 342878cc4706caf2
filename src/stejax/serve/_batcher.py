"""Micro-batching: concurrent small requests gathered into one bucket within a bounded wait."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Callable
from concurrent.futures import Executor

import numpy as np

from stejax.serve._model import CompiledModel, Prediction

__all__ = ["MicroBatcher", "Overloaded"]


class Overloaded(Exception):
    """More rows are waiting than the queue bound allows."""


@dataclasses.dataclass(eq=False)
class _Item:
    model: CompiledModel
    x: np.ndarray
    future: asyncio.Future
    arrival: float


class MicroBatcher:
    """Gathers rows for one model into the largest bucket, waiting at most ``wait_s`` after the first arrived.

    One consumer task takes the oldest waiting request, then adds the next ones
    while they belong to the same model and fit in the largest bucket. It waits
    for more only while requests are on their way in (announced with
    :meth:`arriving`: their bodies are being read or parsed), and never longer
    than ``wait_s`` after the oldest one arrived; requests that queued while
    the device was busy have waited already and go at once. So a lone request
    pays no wait, and concurrent ones share a bucket. The gathered rows run as
    one execution on ``executor``; each request gets its own rows back.
    Requests keep the model they were admitted with, so a batch never mixes
    models and a swap never touches one in flight.

    Args:
      max_rows: the most rows in one execution (the largest bucket).
      wait_s: the longest wait for company.
      max_queued_rows: the most rows waiting; :meth:`submit` raises
        :class:`Overloaded` beyond it.
      executor: where executions run (one worker: one execution at a time).
      on_batch: called with ``(rows, bucket)`` after each execution.
    """

    def __init__(
        self,
        *,
        max_rows: int,
        wait_s: float,
        max_queued_rows: int,
        executor: Executor,
        on_batch: Callable[[int, int], None],
    ) -> None:
        self._max_rows = max_rows
        self._wait_s = wait_s
        self._max_queued_rows = max_queued_rows
        self._executor = executor
        self._on_batch = on_batch
        self._pending: collections.deque[_Item] = collections.deque()
        self._queued_rows = 0
        self._arriving = 0
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None

    def arriving(self) -> None:
        """A request is on its way in: a batch being gathered may wait for it (within the bound)."""
        self._arriving += 1

    def arrived(self) -> None:
        """That request was queued by :meth:`submit`, or refused: nobody needs to wait for it any more."""
        self._arriving -= 1
        self._wakeup.set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="stejax-micro-batcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        for item in self._pending:
            if not item.future.done():
                item.future.cancel()
        self._pending.clear()
        self._queued_rows = 0

    def submit(self, model: CompiledModel, chunks: list[np.ndarray]) -> list[asyncio.Future]:
        """Queue ``chunks`` (each at most ``max_rows`` rows) for ``model``; one future of its results per chunk.

        Raises:
          Overloaded: the queue cannot take that many rows now (nothing is queued).
        """
        rows = sum(len(x) for x in chunks)
        if self._queued_rows + rows > self._max_queued_rows:
            raise Overloaded(f"{self._queued_rows} rows are waiting; the limit is {self._max_queued_rows}.")
        loop = asyncio.get_running_loop()
        now = loop.time()
        items = [_Item(model, x, loop.create_future(), now) for x in chunks]
        self._pending.extend(items)
        self._queued_rows += rows
        self._wakeup.set()
        return [item.future for item in items]

    def _gather(self) -> list[_Item]:
        """The oldest request and those after it that share its model and fit the largest bucket."""
        first = self._pending[0]
        batch, rows = [], 0
        for item in self._pending:
            if item.model is not first.model or rows + len(item.x) > self._max_rows:
                break
            batch.append(item)
            rows += len(item.x)
        return batch

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            deadline = self._pending[0].arrival + self._wait_s
            while True:
                batch = self._gather()
                full = sum(len(item.x) for item in batch) == self._max_rows or len(batch) < len(self._pending)
                remaining = deadline - loop.time()
                if full or remaining <= 0 or self._arriving <= 0:
                    break
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), remaining)
                except TimeoutError:
                    pass
            for _ in batch:
                self._pending.popleft()
            self._queued_rows -= sum(len(item.x) for item in batch)
            live = [item for item in batch if not item.future.done()]  # a client that left is not computed
            if not live:
                continue
            try:
                prediction = await loop.run_in_executor(self._executor, _execute, live)
            except Exception as error:  # the device failed: every request in the batch learns why
                for item in live:
                    if not item.future.done():
                        item.future.set_exception(error)
                continue
            self._on_batch(sum(len(item.x) for item in live), prediction.bucket)
            start = 0
            for item in live:
                stop = start + len(item.x)
                if not item.future.done():
                    item.future.set_result(
                        Prediction(
                            prediction.logits[start:stop],
                            prediction.probabilities[start:stop],
                            prediction.classes[start:stop],
                            prediction.bucket,
                        )
                    )
                start = stop


def _execute(batch: list[_Item]) -> Prediction:
    x = batch[0].x if len(batch) == 1 else np.concatenate([item.x for item in batch])
    return batch[0].model.predict(x)
