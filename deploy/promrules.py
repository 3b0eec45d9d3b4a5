"""Read the rules of a Prometheus rules file without a YAML library.

deploy/check_dashboard.py and deploy/prometheus/mutate.py use python3's
standard library only, which has no YAML parser, so this reads the subset of
YAML that deploy/prometheus/rules.yml is written in (and fails loudly on
anything else):

- a rule starts with a line `- record: NAME` or `- alert: NAME`;
- its `expr:` is on one line (plain, or in double or single quotes) or a
  block scalar (`expr: |` or `expr: >`, with the `-` or `+` chomping
  indicators) whose lines are indented deeper than the `expr:` key.

Each rule comes back with the span of its expression in the file's text, so
a mutation can replace exactly that text. promtool check rules is the
authority on the file's validity; this only finds the rules.
"""

import re

_RULE = re.compile(r"^(\s*)-\s+(record|alert):\s*(\S.*?)\s*$")
_EXPR = re.compile(r"^(\s*)expr:\s*(.*?)\s*$")


class RulesFileError(Exception):
    """The rules file is outside the subset this module reads."""


def _unquote(value, path, lineno):
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        inner = value[1:-1]
        if value[0] == "'":
            return inner.replace("''", "'")
        if "\\" in inner:
            raise RulesFileError(
                f"{path}:{lineno}: escapes in a double-quoted expr are not supported; use a block scalar (expr: |)"
            )
        return inner
    if value[:1] in "\"'":
        raise RulesFileError(f"{path}:{lineno}: an expr in quotes must close on the same line")
    return value


def read_rules(path):
    """List the rules of `path`: dicts with kind ('record' or 'alert'), name,
    expr, line (1-based, of the expr), and start/end (offsets of the
    expression's text in the file, for an in-place edit)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    lines = text.splitlines(keepends=True)
    offsets = []
    pos = 0
    for line in lines:
        offsets.append(pos)
        pos += len(line)
    rules = []
    current = None
    i = 0
    while i < len(lines):
        line = lines[i].rstrip("\r\n")
        m = _RULE.match(line)
        if m:
            if current is not None and "expr" not in current:
                raise RulesFileError(f"{path}:{current['decl_line']}: {current['kind']} {current['name']} has no expr")
            current = {"kind": m.group(2), "name": _unquote(m.group(3), path, i + 1), "decl_line": i + 1}
            rules.append(current)
            i += 1
            continue
        m = _EXPR.match(line)
        if m and current is not None and "expr" not in current:
            indent, value = len(m.group(1)), m.group(2)
            if value[:1] in "|>":
                if not re.fullmatch(r"[|>][-+]?", value):
                    raise RulesFileError(f"{path}:{i + 1}: unsupported block scalar header {value!r}")
                j = i + 1
                body = []
                while j < len(lines):
                    raw = lines[j].rstrip("\r\n")
                    if raw.strip() and len(raw) - len(raw.lstrip(" ")) <= indent:
                        break
                    body.append(raw)
                    j += 1
                while body and not body[-1].strip():
                    body.pop()
                if not body:
                    raise RulesFileError(f"{path}:{i + 1}: empty expr")
                cut = min(len(b) - len(b.lstrip(" ")) for b in body if b.strip())
                expr = "\n".join(b[cut:] for b in body)
                if value[0] == ">":
                    expr = " ".join(b.strip() for b in body)
                start = offsets[i + 1]
                end = offsets[i + len(body)] + len(lines[i + len(body)].rstrip("\r\n"))
                current.update(expr=expr, line=i + 2, start=start, end=end)
                i = j
                continue
            if not value:
                raise RulesFileError(f"{path}:{i + 1}: expr: with nothing after it")
            expr = _unquote(value, path, i + 1)
            start = offsets[i] + line.index(value, len(m.group(1)) + len("expr:"))
            current.update(expr=expr, line=i + 1, start=start, end=start + len(value))
        i += 1
    if current is not None and "expr" not in current:
        raise RulesFileError(f"{path}:{current['decl_line']}: {current['kind']} {current['name']} has no expr")
    if not rules:
        raise RulesFileError(f"{path}: no `- record:` or `- alert:` rule found")
    return rules
