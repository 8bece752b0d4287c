"""Waits on the injected clock: every timeout of the reader goes through an injected ``sleep``,
so unit tests drive a fake clock (``kinesis_actors.testing.FakeClock.sleep``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

__all__ = ["wait_first", "wait_all", "wait_event"]


async def wait_first(futures: Iterable[asyncio.Future[Any]], timeout_s: float | None,
                     sleep: Callable[[float], Awaitable[Any]]) -> set[asyncio.Future[Any]]:
    """Wait until one of ``futures`` is done or ``timeout_s`` seconds pass on ``sleep``'s
    clock (None: no timeout); returns the futures that are done (empty on timeout). The
    futures are neither cancelled nor awaited further."""
    pending = set(futures)
    if not pending:
        return set()
    timer = None if timeout_s is None else asyncio.ensure_future(sleep(max(0.0, timeout_s)))
    try:
        waits = pending | ({timer} if timer is not None else set())
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if timer is not None and not timer.done():
            timer.cancel()
    return {f for f in pending if f.done()}


async def wait_event(event: asyncio.Event, timeout_s: float, sleep: Callable[[float], Awaitable[Any]]) -> bool:
    """Wait until ``event`` is set or ``timeout_s`` seconds pass on ``sleep``'s clock; True if set."""
    waiter = asyncio.ensure_future(event.wait())
    try:
        return bool(await wait_first({waiter}, timeout_s, sleep))
    finally:
        waiter.cancel()


async def wait_all(futures: Iterable[asyncio.Future[Any]], timeout_s: float,
                   sleep: Callable[[float], Awaitable[Any]]) -> set[asyncio.Future[Any]]:
    """Wait until every one of ``futures`` is done or ``timeout_s`` seconds pass on ``sleep``'s
    clock; returns those still pending (neither cancelled nor awaited further)."""
    pending = {f for f in futures if not f.done()}
    if not pending:
        return set()
    everything = asyncio.ensure_future(asyncio.wait(pending))
    try:
        await wait_first({everything}, timeout_s, sleep)
    finally:
        everything.cancel()
    return {f for f in pending if not f.done()}
