#!/usr/bin/env python3
"""Admitted and denied requests over time, per algorithm, under one bursty load.

Starts its own redis-server with the module on a free loopback port, replays
a fixed arrival schedule in real time against the five limiters at once (every
arrival is sent to all five, in one pipelined write, with the server's TIME
first), and draws one SVG timeline per algorithm into docs/img/:

    python3 bench/trace.py                                  # about 12 s
    python3 bench/trace.py --json docs/img/trace.json       # and keep the data
    python3 bench/trace.py --from-json docs/img/trace.json  # redraw, no server
    python3 bench/trace.py --out /tmp/img                   # elsewhere

Needs python3 (standard library only) and redis-server on PATH (or
REDIS_SERVER); the module is RL_MODULE or target/release/libredis_ratelimit.so
(`cargo build --release`). It prints a summary table to stdout.

The load, the same for every algorithm: a steady trickle of 3 requests a
second from t = 0, plus a burst of 30 requests (10 ms apart, 0.3 s) every 2 s
from t = 0.85 s, for 10 s: 180 requests. t = 0 is a whole second of the Unix
clock, so fixed windows of 1 s start at every whole t, and every burst
straddles one of those boundaries. Every limiter gets about 5 per second.
"""

import argparse
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DURATION_S = 10.0
TRICKLE_PER_S = 3
BURST_SIZE = 30
BURST_GAP_S = 0.010
BURST_EVERY_S = 2.0
BURST_FIRST_S = 0.85

# name, command words after the key, one-line description, file name
LIMITERS = [
    ("RL.TOKENBUCKET", ["5", "5", "1000"], "bursts up to 5, refilled at 5 a second", "tokenbucket"),
    ("RL.LEAKYBUCKET", ["5", "5", "1000"], "queue of 5, served at 5 a second (one every 200 ms)", "leakybucket"),
    ("RL.FIXEDWINDOW", ["5", "1000"], "5 per aligned second", "fixedwindow"),
    ("RL.SLIDING", ["5", "1000"], "5 in any 1 s, exact log", "sliding"),
    ("RL.HASHWINDOW", ["5", "1000", "100"], "5 a second, counted in buckets of 100 ms", "hashwindow"),
]
LIMIT = 5
# Counting windows: 1 s less 1 ms. A request's time is the server's TIME read
# just before its command in the same pipeline, some microseconds before the
# limiter reads the clock, and wait_ms is rounded to the millisecond, so two
# events exactly 1 s apart for the limiter may look a few microseconds closer.
WINDOW_S = 0.999


def schedule():
    """Arrival offsets in seconds from t = 0, sorted."""
    arrivals = [k / TRICKLE_PER_S for k in range(int(DURATION_S * TRICKLE_PER_S))]
    start = BURST_FIRST_S
    while start < DURATION_S:
        arrivals += [start + i * BURST_GAP_S for i in range(BURST_SIZE)]
        start += BURST_EVERY_S
    return sorted(round(a, 6) for a in arrivals)


# --- a minimal RESP client ---------------------------------------------------


class Resp:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.file = self.sock.makefile("rb")

    @staticmethod
    def encode(words):
        out = [b"*%d\r\n" % len(words)]
        for w in words:
            w = w if isinstance(w, bytes) else str(w).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(w), w))
        return b"".join(out)

    def read(self):
        line = self.file.readline()
        if not line:
            raise ConnectionError("server closed the connection")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.file.read(n + 2)[:-2]
            return data.decode()
        if kind == b"*":
            return [self.read() for _ in range(int(rest))]
        raise RuntimeError("unexpected reply %r" % line)

    def pipeline(self, commands):
        self.sock.sendall(b"".join(self.encode(c) for c in commands))
        return [self.read() for _ in commands]

    def call(self, *words):
        return self.pipeline([list(words)])[0]

    def close(self):
        self.file.close()
        self.sock.close()


