"""One call run in a daemon thread, its answer or its error taken later.

For work that waits on another process (``sacct``, a store query) while this one goes on:
the thread waits with the GIL released, so both really run at once. Standard library only,
so the ``gpueff`` path and the accounting adapter can both use it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class InBackground(Generic[T]):
    """``call()`` started in a daemon thread now; ``result`` joins it and re-raises its error."""

    def __init__(self, call: Callable[[], T], name: str = "background") -> None:
        self._call = call
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._call()
        except BaseException as exc:  # handed to the caller by result()
            self._error = exc

    def wait(self, timeout_s: float) -> bool:
        """Whether the call has ended, waiting at most ``timeout_s`` seconds for it."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def result(self) -> T:
        """The call's answer, once it has one; its exception, raised here."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]
