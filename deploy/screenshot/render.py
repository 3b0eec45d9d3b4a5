#!/usr/bin/env python3
"""Renders docs/img/dashboard.png: the Grafana dashboard's panels drawn from
recorded series by a real Prometheus.

1. series.py writes three hours of a synthetic roll-out as OpenMetrics, as
   the kits and the exporter would serve them;
2. `promtool tsdb create-blocks-from openmetrics` turns it into TSDB blocks;
3. Debian's `prometheus` serves them on a free local port, and
   `promtool tsdb create-blocks-from rules` backfills the recording rules of
   deploy/prometheus/rules.yml (one pass per level of rules reading rules);
4. every panel target of deploy/grafana/redis-ratelimit.json is queried with
   /api/v1/query_range (variables at "All"), and the panels are drawn with
   matplotlib at their places in the dashboard's grid.

A documentation tool, not a test: it needs matplotlib (pip install
matplotlib; not in scripts/setup.sh) besides prometheus and promtool.

Usage: render.py [--out docs/img/dashboard.png] [--keep DIR]
"""

import argparse
import datetime
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
DEPLOY = os.path.dirname(HERE)
ROOT = os.path.dirname(DEPLOY)
sys.path.insert(0, DEPLOY)
sys.path.insert(0, HERE)
import series  # noqa: E402  (deploy/screenshot/series.py)

from check_dashboard import selectors, substitute  # noqa: E402  (deploy/check_dashboard.py)
from promrules import read_rules  # noqa: E402  (deploy/promrules.py)

STEP_S = 60
GRAFANA = {"green": "#73BF69", "orange": "#FF9830", "red": "#F2495C", "yellow": "#FADE2A"}
PALETTE = ["#73BF69", "#F2CC0C", "#8AB8FF", "#FF780A", "#F2495C", "#5794F2", "#B877D9", "#705DA0", "#37872D", "#FADE2A"]
BG, PANEL_BG, BORDER, TEXT, GRID = "#111217", "#181b1f", "#2c3235", "#ccccdc", "#2c3235"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    def __init__(self, data, work):
        self.data, self.work, self.proc = data, work, None
        self.config = os.path.join(work, "prometheus.yml")
        with open(self.config, "w") as f:
            f.write("global:\n  scrape_interval: 15s\n")

    def start(self):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        log = open(os.path.join(self.work, "prometheus.log"), "a")
        self.proc = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={self.config}",
                f"--storage.tsdb.path={self.data}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=3650d",
                # Imported blocks carry no staleness markers: a short lookback
                # ends a series that stopped (a changed fingerprint) as a scrape would.
                "--query.lookback-delta=30s",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited; see {log.name}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)  # polling for readiness, not timing anything
        raise RuntimeError("prometheus did not become ready in 120 s")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=60)

    def query_range(self, expr, start, end):
        q = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": STEP_S})
        with urllib.request.urlopen(f"{self.url}/api/v1/query_range?{q}", timeout=60) as r:
            body = json.load(r)
        if body.get("status") != "success":
            raise RuntimeError(f"query failed: {expr}: {body}")
        return body["data"]["result"]


def rule_levels(rules):
    """Recording rules by level: level 1 reads only scraped series, level n
    reads a rule of level n - 1."""
    records = [r for r in rules if r["kind"] == "record"]
    names = {r["name"] for r in records}
    level = {}
    while len(level) < len(records):
        for i, r in enumerate(records):
            if i in level:
                continue
            deps = [n for n, _ in selectors(r["expr"]) if n in names]
            dep_levels = [level[j] for j, o in enumerate(records) if o["name"] in deps and j in level]
            if len(dep_levels) == len([j for j, o in enumerate(records) if o["name"] in deps]):
                level[i] = 1 + max(dep_levels, default=0)
    out = {}
    for i, lvl in level.items():
        out.setdefault(lvl, []).append(records[i])
    return [out[k] for k in sorted(out)]


