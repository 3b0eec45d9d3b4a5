"""Denials remembered in process, in front of Redis (as the Rust kit's
`deny_cache.rs`)."""

from __future__ import annotations

import dataclasses

from .decision import Decision


class DenyCache:
    """Denials remembered in process for `min(wait_ms, max)`; bounded."""

    def __init__(self, max_s: float = 1.0, max_entries: int = 10_000) -> None:
        self.max_s = max_s
        self.max_entries = max_entries
        self._entries: dict[tuple[str, str], tuple[float, float, Decision]] = {}

    def get(self, rule: str, key: str, now: float) -> Decision | None:
        hit = self._entries.get((rule, key))
        if hit is None:
            return None
        stored, until, d = hit
        if now >= until:
            del self._entries[(rule, key)]
            return None
        # wait_ms and reset_ms count down, so Retry-After does.
        elapsed = int((now - stored) * 1000)
        return dataclasses.replace(
            d, wait_ms=max(d.wait_ms - elapsed, 1), reset_ms=max(d.reset_ms - elapsed, 0)
        )

    def put(self, rule: str, key: str, d: Decision, now: float) -> None:
        if d.wait_ms <= 0 or self.max_s <= 0:
            return
        if len(self._entries) >= self.max_entries:
            self._entries = {k: v for k, v in self._entries.items() if v[1] > now}
            if len(self._entries) >= self.max_entries:
                del self._entries[min(self._entries, key=lambda k: self._entries[k][1])]
        self._entries[(rule, key)] = (now, now + min(d.wait_ms / 1000.0, self.max_s), d)

    def __len__(self) -> int:
        return len(self._entries)
