"""The README and the documentation pages: their links lead somewhere, and every `starpo`
command they show parses with today's flags (a renamed flag fails here, not for a reader).
The site itself is built by `make test` with `mkdocs build --strict` (links and anchors
between pages)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def shell_commands(text: str) -> list[str]:
    """The commands of a page's ```bash blocks, continuation lines joined, comments cut."""
    commands: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split(" #")[0].strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def starpo_commands() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for command in shell_commands(page.read_text()):
            if command.startswith("starpo "):
                found.append((page.relative_to(ROOT).as_posix(), command))
    return found


def test_the_readme_is_short_and_links_every_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    linked = {target.split("#")[0] for target in LINK.findall(readme)}
    pages = {p.relative_to(ROOT).as_posix() for p in PAGES[1:]}
    missing = sorted(p for p in pages if p not in linked and not p.startswith("docs/results/"))
    assert not missing, f"README links none of: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_lead_to_files(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        path = target.split("#")[0]
        if not path or re.match(r"[a-z]+:", path):
            continue  # an anchor on the page, or a URL
        if not (page.parent / path).exists():
            broken.append(target)
    assert not broken, f"{page.name} links to missing files: {broken}"


def test_the_pages_show_starpo_commands():
    pages = {page for page, _ in starpo_commands()}
    assert {"README.md", "docs/training.md", "docs/getting-started.md"} <= pages


@pytest.mark.parametrize("page, command", starpo_commands())
def test_every_shown_starpo_command_parses(page, command):
    from starpo.cli import parse_args

    argv = shlex.split(command)[1:]
    try:
        args = parse_args(argv)
    except SystemExit as exc:  # --help prints and exits 0; a refused flag exits 2
        assert exc.code == 0, f"{page}: `{command}` is refused by today's parser"
        return
    assert callable(args.func)
    if args.command in ("train", "plan") and args.config is not None:
        from starpo.config import load_config, presets

        if args.config in presets():  # the overrides name real keys with valid values
            load_config(args.config, args.overrides)
