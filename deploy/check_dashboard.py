#!/usr/bin/env python3
"""Checks the Grafana dashboard and the Prometheus rules against the series
that exist.

Every query of deploy/grafana/redis-ratelimit.json (each panel target's
expr, with Grafana's variables substituted, and each template variable's
label_values() selector) and every expr of deploy/prometheus/rules.yml must:
- parse: promtool parses them (written as recording rules into a temporary
  rules file, checked by `promtool check rules`);
- name only series that exist: those the kits serve (contract.json,
  observability.metrics; a histogram as _bucket, _sum and _count), those the
  exporter serves (exporter/metrics.txt), or those rules.yml records;
- filter a kit's or the exporter's series only on labels it has (its own,
  plus job and instance that Prometheus adds, and le on a _bucket).
The dashboard must also take its data source from the DS_PROMETHEUS input,
in every panel and target, define the variables job, instance and rule (and
every other one a query uses), and keep its panels inside the 24-column
grid, without overlaps, with unique ids. A failure names the panel (or
rule) and the query.

Usage: check_dashboard.py [--dashboard F] [--rules F] [--contract F]
                          [--exporter-metrics F] [--promtool P]
       check_dashboard.py --self-test   (a bad dashboard and rules refused)
Exit status 0 when all is well, 1 on a finding, 2 on bad usage.
Python 3 standard library only.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from promrules import RulesFileError, read_rules  # noqa: E402  (deploy/promrules.py)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULTS = {
    "dashboard": os.path.join(ROOT, "deploy", "grafana", "redis-ratelimit.json"),
    "rules": os.path.join(ROOT, "deploy", "prometheus", "rules.yml"),
    "contract": os.path.join(ROOT, "clients", "contract", "contract.json"),
    "exporter_metrics": os.path.join(ROOT, "exporter", "metrics.txt"),
}
# Labels Prometheus attaches to every scraped series.
TARGET_LABELS = {"job", "instance"}
# What Grafana's interval variables stand for while checking.
INTERVALS = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}
SAMPLE_VALUE = "x"

KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "start", "end"}
LABEL_LIST_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
AGGREGATIONS = {
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
}
IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
LABEL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Finding(Exception):
    pass


# --- known series ---------------------------------------------------------


def kit_series(contract_path):
    """{series name: label set} the kits serve, from the contract."""
    with open(contract_path, encoding="utf-8") as f:
        contract = json.load(f)
    try:
        metrics = contract["observability"]["metrics"]
    except (KeyError, TypeError):
        raise Finding(f"{contract_path}: no observability.metrics") from None
    series = {}
    for m in metrics:
        name, labels, kind = m["name"], set(m.get("labels", [])) | TARGET_LABELS, m["type"]
        if kind == "histogram":
            series[name + "_bucket"] = labels | {"le"}
            series[name + "_sum"] = labels
            series[name + "_count"] = labels
        elif kind in ("counter", "gauge"):
            series[name] = labels
        else:
            raise Finding(f"{contract_path}: metric {name} has type {kind!r} this checker does not know")
    return series


def exporter_series(path):
    """{series name: label set} the exporter serves: exporter/metrics.txt,
    one family a line, `name type label... # help`."""
    series = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            body = line.strip()
            if not body or body.startswith("#"):
                continue
            words = body.split("#", 1)[0].split()
            if (
                len(words) < 2
                or not IDENT.fullmatch(words[0])
                or words[1] not in ("counter", "gauge", "histogram", "summary", "untyped")
            ):
                raise Finding(f"{path}:{lineno}: expected 'name type labels... # help', got {body!r}")
            labels = set(words[2:]) | TARGET_LABELS
            if words[1] == "histogram":
                series[words[0] + "_bucket"] = labels | {"le"}
                series[words[0] + "_sum"] = labels
                series[words[0] + "_count"] = labels
            else:
                series[words[0]] = labels
    if not series:
        raise Finding(f"{path}: no series")
    return series


# --- PromQL scanning ------------------------------------------------------


def _skip_string(s, i):
    quote = s[i]
    i += 1
    while i < len(s):
        if s[i] == "\\" and quote != "`":
            i += 2
            continue
        if s[i] == quote:
            return i + 1
        i += 1
    raise Finding("unclosed string")


def _skip_group(s, i, open_ch, close_ch):
    depth = 0
    while i < len(s):
        c = s[i]
        if c in "\"'`":
            i = _skip_string(s, i)
            continue
        if c == open_ch:
            depth += 1
        elif c == close_ch:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise Finding(f"unclosed {open_ch!r}")


def _matchers(s, i):
    """Parse `{a="x", b=~"y"}` at s[i] == '{': (label names, {label: value
    of an = matcher}, index after '}')."""
    end = _skip_group(s, i, "{", "}")
    body = s[i + 1 : end - 1]
    names, equal = [], {}
    j = 0
    while j < len(body):
        if body[j] in " \t\r\n,":
            j += 1
            continue
        m = LABEL.match(body, j)
        if not m:
            raise Finding(f"bad label matcher in {{{body}}}")
        name = m.group(0)
        j = m.end()
        while j < len(body) and body[j] in " \t\r\n":
            j += 1
        op = re.match(r"=~|!~|!=|=", body[j:])
        if not op:
            raise Finding(f"bad label matcher in {{{body}}}")
        j += len(op.group(0))
        while j < len(body) and body[j] in " \t\r\n":
            j += 1
        if j >= len(body) or body[j] not in "\"'`":
            raise Finding(f"bad label matcher in {{{body}}}")
        k = _skip_string(body, j)
        if op.group(0) == "=":
            equal[name] = body[j + 1 : k - 1]
        names.append(name)
        j = k
    return names, equal, end


def selectors(expr):
    """The series selectors of a PromQL expression: [(name, [label names])].
    A selector without a metric name (`{job="x"}`) names __name__ or fails."""
    found = []
    i, n = 0, len(expr)
    while i < n:
        c = expr[i]
        if c in "\"'`":
            i = _skip_string(expr, i)
        elif c == "#":
            nl = expr.find("\n", i)
            i = n if nl < 0 else nl
        elif c == "[":
            i = _skip_group(expr, i, "[", "]")
        elif c == "{":
            names, equal, i = _matchers(expr, i)
            if "__name__" not in equal:
                raise Finding("a selector without a metric name ({...} alone) matches every series")
            found.append((equal["__name__"], [x for x in names if x != "__name__"]))
        elif c.isdigit() or (c == "." and i + 1 < n and expr[i + 1].isdigit()):
            m = re.compile(r"(0x[0-9a-fA-F]+|[0-9.]+(?:[eE][-+]?[0-9]+)?[a-zA-Z0-9]*)").match(expr, i)
            i = m.end()
        elif IDENT.match(expr, i):
            m = IDENT.match(expr, i)
            word = m.group(0)
            i = m.end()
            j = i
            while j < n and expr[j] in " \t\r\n":
                j += 1
            nxt = expr[j] if j < n else ""
            if word.lower() in LABEL_LIST_KEYWORDS:
                if nxt == "(":
                    i = _skip_group(expr, j, "(", ")")
            elif word.lower() in KEYWORDS:
                pass
            elif nxt == "(":
                pass  # a function or an aggregation; its arguments follow
            elif word in AGGREGATIONS and re.match(r"(by|without)\b", expr[j:], re.I):
                pass  # `sum by (job) (...)`: the label list and the arguments follow
            else:
                labels = []
                if nxt == "{":
                    labels, _, i = _matchers(expr, j)
                found.append((word, labels))
        else:
            i += 1
    return found


def substitute(expr):
    """Grafana's variables replaced by values PromQL accepts."""

    def var(m):
        name = m.group(1) or m.group(2) or m.group(3)
        return INTERVALS.get(name, SAMPLE_VALUE)

    return re.sub(r"\$\{(\w+)(?::[^}]*)?\}|\[\[(\w+)(?::[^\]]*)?\]\]|\$(\w+)", var, expr)


