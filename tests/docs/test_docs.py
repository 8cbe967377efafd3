"""docs/: the configuration reference lists exactly the flags the CLIs accept, and every relative
link in docs/*.md points at a file (and, for `#anchors` into docs/, a heading) that exists.

The flags come from `--help` of the real programs, run in a subprocess, so the parsers stay the
one source of truth. Documented flags are the backticked `--flags` in the first cell of the table
rows under each program's `## <program>` heading of docs/configuration.md.
"""

from __future__ import annotations

import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CONFIGURATION = DOCS / "configuration.md"
CLIS = {"sharepack-agent": "sharepack.agent", "sharepack-extender": "sharepack.extender"}

# argparse prints each option at indent 2: "  --flag VALUE", "  -h, --help"; help text is
# indented further, so flags mentioned in prose are not taken for options.
_OPTION_LINE = re.compile(r"^  (?:-\w(?: \S+)?, )?(--[a-z0-9][a-z0-9-]*)", re.M)
_ENV_AT_END = re.compile(r"\(([A-Z][A-Z0-9_]*)\)\s*$")
_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


# --- parsing (pure, tested below) ---------------------------------------------------------------


def help_options(help_text: str) -> dict[str, str | None]:
    """Option -> the env var its help ends with in parentheses (None if none); `--help` left out."""
    options: dict[str, str | None] = {}
    matches = list(_OPTION_LINE.finditer(help_text))
    for m, nxt in zip(matches, [*matches[1:], None]):
        flag = m.group(1)
        if flag == "--help":
            continue
        block = help_text[m.start() : nxt.start() if nxt else len(help_text)]
        env = _ENV_AT_END.search(" ".join(block.split()))
        options[flag] = env.group(1) if env else None
    return options


def section(markdown: str, heading: str) -> str:
    """The text under `## heading` up to the next level-2 heading."""
    m = re.search(rf"^## {re.escape(heading)}\s*$", markdown, re.M)
    if m is None:
        raise AssertionError(f"docs/configuration.md has no '## {heading}' section")
    end = re.search(r"^## ", markdown[m.end() :], re.M)
    return markdown[m.end() : m.end() + end.start() if end else len(markdown)]


def documented_flags(text: str) -> dict[str, str]:
    """Flag -> its whole table row, for every table row whose first cell names a `--flag`."""
    rows: dict[str, str] = {}
    for line in text.splitlines():
        cells = line.strip().split("|")
        if len(cells) < 3 or line.strip()[0] != "|":
            continue
        for flag in re.findall(r"`(--[a-z0-9][a-z0-9-]*)", cells[1]):
            rows[flag] = line
    return rows


def strip_code(markdown: str) -> str:
    return _CODE_SPAN.sub("", _FENCE.sub("", markdown))


