"""The sync API runs the async one on one event loop in a daemon thread (the portal), so there is
one implementation of the wire. A sync call waits for its coroutine there. Output callbacks of
sync commands run on worker threads, one call at a time per command, and the command's reader
waits for each: a slow callback slows its own command's output and nothing else."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable, Iterator, Optional, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: Optional[asyncio.AbstractEventLoop] = None
_thread: Optional[threading.Thread] = None


def _get_loop() -> asyncio.AbstractEventLoop:
    global _loop, _thread
    with _lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="bothy-sdk", daemon=True)
            thread.start()
            _loop, _thread = loop, thread
        return _loop


def call(coro: Awaitable[T]) -> T:
    """Runs ``coro`` on the portal and waits for its answer (Ctrl-C cancels it there too)."""
    if threading.current_thread() is _thread:
        close = getattr(coro, "close", None)
        if close is not None:
            close()
        raise RuntimeError(
            "A sync bothy call was made from inside an output callback; use AsyncSandbox there, "
            "or make the call after run() returns."
        )
    future = asyncio.run_coroutine_threadsafe(_wrap(coro), _get_loop())
    try:
        return future.result()
    except KeyboardInterrupt:
        future.cancel()
        raise


async def _wrap(coro: Awaitable[T]) -> T:
    return await coro


def iterate(agen: AsyncIterator[T]) -> Iterator[T]:
    """A sync iterator over an async one that runs on the portal; closing it closes the async one."""
    try:
        while True:
            try:
                yield call(agen.__anext__())
            except StopAsyncIteration:
                return
    finally:
        aclose = getattr(agen, "aclose", None)
        if aclose is not None:
            call(aclose())


async def aiter_sync(items: Iterable[bytes]) -> AsyncIterator[bytes]:
    """An async iterator over a sync one, each ``next`` (a file's read, say) on a worker thread."""
    it = iter(items)
    loop = asyncio.get_running_loop()
    done = object()
    while True:
        item: Any = await loop.run_in_executor(None, next, it, done)
        if item is done:
            return
        yield item


def offload(callback: Optional[Callable[..., Any]]) -> Optional[Callable[..., Awaitable[None]]]:
    """A sync callback as a coroutine function that runs it on a worker thread, so it never blocks
    the portal's loop; the caller awaits it, which keeps the order and the backpressure."""
    if callback is None:
        return None
    cb = callback

    async def run(*args: Any) -> None:
        await asyncio.get_running_loop().run_in_executor(None, cb, *args)

    return run
