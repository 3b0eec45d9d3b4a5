"""One limiter reply: whether the request passed, and its fields."""

from __future__ import annotations

import dataclasses

from .errors import ProtocolError


@dataclasses.dataclass(frozen=True)
class Decision:
    """One limiter reply.

    `retry_after` and `reset_after` are seconds as floats (`wait_ms / 1000`,
    `reset_ms / 1000`); the raw milliseconds are kept beside them.
    `retry_after` is 0.0 when the request can never pass (`wait_ms == -1`,
    see `never`).
    """

    allowed: bool
    limit: int
    remaining: int
    wait_ms: int
    reset_ms: int
    #: `RL.ALL`: the 0-based position of the first rule that denied.
    denied_by: int | None = None
    #: `RL.CONCURRENCY` (or `RL.HIT` on a concurrency policy): the id of the
    #: lease granted; None when none was (a denial, `COST 0`, a refund).
    lease: int | None = None
    #: A call with `UPTO n`: the units taken (0 on a denial). None for a
    #: call without `UPTO` (its cost was taken when `allowed`, else nothing).
    granted: int | None = None

    @property
    def retry_after(self) -> float:
        return max(self.wait_ms, 0) / 1000.0

    @property
    def reset_after(self) -> float:
        return self.reset_ms / 1000.0

    @property
    def never(self) -> bool:
        """Denied, and can never pass: its cost exceeds the limit."""
        return self.wait_ms < 0

    @property
    def retry_after_s(self) -> int | None:
        """`Retry-After` in whole seconds, `ceil(wait_ms / 1000)`; None if never."""
        return None if self.wait_ms < 0 else -(-self.wait_ms // 1000)

    @classmethod
    def from_reply(cls, reply: object, *, all_reply: bool = False, upto: bool = False) -> Decision:
        """Five integers; a sixth is `denied_by` for `RL.ALL` (`all_reply`),
        else the lease id of `RL.CONCURRENCY`. With `upto` (a call with
        `UPTO n`), `granted` follows: the sixth field, `RL.ALL`'s seventh."""
        sizes = ((6, 7) if all_reply else (6,)) if upto else (5, 6)
        if not isinstance(reply, (list, tuple)) or len(reply) not in sizes:
            n = " or ".join(str(s) for s in sizes)
            raise ProtocolError(f"this limiter reply is {n} integers, not {reply!r}")
        ints = [int(x) for x in reply]
        granted = ints.pop() if upto else None
        sixth = ints[5] if len(ints) == 6 and ints[5] > 0 else None
        if all_reply:
            denied_by = None if sixth is None else sixth - 1
            return cls(
                bool(ints[0]), ints[1], ints[2], ints[3], ints[4], denied_by, granted=granted
            )
        lease = None if upto else sixth
        return cls(bool(ints[0]), ints[1], ints[2], ints[3], ints[4], lease=lease, granted=granted)
