"""How far the kit's LocalLimiter (asgi.py, floating point) is from the
contract's golden decision sequences: a diagnostic, not a test (pytest does
not collect it).

    cd clients/python && python3 tests/golden_report.py [-v]

Each golden sequence runs on one account of a fresh LocalLimiter with the
share equal to the limit (one instance). A step's request is mapped as far
as the limiter's API allows:

- `{"cost": 0}`: `fields` (the account as it stands);
- `{"cost": 1}`: `decide`;
- `{"cost": n}`: `charge(units=n)` when `fields` shows n units left, else
  `denial` (the limiter has no n-unit request of its own);
- `{"force": n}`: `charge(units=n)`;
- `{"refund": n}`: no API: the step is skipped and counted as differing.

A step whose call raises counts as differing too. Printed per algorithm:
steps, decisions that differ in any field, those among them whose `allowed`
differs (an error counts; a skipped refund does not), those before the
sequence's first refund (not a consequence of a skipped refund), the
refunds and errors among the differing, and the sequences with at least one
difference.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from redis_ratelimit_client.asgi import LocalLimiter, _limit_of  # noqa: E402
from redis_ratelimit_client.model import (  # noqa: E402
    Algorithm,
    Decision,
    FixedWindow,
    HashWindow,
    LeakyBucket,
    Quota,
    Sliding,
    TokenBucket,
)

CONTRACT_PATH = HERE / ".." / ".." / "contract" / "contract.json"
WORDS = ["TOKENBUCKET", "LEAKYBUCKET", "FIXEDWINDOW", "SLIDING", "HASHWINDOW", "QUOTA"]
PERIODS = ["DAY", "WEEK", "MONTH", "YEAR"]


def spec_of(word: str, params: list[int]) -> Algorithm:
    if word == "TOKENBUCKET":
        return TokenBucket(*params)
    if word == "LEAKYBUCKET":
        return LeakyBucket(*params)
    if word == "FIXEDWINDOW":
        return FixedWindow(*params)
    if word == "SLIDING":
        return Sliding(*params)
    if word == "HASHWINDOW":
        return HashWindow(*params)
    if word == "QUOTA":
        return Quota(params[0], PERIODS[params[1]])  # type: ignore[arg-type]
    raise ValueError(word)


def step(local: LocalLimiter, spec: Algorithm, now: float, request: dict[str, int]) -> Decision:
    share = _limit_of(spec)
    if "force" in request:
        return local.charge("golden", "k", spec, share, now, units=request["force"])
    cost = request["cost"]
    if cost == 0:
        return local.fields("golden", "k", spec, share, now)
    if cost == 1:
        return local.decide("golden", "k", spec, share, now)
    if local.fields("golden", "k", spec, share, now).remaining >= cost:
        return local.charge("golden", "k", spec, share, now, units=cost)
    return local.denial("golden", "k", spec, share, now)


def as_list(d: Decision) -> list[int]:
    return [int(d.allowed), d.limit, d.remaining, d.wait_ms, d.reset_ms]


def report(verbose: bool = False) -> dict[str, dict[str, int]]:
    contract: dict[str, Any] = json.loads(CONTRACT_PATH.read_text(encoding="utf-8"))
    algos = {a["word"]: a for a in contract["algorithms"]}
    out: dict[str, dict[str, int]] = {}
    for word in WORDS:
        row = dict.fromkeys(
            [
                "sequences",
                "steps",
                "differ",
                "allowed",
                "before_refund",
                "refund",
                "error",
                "seq_differ",
            ],
            0,
        )
        for n, seq in enumerate(algos[word]["golden"]):
            local = LocalLimiter()
            row["sequences"] += 1
            differs = 0
            refunded = False
            for i, s in enumerate(seq["steps"]):
                row["steps"] += 1
                want = s["decision"]
                if "refund" in s["request"]:
                    refunded = True
                    row["refund"] += 1
                    differs += 1
                    continue
                try:
                    spec = spec_of(word, s["params"])
                    d = step(local, spec, s["at_us"] / 1e6, s["request"])
                    got: list[int] | str = as_list(d)
                except Exception as e:  # a diagnostic: every failure is counted
                    row["error"] += 1
                    got = f"{type(e).__name__}: {e}"
                if got != want:
                    differs += 1
                    row["allowed"] += isinstance(got, str) or got[0] != want[0]
                    row["before_refund"] += not refunded
                    if verbose:
                        where = f"{word} #{n} step {i} {s['params']} {s['request']}"
                        print(f"  {where}: {got} != {want}")
            row["differ"] += differs
            row["seq_differ"] += differs > 0
        out[word] = row
    return out


def main() -> None:
    rows = report(verbose="-v" in sys.argv[1:])
    print(
        f"{'algorithm':<12} {'steps':>5} {'differ':>6} {'allowed':>7} {'before_refund':>13} "
        f"{'refund':>6} {'error':>5} sequences"
    )
    for word, r in rows.items():
        print(
            f"{word:<12} {r['steps']:>5} {r['differ']:>6} {r['allowed']:>7} "
            f"{r['before_refund']:>13} {r['refund']:>6} "
            f"{r['error']:>5} {r['seq_differ']}/{r['sequences']} differ"
        )
    total = sum(r["differ"] for r in rows.values())
    steps = sum(r["steps"] for r in rows.values())
    print(f"{'total':<12} {steps:>5} {total:>6}")


if __name__ == "__main__":
    main()
