#!/usr/bin/python3
"""The demo corpus: the King James Version of the Bible (public domain), read
with the `bible` program of Debian's bible-kjv package (its text is
bible-kjv-text). 66 books, 1,189 chapters, 31,102 verses, ASCII.
"""
import re
import subprocess

_HEADING = re.compile(r"^(\S.*) (\d+)$")
_VERSE = re.compile(r"^\s+(\d+) (.*)$")


def chapters():
    """-> [(book, chapter, [(verse, text), ...]), ...] in canonical order."""
    raw = subprocess.run(["bible", "-l0", "-m", "8000", "gen1:1-rev22:21"], check=True,
                         capture_output=True, text=True).stdout
    out = []
    for line in raw.splitlines():
        if not line.strip():
            continue
        m = _VERSE.match(line)
        if m:
            out[-1][2].append((int(m.group(1)), m.group(2).strip()))
            continue
        m = _HEADING.match(line)
        if not m:
            raise ValueError(f"bible output: unexpected line {line!r}")
        out.append((m.group(1), int(m.group(2)), []))
    n_verses = sum(len(c[2]) for c in out)
    if len(out) != 1189 or n_verses != 31102:
        raise ValueError(f"bible output: {len(out)} chapters and {n_verses} verses, expected 1189 and 31102")
    return out


def chapter_text(c):
    book, ch, verses = c
    return f"{book} {ch}\n\n" + "\n".join(t for _, t in verses) + "\n\n"


def verses(c):
    book, ch, vs = c
    return [(f"{book} {ch}:{v}", t) for v, t in vs]
