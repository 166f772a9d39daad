"""Running a generator one yielded item at a time: `Pump`, what every driver loop uses.

The shared layer (session.py) runs each flow (steps.py) with a Pump, and each driver
(client.py, aio.py) runs the shared layer's ops (ops.py) with one: `next()` for the
next item, then `give` its value or `fail` with its error, until the generator returns.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Pump(Generic[T]):
    """A generator being run: `next()` resumes it with the outcome of its last item (the
    value given, or the error thrown in) and returns its next item, or None once it has
    returned; `result` then holds what it returned."""

    __slots__ = ("_error", "_flow", "_value", "result")

    def __init__(self, flow: Generator[Any, Any, T]) -> None:
        self._flow = flow
        self._value: Any = None
        self._error: BaseException | None = None
        self.result: T

    def next(self) -> Any:
        try:
            error = self._error
            step = self._flow.throw(error) if error is not None else self._flow.send(self._value)
        except StopIteration as done:
            self.result = done.value
            return None
        self._value, self._error = None, None
        return step

    def give(self, value: Any) -> None:
        """The last item's value, sent into the generator by the next `next()`."""
        self._value = value

    def fail(self, error: BaseException) -> None:
        """The last item's error, thrown into the generator by the next `next()`."""
        self._error = error