# --- checks ---------------------------------------------------------------


def layout_problems(dashboard):
    """The dashboard's frame: schemaVersion, unique panel ids, panels inside
    the 24-column grid without overlaps, the variables job, instance and
    rule, and every $variable a query uses defined (or Grafana's own)."""
    problems = []
    if not isinstance(dashboard.get("schemaVersion"), int):
        problems.append("dashboard: no schemaVersion")
    names = {v.get("name") for v in dashboard.get("templating", {}).get("list", [])}
    for needed in ("job", "instance", "rule"):
        if needed not in names:
            problems.append(f"dashboard: no template variable {needed!r}")
    panels, ids, cells = [], set(), {}

    def walk(items):
        for p in items:
            panels.append(p)
            walk(p.get("panels", []))

    walk(dashboard.get("panels", []))
    for p in panels:
        title = p.get("title") or f"id {p.get('id')}"
        if p.get("id") in ids:
            problems.append(f'panel "{title}": id {p.get("id")} used twice')
        ids.add(p.get("id"))
        gp = p.get("gridPos", {})
        x, y, w, h = (gp.get(k) for k in ("x", "y", "w", "h"))
        if not all(isinstance(v, int) and v >= 0 for v in (x, y, w, h)) or w == 0 or h == 0 or x + w > 24:
            problems.append(f'panel "{title}": gridPos {gp} is not inside the 24-column grid')
            continue
        for cx in range(x, x + w):
            for cy in range(y, y + h):
                if (cx, cy) in cells:
                    problems.append(f'panel "{title}": overlaps panel "{cells[(cx, cy)]}"')
                    break
                cells[(cx, cy)] = title
            else:
                continue
            break
        for t in p.get("targets", []):
            for m in re.finditer(r"\$\{(\w+)|\[\[(\w+)|\$(\w+)", t.get("expr") or ""):
                var = m.group(1) or m.group(2) or m.group(3)
                if var not in names and var not in INTERVALS:
                    problems.append(f'panel "{title}" target {t.get("refId", "?")}: variable ${var} is not defined')
    return problems


