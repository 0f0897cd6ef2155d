"""The one fake clock of the tests."""

from __future__ import annotations


class FakeClock:
    """A clock the test moves by hand (`clock.now = ...` or `clock.advance(s)`):
    pass it wherever the code under test takes a `clock` (a callable returning
    seconds), so that timing is checked without waiting and without load."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
