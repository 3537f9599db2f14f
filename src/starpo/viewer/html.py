"""Assemble the self-contained viewer page: data as inert JSON, the page's own script.

Security model (all model text is untrusted):
- the data sits in `<script type="application/json">`, escaped by `json_for_script`, so
  text like `</script>` cannot end the element; the browser never executes that element;
- the page's script renders data only through `textContent` and text nodes;
- a Content-Security-Policy meta tag allows exactly the page's own script and style, by
  SHA-256 hash (no 'unsafe-inline'), and no remote loads of any kind (`default-src
  'none'`), so even an injected `<script>` or `<img>` could not run or phone home.
"""

from __future__ import annotations

import base64
import hashlib
import html
from pathlib import Path
from typing import Any

from starpo.logs import warn
from starpo.runs import VIEWER_FILE
from starpo.viewer.assets import CSS, JS
from starpo.viewer.data import MAX_EPISODES_PER_SOURCE, display_model, json_for_script

_BODY = """<header>
<h1 id="title"></h1>
<button data-tab="episodes">Episodes</button>
<button data-tab="seeds">Same seed across steps</button>
<button data-tab="metrics">Metrics</button>
<button data-tab="summary" id="tab-button-summary">Eval summary</button>
</header>
<div class="warnings" id="warnings" hidden></div>
<section id="tab-episodes">
<div class="controls">
<label>Source <select id="source"></select></label>
<label>Outcome <select id="outcome"><option value="all">all</option>
<option value="success">success</option><option value="failure">failure</option></select></label>
<label>Env <select id="env"></select></label>
<button id="prev" title="previous episode (left arrow)">&#9664; prev</button>
<span id="position"></span>
<button id="next" title="next episode (right arrow)">next &#9654;</button>
</div>
<p class="note" id="source-note"></p>
<div id="episode"></div>
</section>
<section id="tab-seeds" hidden>
<div class="controls">
<label>Source <select id="seed-kind"></select></label>
<label>Seed <select id="seed"></select></label>
<span class="note">each column is one step; every rollout of that seed is shown</span>
</div>
<div class="columns" id="seed-columns"></div>
</section>
<section id="tab-metrics" hidden>
<div class="picker" id="metric-picker"></div>
<div id="charts"></div>
<h4>Alerts (dashed lines: orange warning, red critical)</h4>
<ul id="alerts"></ul>
</section>
<section id="tab-summary" hidden><pre id="summary"></pre></section>
"""


def _sha256(text: str) -> str:
    """The CSP source expression for an inline element whose content is `text`."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode("ascii") + "'"


def content_security_policy() -> str:
    """The page's CSP: its own script and style by hash, nothing remote, no forms."""
    return (
        f"default-src 'none'; script-src {_sha256(JS)}; style-src {_sha256(CSS)}; "
        "img-src 'none'; connect-src 'none'; base-uri 'none'; form-action 'none'"
    )


def render_page(model: dict[str, Any]) -> str:
    """The full HTML text of the viewer for a display model from `display_model`."""
    title = html.escape(f"starpo viewer · {model.get('run', '')}")
    return (
        '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{content_security_policy()}">\n'
        f"<title>{title}</title>\n<style>{CSS}</style>\n</head>\n<body>\n{_BODY}"
        f'<script type="application/json" id="data">{json_for_script(model)}</script>\n'
        f"<script>{JS}</script>\n</body>\n</html>\n"
    )


def build_viewer(
    run_dir: Path, out: Path | None = None, cap: int = MAX_EPISODES_PER_SOURCE
) -> Path:
    """Write the viewer page for a run or eval folder; return its path.

    `out` defaults to `run_dir/viewer.html`. Raises `UserError` when the folder has no
    trajectory file. Lines skipped while reading are listed on the page and, one
    `warning:` line each, on stderr.
    """
    run_dir = Path(run_dir)
    model = display_model(run_dir, cap=cap)
    for message in model["warnings"]:
        warn(message, "starpo.viewer")
    target = Path(out) if out is not None else run_dir / VIEWER_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    # errors="replace": a lone surrogate in model text must not abort the whole page.
    target.write_bytes(render_page(model).encode("utf-8", errors="replace"))
    return target
