"""Errors for a client used the wrong way: closed, or a lease in the other kind of `with`."""

from __future__ import annotations

from kvstore.errors import InvalidArgument


class ClientClosed(InvalidArgument):
    """The client was closed: it holds no channel and no memory any more."""


class WrongLeaseContext(InvalidArgument):
    """A lease of the asyncio client in a plain `with`, or of the blocking client in an
    `async with`: the release would not run (or could not be awaited)."""