def dashboard_queries(dashboard):
    """[(where, expr)] of every panel target and template variable query."""
    queries, problems = [], []
    if not any(i.get("name") == "DS_PROMETHEUS" for i in dashboard.get("__inputs", [])):
        problems.append("dashboard: no __inputs entry named DS_PROMETHEUS")

    def walk(panels):
        for p in panels:
            title = p.get("title") or f"id {p.get('id')}"
            if p.get("type") == "row":
                walk(p.get("panels", []))
                continue
            targets = p.get("targets", [])
            if not targets:
                problems.append(f'panel "{title}": no targets')
            if p.get("datasource", {}).get("uid") != "${DS_PROMETHEUS}":
                problems.append(f'panel "{title}": its datasource is not ${{DS_PROMETHEUS}}')
            for t in targets:
                ref = t.get("refId", "?")
                if t.get("datasource", {}).get("uid") != "${DS_PROMETHEUS}":
                    problems.append(f'panel "{title}" target {ref}: its datasource is not ${{DS_PROMETHEUS}}')
                expr = t.get("expr")
                if not isinstance(expr, str) or not expr.strip():
                    problems.append(f'panel "{title}" target {ref}: no expr')
                    continue
                queries.append((f'panel "{title}" target {ref}', expr))

    walk(dashboard.get("panels", []))
    if not queries:
        problems.append("dashboard: no panel queries")
    for v in dashboard.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v.get("query")
        q = q.get("query", "") if isinstance(q, dict) else (q or "")
        where = f'variable "{v.get("name")}"'
        m = re.fullmatch(r"\s*label_values\(\s*(.*?)\s*,\s*(\w+)\s*\)\s*", q, re.S)
        if m:
            queries.append((where, m.group(1)))
            continue
        m = re.fullmatch(r"\s*query_result\(\s*(.*)\)\s*", q, re.S)
        if m:
            queries.append((where, m.group(1)))
            continue
        problems.append(f"{where}: query {q!r} is neither label_values(selector, label) nor query_result(expr)")
    return queries, problems


