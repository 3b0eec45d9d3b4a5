#!/usr/bin/env python3
"""Writes deploy/grafana/redis-ratelimit.json, the Grafana dashboard.

The dashboard is generated so its panels stay regular (one datasource input,
the same variables in every query, one layout) and reviewable here; the
JSON is committed for import (Dashboards > New > Import, pick the Prometheus
data source for DS_PROMETHEUS). `build.py --check` fails when the committed
JSON differs from what this script writes (deploy/test.sh runs it).

Usage: build.py [--check] [--out PATH]
Python 3 standard library only.
"""

import argparse
import json
import os
import sys

DS = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}

# Filters every kit query carries, and every exporter query.
KIT = 'job=~"$job",instance=~"$instance",rule=~"$rule"'
KIT_NO_RULE = 'job=~"$job",instance=~"$instance"'
SRV = 'node=~"$node"'
SRV_POLICY = 'node=~"$node",policy=~"$rule"'

RATIO_STEPS = [(None, "green"), (0.5, "orange"), (0.8, "red")]


def target(expr, legend, ref):
    return {"datasource": DS, "editorMode": "code", "expr": expr, "legendFormat": legend, "range": True, "refId": ref}


def thresholds(steps):
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for v, c in steps]}


class Layout:
    def __init__(self):
        self.panels = []
        self.y = 0
        self.x = 0
        self.row_h = 0
        self.next_id = 1

    def _place(self, w, h):
        if self.x + w > 24:
            self.y += self.row_h
            self.x, self.row_h = 0, 0
        pos = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.x += w
        self.row_h = max(self.row_h, h)
        return pos

    def row(self, title):
        if self.x:
            self.y += self.row_h
            self.x, self.row_h = 0, 0
        self.panels.append(
            {
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y},
                "id": self.next_id,
                "panels": [],
                "title": title,
                "type": "row",
            }
        )
        self.next_id += 1
        self.y += 1

    def panel(
        self,
        kind,
        title,
        description,
        targets,
        unit="short",
        w=12,
        h=8,
        steps=None,
        line_thresholds=False,
        stack=False,
        minimum=None,
        maximum=None,
        decimals=None,
    ):
        defaults = {"unit": unit, "thresholds": thresholds(steps or [(None, "green")])}
        if minimum is not None:
            defaults["min"] = minimum
        if maximum is not None:
            defaults["max"] = maximum
        if decimals is not None:
            defaults["decimals"] = decimals
        if kind == "timeseries":
            defaults["color"] = {"mode": "palette-classic"}
            defaults["custom"] = {
                "drawStyle": "line",
                "lineWidth": 1,
                "fillOpacity": 10 if not stack else 60,
                "showPoints": "never",
                "spanNulls": False,
                "stacking": {"mode": "normal" if stack else "none", "group": "A"},
                "thresholdsStyle": {"mode": "line" if line_thresholds else "off"},
            }
            options = {
                "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                "tooltip": {"mode": "multi", "sort": "desc"},
            }
        else:
            defaults["color"] = {"mode": "thresholds"}
            options = {
                "colorMode": "background",
                "graphMode": "none",
                "justifyMode": "auto",
                "orientation": "auto",
                "textMode": "auto",
                "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            }
        refs = "ABCDEFGH"
        self.panels.append(
            {
                "datasource": DS,
                "description": description,
                "fieldConfig": {"defaults": defaults, "overrides": []},
                "gridPos": self._place(w, h),
                "id": self.next_id,
                "options": options,
                "targets": [target(expr, legend, refs[i]) for i, (expr, legend) in enumerate(targets)],
                "title": title,
                "type": kind,
            }
        )
        self.next_id += 1


def variable(name, label, query, description, regex=""):
    return {
        "allValue": ".*",
        "current": {},
        "datasource": DS,
        "definition": query,
        "description": description,
        "hide": 0,
        "includeAll": True,
        "label": label,
        "multi": True,
        "name": name,
        "options": [],
        "query": {"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "refresh": 2,
        "regex": regex,
        "skipUrlSync": False,
        "sort": 1,
        "type": "query",
    }


def dashboard():
    d = Layout()

    d.row("Overview")
    d.panel(
        "stat",
        "Highest trigger rate",
        "Highest share of a rule's decisions denied over 5 minutes (recorded rule:ratelimit_trigger_ratio:rate5m, kits and server). Alerts: above 50% for 5m is P1, above 80% is P0.",
        [('max(rule:ratelimit_trigger_ratio:rate5m{rule=~"$rule"})', "")],
        unit="percentunit",
        w=6,
        h=4,
        steps=RATIO_STEPS,
        decimals=1,
    )
    d.panel(
        "stat",
        "Highest shadow-deny ratio",
        "Highest share of a rule's calls that a shadowed rule would have denied (rule:ratelimit_shadow_ratio:rate5m). Alert: above 0.5% for 10m is P2.",
        [('max(rule:ratelimit_shadow_ratio:rate5m{rule=~"$rule"})', "")],
        unit="percentunit",
        w=6,
        h=4,
        steps=[(None, "green"), (0.005, "orange")],
        decimals=2,
    )
    d.panel(
        "stat",
        "Limiter p99",
        "99th percentile of the limiter's round trips to Redis over 5 minutes. Alert: above 10 ms for 5m is P2.",
        [
            (
                f"histogram_quantile(0.99, sum by (le) (rate(ratelimit_redis_seconds_bucket{{{KIT_NO_RULE}}}[$__rate_interval])))",
                "",
            )
        ],
        unit="s",
        w=6,
        h=4,
        steps=[(None, "green"), (0.01, "orange")],
        decimals=1,
    )
    d.panel(
        "stat",
        "Nodes up",
        "Redis nodes that answered the exporter's last scrape, of the nodes it scrapes. Alert: a node down for 1m is P1.",
        [(f"sum(redis_ratelimit_up{{{SRV}}})", "up"), (f"count(redis_ratelimit_up{{{SRV}}})", "scraped")],
        w=6,
        h=4,
    )

    d.row("Decisions (kits)")
    d.panel(
        "timeseries",
        "Decisions by level and outcome",
        "Decisions per second of the selected rules, by the level that took them (local, redis, deny_cache, grant, fallback) and their outcome (admitted, denied, shadow_denied).",
        [
            (
                f"sum by (level, outcome) (rate(ratelimit_decisions_total{{{KIT}}}[$__rate_interval]))",
                "{{level}} {{outcome}}",
            )
        ],
        unit="reqps",
        stack=True,
    )
    d.panel(
        "timeseries",
        "Trigger rate per rule",
        "Denied / all decisions of each rule over 5 minutes, from the kits (deny cache and local level included) and from the server (enforced denials / calls). Lines at 50% (P1 after 5m) and 80% (P0 after 1m).",
        [
            (
                'rule:ratelimit_trigger_ratio:rate5m{source="kits",job=~"$job",rule=~"$rule"}',
                "{{rule}} (kits, {{job}})",
            ),
            ('rule:ratelimit_trigger_ratio:rate5m{source="server",rule=~"$rule"}', "{{rule}} (server)"),
        ],
        unit="percentunit",
        steps=RATIO_STEPS,
        line_thresholds=True,
        minimum=0,
        maximum=1,
    )
    d.panel(
        "timeseries",
        "Near limit",
        "How close each rule's last decisions came to its limit: 1 - remaining / limit (1 = at the limit), the highest over the instances.",
        [(f"max by (rule) (1 - min_over_time(ratelimit_remaining_ratio{{{KIT}}}[$__rate_interval]))", "{{rule}}")],
        unit="percentunit",
        steps=[(None, "green"), (0.9, "orange")],
        line_thresholds=True,
        minimum=0,
        maximum=1,
    )
    d.panel(
        "timeseries",
        "Rules within 10% of their limit",
        "Instances whose last decision of the rule left less than 10% of the limit.",
        [(f"count by (rule) (ratelimit_remaining_ratio{{{KIT}}} < 0.1)", "{{rule}}")],
    )
    d.panel(
        "timeseries",
        "Redis latency (limiter round trips)",
        "p50 and p99 of ratelimit_redis_seconds, the round trips of limiter commands. Line at 10 ms (p99 above it for 5m: P2).",
        [
            (
                f"histogram_quantile(0.5, sum by (le) (rate(ratelimit_redis_seconds_bucket{{{KIT_NO_RULE}}}[$__rate_interval])))",
                "p50",
            ),
            (
                f"histogram_quantile(0.99, sum by (le) (rate(ratelimit_redis_seconds_bucket{{{KIT_NO_RULE}}}[$__rate_interval])))",
                "p99",
            ),
            (
                f"sum(rate(ratelimit_redis_seconds_sum{{{KIT_NO_RULE}}}[$__rate_interval])) / sum(rate(ratelimit_redis_seconds_count{{{KIT_NO_RULE}}}[$__rate_interval]))",
                "mean",
            ),
        ],
        unit="s",
        steps=[(None, "green"), (0.01, "red")],
        line_thresholds=True,
        minimum=0,
    )
    d.panel(
        "timeseries",
        "Shadow denials ratio",
        "Share of each rule's calls a shadowed rule (MODE SHADOW, or keys outside a partial ROLLOUT) would have denied: the roll-out's misfire check. Line at 0.5% (P2 after 10m).",
        [
            (
                'rule:ratelimit_shadow_ratio:rate5m{source="kits",job=~"$job",rule=~"$rule"}',
                "{{rule}} (kits, {{job}})",
            ),
            ('rule:ratelimit_shadow_ratio:rate5m{source="server",rule=~"$rule"}', "{{rule}} (server)"),
        ],
        unit="percentunit",
        steps=[(None, "green"), (0.005, "red")],
        line_thresholds=True,
        minimum=0,
    )

    d.row("Fallbacks, breakers and the protection loop")
    d.panel(
        "timeseries",
        "Fallback decisions",
        "Decisions per second the fallback took while Redis was away, by rule and outcome (P1 after 2m).",
        [
            (
                f'sum by (rule, outcome) (rate(ratelimit_decisions_total{{{KIT},level="fallback"}}[$__rate_interval]))',
                "{{rule}} {{outcome}}",
            )
        ],
        unit="reqps",
    )
    d.panel(
        "timeseries",
        "Breakers open",
        "Instances with each breaker open (Redis skipped, or a protected stage broken); P1 after 2m.",
        [(f"sum by (breaker) (ratelimit_breaker_open{{{KIT_NO_RULE}}})", "{{breaker}}")],
        steps=[(None, "green"), (1, "red")],
        line_thresholds=True,
        minimum=0,
        decimals=0,
    )
    d.panel(
        "timeseries",
        "Scale",
        "The protection loop's scale of each rule's policy, in percent (100 = full limits): the lowest an instance (kits) or a node (server) reports.",
        [
            (f"min by (rule) (ratelimit_scale{{{KIT}}})", "{{rule}} (kits)"),
            (f"min by (policy) (redis_ratelimit_policy_scale{{{SRV_POLICY}}})", "{{policy}} (server)"),
        ],
        unit="percent",
        minimum=0,
        maximum=100,
    )
    d.panel(
        "timeseries",
        "Stage",
        "The protection loop's stage: 0 normal, 1 degrade (P2 after 1m), 2 break (P1 after 1m); the highest an instance or a node reports.",
        [
            (f"max by (rule) (ratelimit_stage{{{KIT}}})", "{{rule}} (kits)"),
            (f"max by (policy) (redis_ratelimit_policy_stage{{{SRV_POLICY}}})", "{{policy}} (server)"),
        ],
        steps=[(None, "green"), (1, "orange"), (2, "red")],
        line_thresholds=True,
        minimum=0,
        maximum=2,
        decimals=0,
    )
    d.panel(
        "timeseries",
        "Deny events",
        "Deny events per second a sink accepted, dropped (a full buffer, or a refused batch: P2 after 10m), and failed flushes.",
        [
            (f"sum(rate(ratelimit_deny_events_shipped_total{{{KIT_NO_RULE}}}[$__rate_interval]))", "shipped"),
            (f"sum(rate(ratelimit_deny_events_dropped_total{{{KIT_NO_RULE}}}[$__rate_interval]))", "dropped"),
            (
                f"sum(rate(ratelimit_deny_events_sink_errors_total{{{KIT_NO_RULE}}}[$__rate_interval]))",
                "sink errors (flushes)",
            ),
        ],
        unit="ops",
        w=24,
    )

    d.row("Server (exporter)")
    d.panel(
        "timeseries",
        "Policy calls and denials",
        "Per policy over every scraped node: calls, enforced denials (denied - shadow_denied) and shadow denials, per second.",
        [
            (
                f"sum by (policy) (rate(redis_ratelimit_policy_calls_total{{{SRV_POLICY}}}[$__rate_interval]))",
                "{{policy}} calls",
            ),
            (
                f"sum by (policy) (rate(redis_ratelimit_policy_denied_total{{{SRV_POLICY}}}[$__rate_interval]) - rate(redis_ratelimit_policy_shadow_denied_total{{{SRV_POLICY}}}[$__rate_interval]))",
                "{{policy}} denied",
            ),
            (
                f"sum by (policy) (rate(redis_ratelimit_policy_shadow_denied_total{{{SRV_POLICY}}}[$__rate_interval]))",
                "{{policy}} shadow denied",
            ),
        ],
        unit="reqps",
    )
    d.panel(
        "timeseries",
        "Algorithm calls",
        "Calls per second of each algorithm on the scraped nodes (direct, through RL.HIT, or in RL.ALL).",
        [
            (
                f"sum by (algorithm) (rate(redis_ratelimit_algorithm_calls_total{{{SRV}}}[$__rate_interval]))",
                "{{algorithm}}",
            )
        ],
        unit="reqps",
    )
    d.panel(
        "timeseries",
        "Blocked requests",
        "Requests waiting in the server now (BLOCK), per node.",
        [(f"sum by (node) (redis_ratelimit_blocked{{{SRV}}})", "{{node}}")],
        minimum=0,
        decimals=0,
        w=8,
    )
    d.panel(
        "timeseries",
        "Deny log length",
        "Entries in each node's deny log (RL.LOG), and its bound (ratelimit.log-max-len).",
        [
            (f"redis_ratelimit_deny_log_length{{{SRV}}}", "{{node}}"),
            (f"max(redis_ratelimit_deny_log_max_length{{{SRV}}})", "max length"),
        ],
        minimum=0,
        decimals=0,
        w=8,
    )
    d.panel(
        "timeseries",
        "Nodes up",
        "1 when the node answered INFO ratelimit at the exporter's last scrape (P1 when 0 for 1m).",
        [(f"redis_ratelimit_up{{{SRV}}}", "{{node}}")],
        steps=[(None, "red"), (1, "green")],
        minimum=0,
        maximum=1,
        decimals=0,
        w=8,
    )
    d.panel(
        "timeseries",
        "Definitions per policy",
        "Distinct definitions (fingerprints) of each policy across the nodes: above 1, a SET missed a node (P1 after 5m).",
        [('job_policy:redis_ratelimit_policy_fingerprints:count{policy=~"$rule"}', "{{policy}}")],
        steps=[(None, "green"), (2, "red")],
        line_thresholds=True,
        minimum=0,
        decimals=0,
    )
    d.panel(
        "timeseries",
        "Policies per node",
        "Policies defined on each node (ratelimit_policies); the nodes holding each policy should equal the nodes up (P1 after 5m otherwise).",
        [
            (f"redis_ratelimit_policies{{{SRV}}}", "{{node}}"),
            ('job_policy:redis_ratelimit_policy_nodes:count{policy=~"$rule"}', "nodes holding {{policy}}"),
            ("job:redis_ratelimit_nodes_up:count", "nodes up"),
        ],
        minimum=0,
        decimals=0,
    )

    return {
        "__inputs": [
            {
                "name": "DS_PROMETHEUS",
                "label": "Prometheus",
                "description": "The Prometheus that scrapes the kits and redis-ratelimit-exporter, with deploy/prometheus/rules.yml loaded",
                "type": "datasource",
                "pluginId": "prometheus",
                "pluginName": "Prometheus",
            }
        ],
        "__requires": [
            {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.4.0"},
            {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
            {"type": "panel", "id": "timeseries", "name": "Time series", "version": ""},
            {"type": "panel", "id": "stat", "name": "Stat", "version": ""},
        ],
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "description": "redis-ratelimit: decisions, trigger rates, near-limit, limiter latency, fallbacks, breakers, the protection loop and deny events from the kits; per-policy counters, nodes and policy consistency from redis-ratelimit-exporter. Runbook: docs/monitoring.md.",
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": None,
        "links": [],
        "panels": d.panels,
        "refresh": "30s",
        "schemaVersion": 39,
        "tags": ["redis-ratelimit", "rate-limiting"],
        "templating": {
            "list": [
                variable(
                    "job", "Job", "label_values(ratelimit_decisions_total, job)", "Jobs of the kits (the applications)"
                ),
                variable(
                    "instance",
                    "Instance",
                    'label_values(ratelimit_decisions_total{job=~"$job"}, instance)',
                    "Instances of the selected jobs",
                ),
                # The kits' rules and the nodes' policies: a policy no kit
                # counts (kits without metrics, other clients) is still a
                # choice for the server panels. query_result lines read
                # {rule="x"} 1 <time> or {policy="x"} 1 <time>.
                variable(
                    "rule",
                    "Rule",
                    'query_result(group by (rule) (ratelimit_decisions_total{job=~"$job"})'
                    " or group by (policy) (redis_ratelimit_policy_calls_total))",
                    "Rules of the selected jobs and the nodes' policies (a policy rule is the"
                    " policy's name, on the kits' and the server's panels alike)",
                    regex='/^\\{(?:rule|policy)="(.*)"\\}/',
                ),
                variable("node", "Node", "label_values(redis_ratelimit_up, node)", "Redis nodes the exporter scrapes"),
            ]
        },
        "time": {"from": "now-3h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "title": "redis-ratelimit",
        "uid": "redis-ratelimit",
        "version": 1,
        "weekStart": "",
    }


def render():
    return json.dumps(dashboard(), indent=2, sort_keys=False) + "\n"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the file differs from what would be written")
    parser.add_argument("--out", default=os.path.join(here, "redis-ratelimit.json"))
    args = parser.parse_args()
    text = render()
    if args.check:
        try:
            with open(args.out, encoding="utf-8") as f:
                current = f.read()
        except OSError as e:
            print(f"build.py: cannot read {args.out}: {e}")
            return 1
        if current != text:
            print(f"build.py: {args.out} is not what deploy/grafana/build.py writes; run it and commit the result")
            return 1
        print(f"build.py: {args.out} is up to date")
        return 0
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"build.py: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
