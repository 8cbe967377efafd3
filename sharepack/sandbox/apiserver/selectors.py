"""Label and field selectors as the Kubernetes API server parses them.

Label selectors: `a=b`, `a==b`, `a!=b`, `a in (x,y)`, `a notin (x)`, `a`, `!a`, joined by commas.
Field selectors: `path=value`, `path==value`, `path!=value`, joined by commas; only the fields a
resource declares are allowed (the real server answers 400 for the others, which catches typos).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any


class SelectorError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class _Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        # "!=" and "notin" match objects that lack the label, as upstream does.
        return not present or value not in self.values


_SET_RE = re.compile(r"^\s*([^\s!=(),]+)\s+(in|notin)\s*\(([^)]*)\)\s*")
_EQ_RE = re.compile(r"^\s*([^\s!=(),]+)\s*(==|=|!=)\s*([^\s,()]*)\s*")
_EXISTS_RE = re.compile(r"^\s*(!?)\s*([^\s!=(),]+)\s*")
_LABEL_KEY_RE = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def _check_key(key: str, selector: str) -> str:
    if not _LABEL_KEY_RE.match(key):
        raise SelectorError(f"unable to parse requirement: invalid label key {key!r} in {selector!r}")
    return key


def parse_label_selector(selector: str) -> Callable[[Mapping[str, str]], bool]:
    reqs: list[_Requirement] = []
    rest = selector.strip()
    while rest:
        if m := _SET_RE.match(rest):
            values = tuple(v.strip() for v in m.group(3).split(",") if v.strip())
            reqs.append(_Requirement(_check_key(m.group(1), selector), m.group(2), values))
        elif m := _EQ_RE.match(rest):
            op = "=" if m.group(2) in ("=", "==") else "!="
            reqs.append(_Requirement(_check_key(m.group(1), selector), op, (m.group(3),)))
        elif m := _EXISTS_RE.match(rest):
            op = "!exists" if m.group(1) else "exists"
            reqs.append(_Requirement(_check_key(m.group(2), selector), op))
        else:
            raise SelectorError(f"unable to parse requirement: {rest!r} in {selector!r}")
        rest = rest[m.end() :]
        if rest.startswith(","):
            rest = rest[1:]
        elif rest:
            raise SelectorError(f"unable to parse requirement: {rest!r} in {selector!r}")

    def matches(labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in reqs)

    return matches


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The string form of a dotted field, "" when absent (so `spec.nodeName=` finds unbound pods)."""
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return ""
        node = node[part]
    if isinstance(node, bool):
        return "true" if node else "false"
    return "" if node is None else str(node)


def parse_field_selector(
    selector: str, allowed: Collection[str], kind: str
) -> Callable[[Mapping[str, Any]], bool]:
    terms: list[tuple[str, bool, str]] = []
    for raw in selector.split(","):
        raw = raw.strip()
        if not raw:
            continue
        if "!=" in raw:
            field, value = raw.split("!=", 1)
            negate = True
        elif "==" in raw:
            field, value = raw.split("==", 1)
            negate = False
        elif "=" in raw:
            field, value = raw.split("=", 1)
            negate = False
        else:
            raise SelectorError(f"invalid selector: {raw!r}; can't understand {raw!r}")
        field = field.strip()
        if field not in allowed:
            raise SelectorError(f'field label not supported: {field}')
        terms.append((field, negate, value.strip()))

    def matches(obj: Mapping[str, Any]) -> bool:
        return all((field_value(obj, f) == v) != neg for f, neg, v in terms)

    return matches
