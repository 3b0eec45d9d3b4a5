#!/usr/bin/env python3
"""Mutation check of the alert tests: proves they can fail.

For every alert of rules.yml, every comparison in its expression is mutated
one at a time:
- flipped (`>` to `<=`, `>=` to `<`, `==` to `!=`, and back);
- when it compares with a number, the number moved up and down (a fraction
  times 1.5 and divided by 1.5, an integer plus and minus 1).
Each mutant is written to a temporary copy of deploy/prometheus (rules.yml
mutated, the tests as they are) and `promtool test rules` runs on every test
file there. A mutant is killed when a test of the mutated alert fails
(promtool names it: `alertname: X, time: ...`); one the tests still pass "survived": the tests do not pin
that threshold or comparison, and the check fails. The unmutated rules must
pass first, every alert must have a comparison to mutate, and every alert
must be expected to fire somewhere in the tests (a non-empty exp_alerts).

Usage: mutate.py [--promtool PATH] [--dir deploy/prometheus] [--jobs N]
Exit status: 0 when every mutant was killed, 1 otherwise, 2 on bad usage.
Python 3 standard library only.
"""

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from promrules import read_rules  # noqa: E402  (deploy/promrules.py, found through the path above)

FLIP = {">": "<=", "<=": ">", ">=": "<", "<": ">=", "==": "!=", "!=": "=="}
# Comparison operators outside strings, label matchers and ranges.
_OP = re.compile(r"(==|!=|>=|<=|>|<)(\s*(?:bool\s+)?)([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)?")


def _mask(text):
    """text with every character inside quotes, {...} and [...] replaced by a
    space, so matchers (`outcome!="x"`) and strings are never mutated."""
    out = []
    depth = 0
    quote = None
    for ch in text:
        if quote:
            out.append(" ")
            if ch == quote:
                quote = None
            continue
        if ch in "\"'`":
            quote = ch
            out.append(" ")
        elif ch in "{[":
            depth += 1
            out.append(" ")
        elif ch in "}]":
            depth -= 1
            out.append(" ")
        else:
            out.append(" " if depth else ch)
    return "".join(out)


def _moved(number):
    value = float(number)
    if value == int(value) and "." not in number and "e" not in number.lower():
        return [str(int(value) + 1), str(int(value) - 1)]
    return [repr(value * 1.5), repr(value / 1.5)]


def mutants(text, rules):
    """Yield (alert, description, mutated text) for every mutation."""
    for rule in rules:
        if rule["kind"] != "alert":
            continue
        segment = text[rule["start"] : rule["end"]]
        masked = _mask(segment)
        found = False
        for m in _OP.finditer(masked):
            found = True
            op, gap, number = m.group(1), m.group(2), m.group(3)
            at = rule["start"] + m.start()
            before, after = text[:at], text[at + len(m.group(0)) :]
            real_number = segment[m.start(3) : m.end(3)] if number else None
            tail = gap + (real_number or "")
            shown = f" {real_number}" if number else " (a series)"
            yield rule["name"], f"{op}{shown} -> {FLIP[op]}{shown}", before + FLIP[op] + tail + after
            if number:
                for moved in _moved(real_number):
                    yield rule["name"], f"{op} {real_number} -> {op} {moved}", before + op + gap + moved + after
        if not found:
            yield rule["name"], "no comparison to mutate", None


def run_tests(promtool, workdir):
    tests = sorted(glob.glob(os.path.join(workdir, "tests", "*.yml")))
    proc = subprocess.run(
        [promtool, "test", "rules", *tests], cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    return proc.returncode, proc.stdout


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--promtool", default=shutil.which("promtool") or "/usr/bin/promtool")
    parser.add_argument("--dir", default=here, help="folder with rules.yml and tests/*.yml")
    parser.add_argument("--jobs", type=int, default=2, help="promtool runs at a time (1 to 16)")
    args = parser.parse_args()
    if not 1 <= args.jobs <= 16:
        parser.error("--jobs must be from 1 to 16")
    rules_path = os.path.join(args.dir, "rules.yml")
    test_files = sorted(glob.glob(os.path.join(args.dir, "tests", "*.yml")))
    if not os.path.isfile(rules_path) or not test_files:
        parser.error(f"--dir {args.dir} must hold rules.yml and tests/*.yml")
    if not os.access(args.promtool, os.X_OK):
        parser.error(f"--promtool {args.promtool} is not an executable")

    with open(rules_path, encoding="utf-8") as f:
        text = f.read()
    rules = read_rules(rules_path)
    alerts = [r["name"] for r in rules if r["kind"] == "alert"]
    failures = []

    # Every alert is expected to fire in some test: `alertname: X` followed,
    # before the next alertname, by an exp_alerts list with an entry.
    tests_text = "\n".join(open(p, encoding="utf-8").read() for p in test_files)
    fired = set(re.findall(r"alertname:\s*(\S+)\s*\n\s*exp_alerts:\s*\n\s*-", tests_text))
    for name in alerts:
        if name not in fired:
            failures.append(f"{name}: no test expects it to fire")

    with tempfile.TemporaryDirectory(prefix="deploy-mutate-") as tmp:

        def prepare(index, content):
            work = os.path.join(tmp, str(index))
            os.makedirs(os.path.join(work, "tests"))
            for p in test_files:
                shutil.copy(p, os.path.join(work, "tests"))
            with open(os.path.join(work, "rules.yml"), "w", encoding="utf-8") as out:
                out.write(content)
            return work

        code, out = run_tests(args.promtool, prepare("base", text))
        if code != 0:
            print(out)
            print("mutate: the unmutated rules fail their tests; fix them first")
            return 1

        todo = list(mutants(text, rules))
        for name, what, content in todo:
            if content is None:
                failures.append(f"{name}: {what}")

        def check(item):
            index, (name, what, content) = item
            code, out = run_tests(args.promtool, prepare(index, content))
            return name, what, code, out

        runnable = [(i, t) for i, t in enumerate(todo) if t[2] is not None]
        width = max(len(n) for n in alerts)
        killed = 0
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            for name, what, code, out in pool.map(check, runnable):
                # Killed: a test of this very alert failed (not a broken file).
                if code != 0 and f"alertname: {name}," in out:
                    killed += 1
                    print(f"  killed    {name:<{width}}  {what}")
                else:
                    print(f"  SURVIVED  {name:<{width}}  {what}")
                    failures.append(f"{name}: mutant '{what}' passes every test")

    print(f"mutate: {killed} of {len(runnable)} mutants of {len(alerts)} alerts killed by the tests")
    for failure in failures:
        print(f"mutate: FAIL {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