def backfill(prom, work, start, end):
    rules = read_rules(os.path.join(DEPLOY, "prometheus", "rules.yml"))
    for n, level in enumerate(rule_levels(rules), 1):
        path = os.path.join(work, f"rules-{n}.yml")
        group = []
        for r in level:
            rule = {"record": r["name"], "expr": r["expr"]}
            labels = _record_labels(r)
            if labels:
                rule["labels"] = labels
            group.append(rule)
        with open(path, "w") as f:
            json.dump({"groups": [{"name": f"level-{n}", "rules": group}]}, f)
        out = os.path.join(work, f"blocks-{n}")
        subprocess.run(
            [
                "promtool",
                "tsdb",
                "create-blocks-from",
                "rules",
                f"--start={start}",
                f"--end={end}",
                f"--url={prom.url}",
                f"--output-dir={out}",
                "--eval-interval=15s",
                path,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        prom.stop()
        for block in os.listdir(out):
            shutil.move(os.path.join(out, block), os.path.join(prom.data, block))
        prom.start()


def _record_labels(rule):
    """The `labels:` of a recording rule (source: kits|server), read from the
    lines between its `- record:` and its expr."""
    with open(os.path.join(DEPLOY, "prometheus", "rules.yml")) as f:
        lines = f.read().splitlines()
    labels = {}
    for line in lines[rule["decl_line"] : rule["line"] - 1]:
        stripped = line.strip()
        if ":" in stripped and not stripped.startswith(("labels:", "expr:", "#")):
            k, v = stripped.split(":", 1)
            labels[k.strip()] = v.strip()
    return labels


def legend(fmt, metric):
    out = fmt
    for k, v in metric.items():
        out = out.replace("{{" + k + "}}", v).replace("{{ " + k + " }}", v)
    return out or ",".join(f"{k}={v}" for k, v in metric.items()) or "value"


def fmt_value(v, unit, decimals=None):
    if v is None or math.isnan(v):
        return "No data"
    if unit == "percentunit":
        return f"{v * 100:.{1 if decimals is None else decimals}f}%"
    if unit == "percent":
        return f"{v:.0f}%"
    if unit == "s":
        return f"{v * 1000:.{1 if decimals is None else decimals}f} ms"
    if unit in ("reqps", "ops"):
        return f"{v:.1f}/s"
    return f"{v:.{0 if decimals is None else decimals}f}"


def threshold_color(steps, v):
    color = steps[0]["color"]
    for s in steps[1:]:
        if v is not None and not math.isnan(v) and v >= s["value"]:
            color = s["color"]
    return GRAFANA.get(color, color)


def draw(dashboard, results, times, events, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch
    from matplotlib.ticker import FuncFormatter

    panels = dashboard["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    unit_px, width_px = 30, 1800
    fig = plt.figure(figsize=(width_px / 100, (rows * unit_px + 50) / 100), dpi=100, facecolor=BG)
    H = rows * unit_px + 50

    def box(gp):
        left = gp["x"] / 24 + 0.003
        width = gp["w"] / 24 - 0.006
        top = 1 - (50 + gp["y"] * unit_px) / H
        height = gp["h"] * unit_px / H - 0.004
        return left, top - height, width, height

    fig.text(0.006, 1 - 22 / H, "redis-ratelimit", color=TEXT, fontsize=15, weight="bold", va="center")
    fig.text(
        0.994,
        1 - 22 / H,
        f"{times[0]:%Y-%m-%d %H:%M} to {times[-1]:%H:%M} UTC  ·  job=All  instance=All  rule=All  node=All",
        color="#8e8e8e",
        fontsize=9,
        ha="right",
        va="center",
    )
    tfmt = mdates.DateFormatter("%H:%M")
    for p in panels:
        gp = p["gridPos"]
        left, bottom, width, height = box(gp)
        if p["type"] == "row":
            fig.text(left, bottom + height / 2, p["title"], color=TEXT, fontsize=12, weight="bold", va="center")
            continue
        fig.patches.append(
            FancyBboxPatch(
                (left, bottom),
                width,
                height,
                boxstyle="round,pad=0,rounding_size=0.002",
                transform=fig.transFigure,
                facecolor=PANEL_BG,
                edgecolor=BORDER,
                lw=0.8,
                zorder=-2,
            )
        )
        fig.text(
            left + 0.005, bottom + height - 14 / H, p["title"], color=TEXT, fontsize=10, weight="bold", va="center"
        )
        d = p["fieldConfig"]["defaults"]
        unit, steps = d.get("unit"), d["thresholds"]["steps"]
        res = results[p["id"]]
        if p["type"] == "stat":
            vals = []
            for target, rs in res:
                for r in rs:
                    v = [float(x[1]) for x in r["values"]]
                    vals.append((legend(target.get("legendFormat", ""), r["metric"]), v[-1] if v else float("nan")))
            n = max(1, len(vals))
            for k, (name, v) in enumerate(vals or [("", float("nan"))]):
                cw = width / n
                fig.patches.append(
                    FancyBboxPatch(
                        (left + k * cw + 0.004, bottom + 0.004),
                        cw - 0.008,
                        height - 26 / H - 0.004,
                        boxstyle="round,pad=0,rounding_size=0.002",
                        transform=fig.transFigure,
                        facecolor=threshold_color(steps, v),
                        edgecolor="none",
                        zorder=-1,
                    )
                )
                fig.text(
                    left + k * cw + cw / 2,
                    bottom + (height - 26 / H) / 2 + 0.002,
                    fmt_value(v, unit, d.get("decimals")),
                    color="white",
                    fontsize=26,
                    weight="bold",
                    ha="center",
                    va="center",
                )
                if name and n > 1:
                    fig.text(left + k * cw + cw / 2, bottom + 0.012, name, color="white", fontsize=9, ha="center")
            continue
        legend_rows = 2
        ax = fig.add_axes(
            [
                left + 0.035,
                bottom + (legend_rows * 14 + 24) / H,
                width - 0.045,
                height - (legend_rows * 14 + 24 + 30) / H,
            ],
            facecolor=PANEL_BG,
        )
        for s in ax.spines.values():
            s.set_visible(False)
        ax.tick_params(colors="#8e8e8e", labelsize=8, length=0)
        ax.grid(True, color=GRID, lw=0.6)
        ax.xaxis.set_major_formatter(tfmt)
        lines = []
        for target, rs in res:
            for r in rs:
                vals = {
                    datetime.datetime.fromtimestamp(float(t), datetime.timezone.utc): float(v) for t, v in r["values"]
                }
                lines.append(
                    (legend(target.get("legendFormat", ""), r["metric"]), [vals.get(t, float("nan")) for t in times])
                )
        lines.sort(key=lambda x: x[0])
        custom = d.get("custom", {})
        stacked = custom.get("stacking", {}).get("mode") == "normal"
        if stacked and lines:
            ys = [[0 if math.isnan(v) else v for v in y] for _, y in lines]
            ax.stackplot(times, *ys, labels=[n for n, _ in lines], colors=PALETTE[: len(lines)] * 3, alpha=0.75, lw=0)
        else:
            for k, (name, y) in enumerate(lines):
                ax.plot(times, y, color=PALETTE[k % len(PALETTE)], lw=1.3, label=name)
                ax.fill_between(times, y, color=PALETTE[k % len(PALETTE)], alpha=0.06)
        if custom.get("thresholdsStyle", {}).get("mode") == "line":
            for s in steps[1:]:
                ax.axhline(s["value"], color=GRAFANA.get(s["color"], s["color"]), lw=1, ls="--")
        lo, hi = d.get("min"), d.get("max")
        if lo is not None or hi is not None:
            cur = ax.get_ylim()
            ax.set_ylim(lo if lo is not None else cur[0], hi if hi is not None else max(cur[1], 1e-9))
        ax.yaxis.set_major_formatter(
            FuncFormatter(
                lambda v, _, u=unit: (
                    fmt_value(v, u, 0 if u != "s" else 0) if u in ("percentunit", "percent", "s") else f"{v:g}"
                )
            )
        )
        ax.set_xlim(times[0], times[-1])
        for k, (when, note) in enumerate(events):
            if times[0] <= when <= times[-1]:
                ax.axvline(when, color="#5794F2", lw=0.8, ls=":", alpha=0.8)
                if p["title"] in ("Trigger rate per rule", "Shadow denials ratio"):
                    ax.text(
                        when,
                        1.0 - 0.09 * (k % 2),
                        " " + note,
                        transform=ax.get_xaxis_transform(),
                        color="#8AB8FF",
                        fontsize=7,
                        va="top",
                    )
        if not lines:
            ax.text(0.5, 0.5, "No data", color="#8e8e8e", transform=ax.transAxes, ha="center")
        else:
            ncol = max(1, min(len(lines), int(gp["w"] / 3)))
            ax.legend(
                loc="upper left",
                bbox_to_anchor=(-0.02, -0.09),
                ncol=ncol,
                frameon=False,
                fontsize=7.5,
                labelcolor=TEXT,
                handlelength=1.2,
                columnspacing=1.0,
            )
    fig.savefig(out, facecolor=BG)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "img", "dashboard.png"))
    parser.add_argument("--keep", help="keep the work folder (TSDB, logs) here instead of a temporary one")
    args = parser.parse_args()
    for tool in ("prometheus", "promtool"):
        if not shutil.which(tool):
            parser.error(f"{tool} not found (Debian's prometheus package)")
    with open(os.path.join(DEPLOY, "grafana", "redis-ratelimit.json")) as f:
        dashboard = json.load(f)
    work = args.keep or tempfile.mkdtemp(prefix="deploy-screenshot-")
    os.makedirs(work, exist_ok=True)
    end = int(time.time()) // 60 * 60 - 300
    start = end - series.MINUTES * 60
    om = os.path.join(work, "series.om")
    with open(om, "w") as f:
        f.write(series.generate(start))
    data = os.path.join(work, "data")
    subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", om, data], check=True, stdout=subprocess.DEVNULL
    )
    prom = Prometheus(data, work)
    prom.start()
    try:
        backfill(prom, work, start, end)
        q_start = start + 10 * 60
        results = {}
        for p in dashboard["panels"]:
            if p["type"] == "row":
                continue
            results[p["id"]] = [
                (t, prom.query_range(substitute(t["expr"]).replace('"x"', '".*"'), q_start, end)) for t in p["targets"]
            ]
    finally:
        prom.stop()
    times = [datetime.datetime.fromtimestamp(t, datetime.timezone.utc) for t in range(q_start, end + 1, STEP_S)]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    events = [
        (datetime.datetime.fromtimestamp(start + m * 60, datetime.timezone.utc), note) for m, note in series.EVENTS
    ]
    draw(dashboard, results, times, events, args.out)
    empty = [
        p["title"] for p in dashboard["panels"] if p["type"] != "row" and not any(rs for _, rs in results[p["id"]])
    ]
    print(f"render.py: wrote {args.out}" + (f"; panels without data: {', '.join(empty)}" if empty else ""))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
