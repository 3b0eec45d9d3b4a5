"""How far the kit's LocalLimiter (local.py, its accounts running the core's
algorithms of algorithms.py) is from the contract's golden decision
sequences: a diagnostic, not a test (pytest does not collect it; the test
is `test_golden_sequences_through_the_local_limiter` in test_contract.py,
whose step this runs).

    cd clients/python && python3 tests/golden_report.py [-v]

Each golden sequence runs on one account of a fresh LocalLimiter with the
share equal to the limit (one instance), every request (`COST n`, `COST n
FORCE`, `REFUND n`) through `LocalLimiter.run` at the step's microsecond.

A step whose call raises counts as differing. Printed per algorithm: steps,
decisions that differ in any field, those among them whose `allowed`
differs (an error counts), the errors, and the sequences with at least one
difference.

Before the accounts ran the core's algorithms (floating-point accounts, no
refund), 587 of the 1,152 decisions differed: token bucket 72, leaky bucket
103, fixed window 53, sliding log 57, hash window 183, quota 119, in every
one of the 48 sequences. Now: none.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from test_contract import ALGORITHMS, GOLDEN_WORDS, golden_step  # noqa: E402

from redis_ratelimit_client.local import LocalLimiter  # noqa: E402


def report(verbose: bool = False) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for word in GOLDEN_WORDS:
        row = dict.fromkeys(["sequences", "steps", "differ", "allowed", "error", "seq_differ"], 0)
        for n, seq in enumerate(ALGORITHMS[word]["golden"]):
            local = LocalLimiter()
            row["sequences"] += 1
            differs = 0
            for i, s in enumerate(seq["steps"]):
                row["steps"] += 1
                want = s["decision"]
                try:
                    got: list[int] | str = golden_step(local, word, s)
                except Exception as e:  # a diagnostic: every failure is counted
                    row["error"] += 1
                    got = f"{type(e).__name__}: {e}"
                if got != want:
                    differs += 1
                    row["allowed"] += isinstance(got, str) or got[0] != want[0]
                    if verbose:
                        where = f"{word} #{n} step {i} {s['params']} {s['request']}"
                        print(f"  {where}: {got} != {want}")
            row["differ"] += differs
            row["seq_differ"] += differs > 0
        out[word] = row
    return out


def main() -> None:
    rows = report(verbose="-v" in sys.argv[1:])
    print(f"{'algorithm':<12} {'steps':>5} {'differ':>6} {'allowed':>7} {'error':>5} sequences")
    for word, r in rows.items():
        print(
            f"{word:<12} {r['steps']:>5} {r['differ']:>6} {r['allowed']:>7} "
            f"{r['error']:>5} {r['seq_differ']}/{r['sequences']} differ"
        )
    total = sum(r["differ"] for r in rows.values())
    steps = sum(r["steps"] for r in rows.values())
    print(f"{'total':<12} {steps:>5} {total:>6}")


if __name__ == "__main__":
    main()
