"""What one limiter call asks for: a tagged value, as the core's `Request`.

`Request.cost(n)` is `COST n` (take n units if the limiter admits them;
`COST 0` peeks), `Request.force(n)` is `COST n FORCE` (take them even if
denied), `Request.refund(n)` is `REFUND n` (give back up to n units) and
`Request.upto(n)` is `UPTO n` (take as many units as the limiter admits
now, at most n, at least 1; the decision's `granted` says how many). A
request has one kind, so FORCE with REFUND, or UPTO with COST, cannot be
built.

The typed calls' former keyword arguments (`cost=`, `force=`, `refund=`, and
a bare int for the cost) are still taken for one release, with a
`DeprecationWarning`, and turned into a `Request` by `to_request`.
"""

from __future__ import annotations

import dataclasses
import enum
import warnings
from typing import Any, Union

from . import algorithms
from .errors import InvalidArgument
from .spec import _check_int


class RequestKind(str, enum.Enum):
    """The four kinds of request (the values are the core's words)."""

    COST = algorithms.COST
    FORCE = algorithms.FORCE
    REFUND = algorithms.REFUND
    UPTO = algorithms.UPTO


@dataclasses.dataclass(frozen=True)
class Request:
    """`kind` and its `units` (0 to 2^40, as the server takes them; `UPTO`
    from 1); checked when built, naming the option as the server does
    (`COST`, `REFUND`, `UPTO`)."""

    kind: RequestKind
    units: int = 1

    def __post_init__(self) -> None:
        try:
            kind = RequestKind(self.kind)
        except ValueError:
            raise InvalidArgument(
                f"a request is a cost, a forced cost, a refund or an upto, not {self.kind!r}",
                param="request",
            ) from None
        object.__setattr__(self, "kind", kind)
        _check_int(self.option, self.units, 1 if kind is RequestKind.UPTO else 0)

    @classmethod
    def cost(cls, units: int = 1) -> Request:
        """`COST units`: taken if the limiter admits them (0: a peek)."""
        return cls(RequestKind.COST, units)

    @classmethod
    def force(cls, units: int = 1) -> Request:
        """`COST units FORCE`: taken even if denied (the answer says whether
        `COST units` would have passed)."""
        return cls(RequestKind.FORCE, units)

    @classmethod
    def refund(cls, units: int) -> Request:
        """`REFUND units`: gives back up to `units` held."""
        return cls(RequestKind.REFUND, units)

    @classmethod
    def upto(cls, units: int) -> Request:
        """`UPTO units` (1 to 2^40): takes as many units as the limiter admits
        now, at most `units`, at least 1 (else the denial `COST 1` gets); the
        decision's `granted` is the units taken. Not an option of the leaky
        bucket or concurrency."""
        return cls(RequestKind.UPTO, units)

    @property
    def option(self) -> str:
        """The option word that carries the units: `COST`, `REFUND` or `UPTO`."""
        if self.kind is RequestKind.REFUND:
            return "REFUND"
        return "UPTO" if self.kind is RequestKind.UPTO else "COST"

    def args(self) -> list[str | int]:
        """The command's options: nothing for the default `COST 1`."""
        if self.kind is RequestKind.REFUND:
            return ["REFUND", self.units]
        if self.kind is RequestKind.FORCE:
            return ["COST", self.units, "FORCE"]
        if self.kind is RequestKind.UPTO:
            return ["UPTO", self.units]
        return [] if self.units == 1 else ["COST", self.units]

    def core(self) -> algorithms.Request:
        """The same request for the in-process algorithms."""
        return algorithms.Request(self.kind.value, self.units)


#: The default request, `COST 1`.
ONE = Request.cost(1)

#: What a typed call takes for its request: a `Request`, or (deprecated) a cost.
RequestLike = Union[Request, int, None]


def to_request(
    request: RequestLike,
    cost: int | None = None,
    force: bool | None = None,
    refund: int | None = None,
    *,
    refundable: bool = True,
    stacklevel: int = 3,
) -> Request:
    """The `Request` of a typed call: `request` as it is (None: `COST 1`), or
    the deprecated `cost`/`force`/`refund` keywords (or an int) turned into
    one, with a `DeprecationWarning`. `refundable=False`: a command that
    takes no `REFUND` (`RL.ALL`, a blocking acquire, a lease)."""
    legacy = cost is not None or force is not None or refund is not None
    if isinstance(request, Request):
        if legacy:
            raise InvalidArgument(
                "give a Request or the deprecated cost=/force=/refund=, not both",
                param="request",
            )
        req = request
    elif request is None and not legacy:
        req = ONE
    else:
        if isinstance(request, bool) or not isinstance(request, (int, type(None))):
            raise InvalidArgument(
                "request must be a Request (Request.cost(n), Request.force(n), "
                f"Request.refund(n)), not {type(request).__name__}",
                param="request",
            )
        if request is not None and cost is not None:
            raise InvalidArgument("the cost is given twice", param="COST")
        warnings.warn(
            "cost=, force= and refund= (and a bare int for the cost) are deprecated: pass "
            "Request.cost(n), Request.force(n) or Request.refund(n)",
            DeprecationWarning,
            stacklevel=stacklevel,
        )
        units = request if request is not None else cost
        if refund is not None:
            if force:
                raise InvalidArgument("REFUND cannot be given with FORCE", param="REFUND")
            if units is not None and units != 1:
                raise InvalidArgument("REFUND cannot be given with COST", param="REFUND")
            req = Request.refund(refund)
        elif force:
            req = Request.force(1 if units is None else units)
        else:
            req = Request.cost(1 if units is None else units)
    if not refundable and req.kind is RequestKind.REFUND:
        raise InvalidArgument("REFUND is not an option of this call", param="REFUND")
    return req


#: The former keywords of a request, deprecated.
DEPRECATED = ("cost", "force", "refund")


def deprecated_request(
    request: RequestLike, deprecated: dict[str, Any], *, stacklevel: int = 4
) -> Request:
    """`to_request` for a typed call that takes the former keywords as
    `**deprecated`: any other keyword is a `TypeError`, as Python's own."""
    unknown = sorted(set(deprecated) - set(DEPRECATED))
    if unknown:
        raise TypeError(f"got an unexpected keyword argument {unknown[0]!r}")
    cost, force, refund = (deprecated.get(k) for k in DEPRECATED)
    return to_request(request, cost, force, refund, stacklevel=stacklevel)