def promtool_parse(promtool, queries):
    """Problems of the expressions promtool cannot parse."""
    rules, names = [], {}
    for k, (where, expr) in enumerate(queries):
        record = f"check:q{k}"
        names[record] = (where, expr)
        rules.append({"record": record, "expr": expr})
    with tempfile.TemporaryDirectory(prefix="check-dashboard-") as tmp:
        path = os.path.join(tmp, "queries.yml")
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"groups": [{"name": "dashboard-queries", "rules": rules}]}, f)  # JSON is YAML
        proc = subprocess.run(
            [promtool, "check", "rules", path], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    if proc.returncode == 0:
        return []
    problems = []
    for m in re.finditer(r'"(check:q\d+)": (.*)', proc.stdout):
        where, expr = names[m.group(1)]
        problems.append(f"{where}: promtool cannot parse {expr!r}: {m.group(2)}")
    if not problems:
        problems.append(f"promtool check rules failed:\n{proc.stdout}")
    return problems


def series_problems(queries, raw, recorded):
    problems = []
    for where, expr in queries:
        try:
            found = selectors(expr)
        except Finding as e:
            problems.append(f"{where}: {e} in {expr!r}")
            continue
        if not found:
            problems.append(f"{where}: names no series: {expr!r}")
        for name, labels in found:
            if name in raw:
                unknown = sorted(set(labels) - raw[name])
                if unknown:
                    problems.append(
                        f"{where}: series {name} has no label {', '.join(unknown)}"
                        f" (it has {', '.join(sorted(raw[name]))})"
                    )
            elif name not in recorded:
                problems.append(
                    f"{where}: series {name} is served by no kit (contract.json), not by the exporter"
                    " (exporter/metrics.txt), and recorded by no rule of rules.yml"
                )
    return problems


def check(dashboard_path, rules_path, contract_path, exporter_path, promtool):
    """All findings, as a list of messages (empty: all is well)."""
    raw = kit_series(contract_path)
    # Prometheus's own series of every target (RateLimitExporterDown).
    raw["up"] = set(TARGET_LABELS)
    for name, labels in exporter_series(exporter_path).items():
        if name in raw:
            raise Finding(f"series {name} is in both contract.json and {exporter_path}")
        raw[name] = labels
    proc = subprocess.run(
        [promtool, "check", "rules", rules_path], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    if proc.returncode != 0:
        return [f"{rules_path}: promtool check rules failed:\n{proc.stdout}"]
    rules = read_rules(rules_path)
    recorded = {r["name"] for r in rules if r["kind"] == "record"}
    clash = sorted(recorded & set(raw))
    if clash:
        return [f"{rules_path}: records {', '.join(clash)}, a name the kits or the exporter already serve"]
    problems = series_problems(
        [(f"{rules_path}: {r['kind']} {r['name']} (line {r['line']})", r["expr"]) for r in rules], raw, recorded
    )
    with open(dashboard_path, encoding="utf-8") as f:
        try:
            dashboard = json.load(f)
        except json.JSONDecodeError as e:
            return [f"{dashboard_path}: not JSON: {e}"]
    queries, found = dashboard_queries(dashboard)
    problems += found + layout_problems(dashboard)
    queries = [(where, substitute(expr)) for where, expr in queries]
    problems += promtool_parse(promtool, queries)
    problems += series_problems(queries, raw, recorded)
    return problems


def self_test(args):
    """A bad dashboard (an expr that does not parse, an unknown series, a
    label a series lacks, a foreign datasource) and a rules file naming an
    unknown series are refused, each finding naming its panel or rule; the
    real files pass."""
    failures = []
    good = check(args.dashboard, args.rules, args.contract, args.exporter_metrics, args.promtool)
    if good:
        failures.append("the real dashboard and rules should pass, got: " + "; ".join(good))
    with open(args.dashboard, encoding="utf-8") as f:
        base = json.load(f)
    cases = [
        ("Broken parse", 'sum(rate(ratelimit_decisions_total{job=~"$job"}[$__rate_interval])', None, "cannot parse"),
        (
            "Unknown series",
            'sum(rate(ratelimit_decision_total{job=~"$job"}[$__rate_interval]))',
            None,
            "series ratelimit_decision_total is served by no kit",
        ),
        ("Unknown label", 'sum(rate(ratelimit_decisions_total{route="x"}[5m]))', None, "has no label route"),
        ("Unknown series behind __name__", '{__name__="ratelimit_hits_total"}', None, "series ratelimit_hits_total"),
        ("Foreign datasource", "ratelimit_stage", {"type": "prometheus", "uid": "prod-prom"}, "datasource is not"),
        ("Undefined variable", 'ratelimit_stage{rule=~"$route"}', None, "variable $route is not defined"),
    ]
    with tempfile.TemporaryDirectory(prefix="check-dashboard-self-") as tmp:
        for title, expr, ds, expect in cases:
            bad = json.loads(json.dumps(base))
            panel = {
                "datasource": ds or {"type": "prometheus", "uid": "${DS_PROMETHEUS}"},
                "id": 999,
                "gridPos": {"x": 0, "y": 500, "w": 12, "h": 8},
                "title": title,
                "type": "timeseries",
                "targets": [
                    {"datasource": ds or {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, "expr": expr, "refId": "A"}
                ],
            }
            bad["panels"].append(panel)
            path = os.path.join(tmp, "bad.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(bad, f)
            got = check(path, args.rules, args.contract, args.exporter_metrics, args.promtool)
            if not any(f'panel "{title}"' in g and expect in g for g in got):
                failures.append(
                    f"a dashboard with panel {title!r} ({expr}) should be refused with {expect!r}, got: {got}"
                )
            else:
                print(f"  refused as expected: panel {title!r}")
        # A copy of a panel at the same place, with the same id.
        bad = json.loads(json.dumps(base))
        twin = next(p for p in bad["panels"] if p.get("type") != "row")
        bad["panels"].append(dict(twin, title="Twin"))
        path = os.path.join(tmp, "twin.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(bad, f)
        got = check(path, args.rules, args.contract, args.exporter_metrics, args.promtool)
        if not (any('panel "Twin": overlaps' in g for g in got) and any("used twice" in g for g in got)):
            failures.append(f"a dashboard with two panels at one place and one id should be refused, got: {got}")
        else:
            print("  refused as expected: two panels at one place, with one id")
        with open(args.rules, encoding="utf-8") as f:
            rules_text = f.read()
        bad_rules = os.path.join(tmp, "rules.yml")
        with open(bad_rules, "w", encoding="utf-8") as f:
            f.write(
                rules_text.replace(
                    "rate(ratelimit_deny_events_dropped_total[5m])", "rate(ratelimit_deny_events_lost_total[5m])"
                )
            )
        got = check(args.dashboard, bad_rules, args.contract, args.exporter_metrics, args.promtool)
        if not any(
            "record job:ratelimit_deny_events_dropped:rate5m" in g and "ratelimit_deny_events_lost_total" in g
            for g in got
        ):
            failures.append(f"rules naming an unknown series should be refused, got: {got}")
        else:
            print("  refused as expected: a rule naming ratelimit_deny_events_lost_total")
    for f in failures:
        print(f"check_dashboard self-test: FAIL {f}")
    print(f"check_dashboard self-test: {'FAILED' if failures else 'passed'} ({len(cases) + 3} cases)")
    return 1 if failures else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dashboard", default=DEFAULTS["dashboard"])
    parser.add_argument("--rules", default=DEFAULTS["rules"])
    parser.add_argument("--contract", default=DEFAULTS["contract"])
    parser.add_argument("--exporter-metrics", default=DEFAULTS["exporter_metrics"])
    parser.add_argument("--promtool", default=shutil.which("promtool") or "/usr/bin/promtool")
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    for opt in ("dashboard", "rules", "contract", "exporter_metrics"):
        if not os.path.isfile(getattr(args, opt)):
            parser.error(f"--{opt.replace('_', '-')} {getattr(args, opt)} is not a file")
    if not os.access(args.promtool, os.X_OK):
        parser.error(f"--promtool {args.promtool} is not an executable")
    try:
        if args.self_test:
            return self_test(args)
        problems = check(args.dashboard, args.rules, args.contract, args.exporter_metrics, args.promtool)
    except (Finding, RulesFileError, OSError, ValueError, KeyError) as e:
        print(f"check_dashboard: FAIL {e}")
        return 1
    for p in problems:
        print(f"check_dashboard: FAIL {p}")
    if problems:
        return 1
    print(
        f"check_dashboard: {os.path.relpath(args.dashboard)} and {os.path.relpath(args.rules)}:"
        " every query parses and names known series"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
