"""Bounded text of untrusted values (``xbench.core.summary``): error messages and reports never walk a whole
structure read from a file, and control / bidi characters are shown, never applied. On 5da1164 there was no such
helper: ``{pid!r:.80}`` built the whole text of a 2**60-leaf tuple before cutting it."""
from __future__ import annotations

import time

from xbench.core.summary import brief, visible


def test_brief_and_visible_are_bounded():
    t = (1,)
    for _ in range(80):
        t = (t, t)
    t0 = time.perf_counter()
    assert len(brief(t)) <= 80 and len(brief({"k": [t] * 10**6})) <= 80 and len(brief(10**100000)) < 40
    assert time.perf_counter() - t0 < 0.5
    assert visible("a\u202eb\x00c\nd") == "a\\u202eb\\u0000c\\u000ad"
    assert visible("plain text, ünïcode") == "plain text, ünïcode"