def slug(heading: str) -> str:
    """GitHub's heading anchor: lowercase, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    for m in _HEADING.finditer(_FENCE.sub("", markdown)):
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(doc: Path, *, anchors_in: Path = DOCS) -> list[str]:
    """Relative links of `doc` whose file, or whose #anchor into a page in `anchors_in`, does
    not exist."""
    text = doc.read_text()
    problems: list[str] = []
    for target in _LINK.findall(strip_code(text)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("//"):
            continue  # http:, https:, mailto: ... are not files
        path_part, _, fragment = target.partition("#")
        path = (doc.parent / path_part).resolve() if path_part else doc
        if not path.exists():
            problems.append(f"{doc.name}: link to {target}: {path_part} does not exist")
            continue
        if fragment and path.suffix == ".md" and path.parent == anchors_in.resolve():
            if fragment not in anchors(path.read_text()):
                problems.append(f"{doc.name}: link to {target}: no heading #{fragment} in {path.name}")
    return problems


# --- the real programs and docs -----------------------------------------------------------------


@cache
def cli_help(module: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert result.returncode == 0, f"python -m {module} --help failed:\n{result.stderr}"
    return result.stdout


@pytest.mark.parametrize("program", sorted(CLIS), ids=lambda p: f"{p} flags match the reference")
def test_configuration_reference_lists_exactly_the_flags_the_cli_accepts(program: str) -> None:
    accepted = set(help_options(cli_help(CLIS[program])))
    assert accepted, f"no options parsed from {program} --help"
    documented = set(documented_flags(section(CONFIGURATION.read_text(), program)))
    missing = sorted(accepted - documented)
    stale = sorted(documented - accepted)
    assert not missing, f"{program} accepts {missing}, not documented in docs/configuration.md"
    assert not stale, f"docs/configuration.md documents {stale}, which {program} no longer accepts"


def test_agent_flags_are_documented_with_their_environment_variable() -> None:
    rows = documented_flags(section(CONFIGURATION.read_text(), "sharepack-agent"))
    wrong = [
        f"{flag} ({env})"
        for flag, env in help_options(cli_help("sharepack.agent")).items()
        if env is not None and f"`{env}`" not in rows.get(flag, "")
    ]
    assert not wrong, f"docs/configuration.md does not give these flags' environment variables: {wrong}"


DOC_PAGES = sorted(DOCS.glob("*.md"))


def test_the_docs_exist() -> None:
    names = {p.name for p in DOC_PAGES}
    assert {"install.md", "nodegpustates.md", "policies.md", "configuration.md"} <= names


@pytest.mark.parametrize("doc", DOC_PAGES, ids=lambda p: f"links in docs/{p.name} resolve")
def test_relative_links_point_at_files_that_exist(doc: Path) -> None:
    assert broken_links(doc) == []


# --- the parsers above can fail -----------------------------------------------------------------

HELP = """usage: prog [-h] [--alpha ALPHA]

options:
  -h, --help            show this help message and exit
  --alpha ALPHA         the first one, mentioning --not-an-option in prose
                        (ALPHA_ENV)
  --beta [BETA]         no env here
  --gamma-delta GAMMA_DELTA
                        wrapped help text that ends in a variable
                        (SOME_LONG_VARIABLE_NAME)
"""


def test_help_parser_reads_options_and_trailing_env_names_only() -> None:
    assert help_options(HELP) == {
        "--alpha": "ALPHA_ENV",
        "--beta": None,
        "--gamma-delta": "SOME_LONG_VARIABLE_NAME",
    }


@pytest.mark.parametrize(
    ("markdown", "expected"),
    [
        ("| `--a` | x |\n| `--b`, `--c` | y |", {"--a", "--b", "--c"}),
        ("| Flag | x |\n|---|---|\n| `--a` | mentions `--z` |", {"--a"}),
        ("Prose naming `--a` is not a table row.\n", set()),
    ],
    ids=["flags in first cells count", "flags in later cells do not", "prose does not"],
)
def test_table_parser_takes_flags_from_first_cells(markdown: str, expected: set[str]) -> None:
    assert set(documented_flags(markdown)) == expected


def test_section_stops_at_the_next_level_two_heading() -> None:
    text = "## a\n| `--x` | |\n### sub\n| `--y` | |\n## b\n| `--z` | |\n"
    assert set(documented_flags(section(text, "a"))) == {"--x", "--y"}
    with pytest.raises(AssertionError):
        section(text, "c")


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Per-node configs", "per-node-configs"),
        ("Scoring nodes in the extender", "scoring-nodes-in-the-extender"),
        ("`status.summary` and the printer columns", "statussummary-and-the-printer-columns"),
        ("Upgrade, then uninstall (step 2)", "upgrade-then-uninstall-step-2"),
    ],
)
def test_slug_follows_github(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_link_checker_reports_missing_files_and_anchors(tmp_path: Path) -> None:
    (tmp_path / "there.md").write_text("# Here\n")
    doc = tmp_path / "page.md"
    doc.write_text(
        "[ok](there.md#here) [web](https://example.com/x) [self](#top) [gone](missing.md)\n"
        "[no anchor](there.md#nowhere) `[code](also-missing.md)`\n"
        "```\n[fenced](fenced-missing.md)\n```\n# Top\n"
    )
    assert broken_links(doc, anchors_in=tmp_path) == [
        "page.md: link to missing.md: missing.md does not exist",
        "page.md: link to there.md#nowhere: no heading #nowhere in there.md",
    ]
