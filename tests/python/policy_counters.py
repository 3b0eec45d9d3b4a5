#!/usr/bin/env python3
"""Reads the text of `INFO ratelimit` on stdin with redis-py's own INFO parser
(`parse_info`, what `redis.Redis.info()` returns) and prints, per policy and
sorted by name: the name, percent-decoded, then its calls, admitted, denied,
shadow_denied and peeks. Fails if a policy line does not parse into exactly
those counters and the protection loop's scale and stage. Run by tests/integration/features/observability.rs."""
import sys
import urllib.parse

try:  # redis-py 5 and later
    from redis._parsers.helpers import parse_info
except ImportError:  # redis-py 4
    from redis.client import parse_info

COUNTERS = ["calls", "admitted", "denied", "shadow_denied", "peeks"]
LEVELS = ["scale", "stage"]
PREFIX = "ratelimit_policy_"

info = parse_info(sys.stdin.read())
rows = []
for field, value in info.items():
    if not field.startswith(PREFIX):
        continue
    if not isinstance(value, dict) or sorted(value) != sorted(COUNTERS + LEVELS):
        sys.exit(f"{field}: parsed as {value!r}, not the five counters, scale and stage")
    if not all(isinstance(value[c], int) for c in COUNTERS + LEVELS):
        sys.exit(f"{field}: counters are not integers: {value!r}")
    name = urllib.parse.unquote_to_bytes(field[len(PREFIX):]).decode("ascii")
    rows.append((name, [value[c] for c in COUNTERS]))
if info.get("ratelimit_policies") != len(rows):
    sys.exit(f"ratelimit_policies is {info.get('ratelimit_policies')!r}, {len(rows)} lines")
for name, counts in sorted(rows):
    print(name, *counts)
