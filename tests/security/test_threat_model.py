"""docs/security.md: every claim row names the test that checks it (or says why none does), and
every test it names exists, so the threat model cannot silently drift from the suite."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECURITY = ROOT / "docs" / "security.md"
REFERENCE = re.compile(r"`(tests/[\w/]+\.py)::(test_\w+)`")


@cache
def functions_in(path: str) -> frozenset[str]:
    tree = ast.parse((ROOT / path).read_text())
    return frozenset(
        node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    )


def claim_rows(markdown: str) -> list[str]:
    """The body rows of every table whose last column is `checked by`."""
    rows: list[str] = []
    checked = False
    for line in markdown.splitlines():
        if not line.startswith("|"):
            checked = False
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[-1] == "checked by":
            checked = True
        elif checked and not set(line) <= set("|-: "):
            rows.append(line)
    return rows


def test_every_claim_row_names_a_test_or_says_why_not() -> None:
    rows = claim_rows(SECURITY.read_text())
    assert len(rows) >= 40, "the claim tables of docs/security.md were not found"
    bare = [r for r in rows if not REFERENCE.search(r.rsplit("|", 2)[-2]) and "not tested" not in r]
    assert bare == []


@pytest.mark.parametrize(("path", "name"), sorted(set(REFERENCE.findall(SECURITY.read_text()))),
                         ids=lambda v: str(v))  # fmt: skip
def test_every_test_the_threat_model_names_exists(path: str, name: str) -> None:
    assert (ROOT / path).is_file(), f"docs/security.md names {path}, which does not exist"
    assert name in functions_in(path), f"docs/security.md names {path}::{name}, which does not exist"


def test_the_row_parser_takes_only_claim_tables() -> None:
    text = "| a | checked by |\n|---|---|\n| x | `t` |\n\n| a | b |\n|---|---|\n| y | z |\n"
    assert claim_rows(text) == ["| x | `t` |"]
