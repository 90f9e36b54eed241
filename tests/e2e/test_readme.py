"""The README and docs/ cannot drift from the code: the config table, the commands, the links."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

from attn_mt.cli import app
from attn_mt.config.schema import config_keys

sys.path.insert(0, str(REPO / "scripts"))

import config_table  # noqa: E402

README = (REPO / "README.md").read_text(encoding="utf-8")
CONFIG_DOC = config_table.CONFIG_DOC.read_text(encoding="utf-8")
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_config_table_is_the_generated_one() -> None:
    assert config_table.with_table(CONFIG_DOC) == CONFIG_DOC, (
        "docs/config.md's config table is stale: run `python scripts/config_table.py --write`"
    )


def test_config_table_lists_every_key_once() -> None:
    block = CONFIG_DOC.split(config_table.START)[1].split(config_table.END)[0]
    listed = re.findall(r"^\| `([a-z0-9_.]+)` \|", block, flags=re.M)
    assert listed == [path for path, *_ in config_keys()]


def test_every_key_has_a_meaning() -> None:
    assert [path for path, _, _, meaning in config_keys() if not meaning.strip()] == []


COMMANDS = sorted(
    {c.name or c.callback.__name__ for c in app.registered_commands}
    | {g.name for g in app.registered_groups}
)


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_every_command_is_shown(command: str) -> None:
    assert re.search(rf"attn-mt {command}\b", README), f"README never shows `attn-mt {command}`"


def relative_links(page: Path) -> list[str]:
    """The targets of the page's Markdown links that are not URLs or in-page anchors."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:|#", t)]


def anchors(page: Path) -> set[str]:
    """The in-page anchors of a Markdown page's headings, as GitHub makes them."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    headings = re.findall(r"^#+ (.+)$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_points_to_a_file(page: Path) -> None:
    broken = []
    for target in relative_links(page):
        file, _, anchor = target.partition("#")
        linked = page.parent / file
        if not linked.exists() or (anchor and anchor not in anchors(linked)):
            broken.append(target)
    assert broken == [], f"{page.relative_to(REPO)} links to missing files or headings: {broken}"


def test_anchors_are_githubs() -> None:
    page = REPO / "docs" / "training.md"
    assert "learning-rate-schedules" in anchors(page)
    assert "skipped-updates-fp16-and-gpu-memory" in anchors(page)


def test_the_docs_are_linked_from_the_readme() -> None:
    linked = {(REPO / t.split("#")[0]).resolve() for t in relative_links(REPO / "README.md")}
    assert [p.name for p in PAGES[1:] if p.resolve() not in linked] == []


# Reference pages say what to set and what to expect; a page that grows a diary does not.
LINE_LIMITS = {"README.md": 200, "docs/gpu.md": 250, "docs/performance.md": 250}


@pytest.mark.parametrize(("path", "limit"), LINE_LIMITS.items(), ids=list(LINE_LIMITS))
def test_reference_pages_stay_short(path: str, limit: int) -> None:
    lines = len((REPO / path).read_text(encoding="utf-8").splitlines())
    assert lines < limit, f"{path} has {lines} lines; keep it under {limit} (history: history.md)"


# A date (YYYY-MM-DD) or a GPU lease named by its ordinal: the dated record is docs/history.md's.
DATED = re.compile(
    r"\b20\d\d-\d\d-\d\d\b"
    r"|\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth) lease\b",
    flags=re.I,
)
MAX_DATED = 3


def dated_references(text: str) -> list[str]:
    return DATED.findall(text)


def test_dated_references_are_found() -> None:
    text = "the ninth lease (2026-11-28) and the Second Lease; not 2026-11 nor a lease of 2"
    assert dated_references(text) == ["ninth lease", "2026-11-28", "Second Lease"]


@pytest.mark.parametrize(
    "page",
    [p for p in PAGES if p.name != "history.md"],
    ids=lambda p: p.relative_to(REPO).as_posix(),
)
def test_dated_history_stays_in_history_md(page: Path) -> None:
    found = dated_references(page.read_text(encoding="utf-8"))
    assert len(found) <= MAX_DATED, (
        f"{page.relative_to(REPO)} holds {len(found)} dated references {found[:5]}...: move the "
        "diary to docs/history.md and keep the page's current figures"
    )


def test_make_test_says_what_the_page_test_needs_where_it_cannot_install_it(tmp_path) -> None:
    """`make test` (its `browser` step) installs Chromium as root with apt-get; a user who cannot
    gets one line naming the package, and the step does not fail the suite's start."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "id").write_text("#!/bin/sh\necho 1000\n")  # not root
    (fake / "id").chmod(0o755)
    env = {"PATH": f"{fake}:/usr/bin:/bin", "HOME": str(tmp_path)}
    make = shutil.which("make")
    assert make, "make is needed: the README's commands are make targets"
    result = subprocess.run(
        [make, "-s", "-C", REPO, "browser", "CHROMIUM=no-such-browser"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines == [
        "browser: the serve page test needs Chromium: sudo apt-get install -y chromium"
    ]
    found = subprocess.run(
        [make, "-s", "-C", REPO, "browser", f"CHROMIUM={sys.executable}"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert found.returncode == 0 and found.stdout == ""  # present: nothing to say or install
