"""The page's own CSS and JavaScript, inlined into viewer.html (no CDN, works from file://).

They live as real files in `static/` (so editors and linters see JS and CSS) and ship as
package data; `html.py` inlines them and allows exactly these texts by hash in the CSP.

The script treats every string in the data as untrusted model text: it only ever sets
`textContent` or creates text nodes, never `innerHTML`, and builds no URL from data.
"""

from __future__ import annotations

from importlib.resources import files


def _static(name: str) -> str:
    return (files("starpo.viewer") / "static" / name).read_text(encoding="utf-8")


# Read once at import: the CSP hashes and every page must see the same text.
CSS = _static("viewer.css")
JS = _static("viewer.js")
