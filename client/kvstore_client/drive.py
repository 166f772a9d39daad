"""What both drivers of a flow share (client.py runs its steps with blocking calls,
aio.py as coroutines): feeding each step's outcome back into the flow, and which of
a driver's handlers takes each kind of step (steps.py says what each step means).

A driver gives each run of a flow its own handlers (`StepHandlers`, one method per
kind of step) and loops: `Pump.next()` for the next step, `handle` to run it, `give`
its value or `fail` with its KVStoreError, until the flow returns.
"""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar

from kvstore.errors import KVStoreError
from kvstore_client.steps import (
    Answer,
    Ask,
    Finish,
    Flow,
    Later,
    Move,
    Release,
    Rpc,
    Settle,
    Start,
    Step,
    Wait,
)

T = TypeVar("T")
# What a driver's handlers return: the step's value (client.py), or an awaitable of it
# (aio.py).
R_co = TypeVar("R_co", covariant=True)


class StepHandlers(Protocol[R_co]):
    """One driver's way of running each kind of step, for one run of a flow."""

    def rpc(self, step: Rpc) -> R_co: ...

    def ask(self, step: Ask) -> R_co: ...

    def answer(self, step: Answer) -> R_co: ...

    def later(self, step: Later) -> R_co: ...

    def settle(self, step: Settle) -> R_co: ...

    def start(self, step: Start) -> R_co: ...

    def finish(self, step: Finish) -> R_co: ...

    def move(self, step: Move) -> R_co: ...

    def release(self, step: Release) -> R_co: ...

    def wait(self, step: Wait) -> R_co: ...


def handle(on: StepHandlers[R_co], step: Step) -> R_co:
    """Run `step` with the handler for its kind."""
    if isinstance(step, Rpc):
        return on.rpc(step)
    if isinstance(step, Ask):
        return on.ask(step)
    if isinstance(step, Answer):
        return on.answer(step)
    if isinstance(step, Later):
        return on.later(step)
    if isinstance(step, Settle):
        return on.settle(step)
    if isinstance(step, Start):
        return on.start(step)
    if isinstance(step, Finish):
        return on.finish(step)
    if isinstance(step, Move):
        return on.move(step)
    if isinstance(step, Release):
        return on.release(step)
    if isinstance(step, Wait):
        return on.wait(step)
    raise TypeError(f"not a step: {step!r}")


class Pump(Generic[T]):
    """A flow being run: `next()` resumes it with the outcome of its last step (the value
    given, or the error thrown in) and returns its next step, or None once it has
    returned; `result` then holds what it returned."""

    __slots__ = ("_error", "_flow", "_value", "result")

    def __init__(self, flow: Flow[T]) -> None:
        self._flow = flow
        self._value: Any = None
        self._error: KVStoreError | None = None
        self.result: T

    def next(self) -> Step | None:
        try:
            error = self._error
            step = self._flow.throw(error) if error is not None else self._flow.send(self._value)
        except StopIteration as done:
            self.result = done.value
            return None
        self._value, self._error = None, None
        return step

    def give(self, value: Any) -> None:
        """The last step's value, sent into the flow by the next `next()`."""
        self._value = value

    def fail(self, error: KVStoreError) -> None:
        """The last step's error, thrown into the flow by the next `next()`."""
        self._error = error