# --- the server --------------------------------------------------------------


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(server, module, workdir):
    for _ in range(5):
        port = free_port()
        log = os.path.join(workdir, "redis.log")
        proc = subprocess.Popen(
            [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", workdir, "--logfile", log,
             "--loadmodule", module],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(50):
            try:
                client = Resp(port)
                if client.call("PING") == "PONG":
                    return proc, client
            except (ConnectionError, OSError):
                pass
            if proc.poll() is not None:
                break
            time.sleep(0.1)
        proc.kill()
        proc.wait()
        with open(log, errors="replace") as f:
            text = f.read()
        if "Address already in use" not in text:
            sys.exit("trace: redis-server did not start; its log ends with:\n" + text[-600:])
    sys.exit("trace: no free port found")


# --- the run -----------------------------------------------------------------


def replay(client, arrivals):
    """Sends every arrival to every limiter; returns per-limiter lists of
    (t, allowed, wait_ms) with t in seconds of the server's clock from t = 0."""
    keys = ["trace:" + file for _, _, _, file in LIMITERS]
    # t = 0 is a whole second of the wall clock at least 1 s from now.
    t0 = math.floor(time.time()) + 2
    results = {file: [] for _, _, _, file in LIMITERS}
    for offset in arrivals:
        while True:
            left = t0 + offset - time.time()
            if left <= 0:
                break
            time.sleep(min(left, 0.002) if left > 0.003 else 0)
        commands = [["TIME"]] + [[name, key] + params for (name, params, _, _), key in zip(LIMITERS, keys)]
        replies = client.pipeline(commands)
        seconds, micros = replies[0]
        t = int(seconds) - t0 + int(micros) / 1e6
        for (_, _, _, file), reply in zip(LIMITERS, replies[1:]):
            allowed, _limit, _remaining, wait_ms, _reset_ms = reply
            results[file].append((t, allowed == 1, wait_ms))
    return results


def most_in_any_window(times, width=WINDOW_S):
    """Most events in any interval [t, t + width]."""
    times = sorted(times)
    best, j = 0, 0
    for i in range(len(times)):
        while times[i] - times[j] > width:
            j += 1
        best = max(best, i - j + 1)
    return best


# --- SVG ---------------------------------------------------------------------

GREEN, RED, BLUE, GREY, TEXT, MUTED = "#2e9e44", "#d7301f", "#2b6cb0", "#dddddd", "#222222", "#555555"
WIDTH, LEFT, RIGHT = 980, 44, 24
BIN_S = 0.1
STEP_S = 0.02  # resolution of the "in the last second" curves
PITCH = 7  # px between stacked dots
RADIUS = 3

# What each picture shows, in a line under its title.
NOTES = {
    "tokenbucket": "A full bucket lets the first 5 of a burst through, then one every 200 ms as tokens come back; "
                   "the trickle between bursts refills it.",
    "leakybucket": "Admitted requests are not sent on at once: each waits wait_ms, so they act one every 200 ms; "
                   "the queue holds 1 s of work, the rest is denied.",
    "fixedwindow": "Grid lines are the windows (aligned on the Unix second): 5 per window, so a burst across a "
                   "boundary gets up to 5 on each side.",
    "sliding": "An exact log: never more than 5 in any second, whatever the alignment; "
               "a unit frees its place exactly 1 s after it was admitted.",
    "hashwindow": "Sums the 11 buckets of 100 ms that the last second touches: fixed memory, but a unit may "
                  "count up to 100 ms too long.",
}


def esc(text):
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class Svg:
    def __init__(self):
        self.parts = []

    def add(self, s):
        self.parts.append(s)

    def text(self, x, y, s, size=12, anchor="start", weight="normal", fill=TEXT):
        self.add('<text x="%.1f" y="%.1f" font-size="%d" text-anchor="%s" font-weight="%s" fill="%s">%s</text>'
                 % (x, y, size, anchor, weight, fill, esc(s)))

    def line(self, x1, y1, x2, y2, stroke=GREY, width=1, dash=None, opacity=1.0):
        self.add('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="%s"%s%s/>'
                 % (x1, y1, x2, y2, stroke, width,
                    ' stroke-dasharray="%s"' % dash if dash else "",
                    ' stroke-opacity="%s"' % opacity if opacity < 1 else ""))

    def dot(self, x, y, fill):
        self.add('<circle cx="%.1f" cy="%.1f" r="%d" fill="%s"/>' % (x, y, RADIUS, fill))

    def render(self, height):
        head = ('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
                'font-family="DejaVu Sans, Helvetica, Arial, sans-serif">\n'
                '<rect width="100%%" height="100%%" fill="#ffffff"/>\n' % (WIDTH, height, WIDTH, height))
        return head + "\n".join(self.parts) + "\n</svg>\n"


def in_last_window(times, xmax):
    """Per STEP_S slot from 0 to xmax: the most events found in [t - WINDOW_S, t]
    for any t in the slot (the curve's upper envelope: what a bound is about)."""
    times = sorted(times)
    slots = []
    for k in range(int(round(xmax / STEP_S))):
        lo, hi = k * STEP_S, (k + 1) * STEP_S
        # Candidate ends: the slot's start and every event inside the slot.
        ends = [lo] + [t for t in times if lo <= t < hi]
        slots.append(max(sum(1 for u in times if e - WINDOW_S <= u <= e) for e in ends))
    return slots


def draw(name, params, description, records, xmax, count_max, leaky, note):
    arrivals = len(records)
    admitted = [t for t, ok, _ in records if ok]
    acts = [t + w / 1000 for t, ok, w in records if ok]
    plot_w = WIDTH - LEFT - RIGHT

    def x_of(t):
        return LEFT + t / xmax * plot_w

    svg = Svg()
    svg.add('<text x="%d" y="24" fill="%s"><tspan font-size="16" font-weight="bold">%s</tspan>'
            '<tspan dx="12" font-size="14" fill="%s">%s</tspan></text>'
            % (LEFT, TEXT, esc("%s key %s" % (name, " ".join(params))), MUTED, esc(description)))
    svg.text(LEFT, 44, note, size=12, fill=MUTED)
    summary = "admitted %d of %d, denied %d; most admitted in any 1 s: %d" % (
        len(admitted), arrivals, arrivals - len(admitted), most_in_any_window(admitted))
    if leaky:
        summary += "; most acting in any 1 s: %d; longest wait: %d ms" % (
            most_in_any_window(acts), max((w for _, ok, w in records if ok), default=0))
    svg.text(LEFT, 62, summary, size=12, weight="bold")

    # Panel A: every request, stacked per 100 ms bin in arrival order.
    bins = {}
    for t, ok, _ in records:
        bins.setdefault(int(t / BIN_S), []).append((t, ok))
    stack_max = max(len(v) for v in bins.values())
    a_title = 88
    a_top = a_title + 8
    a_base = a_top + stack_max * PITCH + 4
    positions = {}
    for b, items in bins.items():
        for i, (t, ok) in enumerate(sorted(items)):
            positions[t] = (x_of((b + 0.5) * BIN_S), a_base - RADIUS - 1 - i * PITCH)
    svg.text(LEFT, a_title, "Requests, per 100 ms (the earliest at the bottom)", size=12, weight="bold")
    bottom = a_base

    # Leaky bucket: a lane of actions (arrival + wait_ms) under the requests.
    if leaky:
        lane = a_base + 64
        svg.text(LEFT, lane + 26, "When each admitted request acts: its arrival + wait_ms", size=12, weight="bold")
        bottom = lane + 26

    # Panel B: admitted (or acting) in the last second.
    b_title = bottom + 34
    b_top = b_title + 10
    b_h = 100
    b_base = b_top + b_h

    def y_of(c):
        return b_base - c / count_max * b_h

    # Grid: a vertical line per second (the fixed windows' boundaries).
    for sec in range(int(xmax) + 1):
        svg.line(x_of(sec), a_top - 2, x_of(sec), a_base, stroke=GREY)
        if leaky:
            svg.line(x_of(sec), a_base, x_of(sec), lane + 6, stroke=GREY)
        svg.line(x_of(sec), b_top, x_of(sec), b_base, stroke=GREY)
        svg.text(x_of(sec), b_base + 16, "%d s" % sec, size=11, anchor="middle", fill=MUTED)

    if leaky:
        for t, ok, w in records:
            if ok:
                ax, ay = positions[t]
                svg.line(ax, ay, x_of(t + w / 1000), lane, stroke=BLUE, width=0.8, opacity=0.4)
        for t in acts:
            svg.dot(x_of(t), lane, BLUE)
        svg.line(LEFT, lane + 6, WIDTH - RIGHT, lane + 6, stroke="#999999")
    for items in bins.values():
        for t, ok in items:
            cx, cy = positions[t]
            svg.dot(cx, cy, GREEN if ok else RED)
    svg.line(LEFT, a_base, WIDTH - RIGHT, a_base, stroke="#999999")

    title = "Acting in the last second (dashed: admitted)" if leaky else "Admitted in the last second"
    svg.text(LEFT, b_title, title, size=12, weight="bold")
    for c in range(0, int(count_max) + 1, 5):
        svg.line(LEFT - 4, y_of(c), LEFT, y_of(c), stroke="#999999")
        svg.text(LEFT - 7, y_of(c) + 4, str(c), size=11, anchor="end", fill=MUTED)
    svg.line(LEFT, b_top, LEFT, b_base, stroke="#999999")
    svg.line(LEFT, b_base, WIDTH - RIGHT, b_base, stroke="#999999")
    svg.line(LEFT, y_of(LIMIT), WIDTH - RIGHT, y_of(LIMIT), stroke="#444444", dash="5,4")
    svg.text(LEFT + 6, y_of(LIMIT) + 13, "limit 5/s", size=11, fill="#444444")

    def curve(times, colour, width, dash=None):
        coords = []
        for k, c in enumerate(in_last_window(times, xmax)):
            coords.append("%.1f,%.1f" % (x_of(k * STEP_S), y_of(c)))
            coords.append("%.1f,%.1f" % (x_of((k + 1) * STEP_S), y_of(c)))
        svg.add('<polyline points="%s" fill="none" stroke="%s" stroke-width="%s" stroke-linejoin="round"%s/>'
                % (" ".join(coords), colour, width, ' stroke-dasharray="%s"' % dash if dash else ""))

    if leaky:
        curve(admitted, GREEN, 1.2, dash="3,3")
        curve(acts, BLUE, 2)
    else:
        curve(admitted, GREEN, 2)

    # Legend.
    ly = b_base + 42
    x = LEFT
    legend = [(GREEN, "admitted"), (RED, "denied")]
    if leaky:
        legend.append((BLUE, "acts"))
    for colour, text in legend:
        svg.dot(x + 4, ly - 4, colour)
        svg.text(x + 12, ly, text, size=12)
        x += 30 + 7 * len(text)
    svg.text(WIDTH - RIGHT, ly, "load: 3 a second, plus 30 in 0.3 s every 2 s (180 requests)",
             size=11, anchor="end", fill=MUTED)
    return svg.render(ly + 14)


def run(args):
    if not os.path.isfile(args.module):
        sys.exit("trace: module %s is missing; run 'cargo build --release'" % args.module)
    server = shutil.which(args.server)
    if not server:
        sys.exit("trace: %s not found (Debian: apt-get install redis-server)" % args.server)

    arrivals = schedule()
    workdir = tempfile.mkdtemp(prefix="rl-trace.")
    proc = None
    try:
        proc, client = start_server(server, args.module, workdir)
        for name, params, _, file in LIMITERS:  # every command is there
            try:
                client.call(name, "trace:probe:" + file, *params, "COST", "0")
            except RuntimeError as e:
                sys.exit("trace: %s does not work with this module: %s" % (name, e))
        print("trace: replaying %d arrivals over %.0f s against %d limiters"
              % (len(arrivals), DURATION_S, len(LIMITERS)), file=sys.stderr)
        results = replay(client, arrivals)
        client.close()
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--module", default=os.environ.get(
        "RL_MODULE", os.path.join(ROOT, "target", "release", "libredis_ratelimit.so")),
        help="the module to load (default: $RL_MODULE or target/release/libredis_ratelimit.so)")
    parser.add_argument("--server", default=os.environ.get("REDIS_SERVER", "redis-server"),
                        help="redis-server or valkey-server to start (default: $REDIS_SERVER or redis-server)")
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "img"),
                        help="where the SVGs go (default: docs/img)")
    parser.add_argument("--json", metavar="FILE",
                        help="also write the raw trace: per command, a list of [t_s, allowed, wait_ms]")
    parser.add_argument("--from-json", metavar="FILE",
                        help="draw from a trace written by --json instead of running one")
    args = parser.parse_args()

    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        results = {file: [tuple(r) for r in saved[name]] for name, _, _, file in LIMITERS}
    else:
        results = run(args)

    # Common scales, so the pictures compare.
    xmax = DURATION_S
    counts = []
    for _, _, _, file in LIMITERS:
        records = results[file]
        xmax = max(xmax, max(t + w / 1000 for t, ok, w in records if ok) + 0.2)
        admitted = [t for t, ok, _ in records if ok]
        counts.append(most_in_any_window(admitted))
    xmax = math.ceil(xmax * 2) / 2
    count_max = max(10, math.ceil((max(counts) + 1) / 5) * 5)

    os.makedirs(args.out, exist_ok=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({name: [[round(t, 6), ok, w] for t, ok, w in results[file]]
                       for name, _, _, file in LIMITERS}, f, separators=(",", ":"))
            f.write("\n")
    print("%-16s %-20s %9s %7s %19s" % ("command", "parameters", "admitted", "denied", "most in any 1 s"))
    for name, params, description, file in LIMITERS:
        records = results[file]
        leaky = file == "leakybucket"
        path = os.path.join(args.out, "trace-%s.svg" % file)
        with open(path, "w") as f:
            f.write(draw(name, params, description, records, xmax, count_max, leaky, NOTES[file]))
        admitted = [t for t, ok, _ in records if ok]
        most = "%d" % most_in_any_window(admitted)
        if leaky:
            acts = [t + w / 1000 for t, ok, w in records if ok]
            most += " (acting: %d)" % most_in_any_window(acts)
        print("%-16s %-20s %9d %7d %19s" % (name, " ".join(params), len(admitted),
                                            len(records) - len(admitted), most))
        print("trace: wrote %s" % os.path.relpath(path), file=sys.stderr)


if __name__ == "__main__":
    main()
