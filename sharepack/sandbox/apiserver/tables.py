"""Server-side printing: the `meta.k8s.io/v1` Table that `kubectl get` asks for.

kubectl no longer prints columns of its own: without a Table it shows only NAME and AGE. The
columns and cells of each type are in `apiserver_printers`.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

from sharepack.sandbox.apiserver import printers
from sharepack.sandbox.apiserver.resources import ResourceType
from sharepack.sandbox.apiserver.store import Obj


def wants_table(accept: str) -> bool:
    """True when the first media type kubectl offers that we can serve is a v1 or v1beta1 Table."""
    for media in accept.split(","):
        params = {k.strip(): v.strip() for k, _, v in (p.partition("=") for p in media.split(";")[1:])}
        if params.get("as") == "Table" and params.get("g") == "meta.k8s.io" and params.get("v") in ("v1", "v1beta1"):
            return True
    return False


def table(rt: ResourceType, objects: Sequence[Obj], list_meta: Obj, include_object: str) -> Obj:
    """A Table of `objects`; rows carry each object's metadata (the default `includeObject`),
    which kubectl reads for namespaces and labels, or the whole object, or nothing."""
    columns, cells = printers.printer(rt)
    now = datetime.datetime.now(datetime.UTC)
    definitions = [
        {"name": c.name, "type": c.type, "format": c.format, "description": c.description, "priority": c.priority}
        for c in columns
    ]
    rows = []
    for obj in objects:
        row: Obj = {"cells": cells(obj, now)}
        if include_object == "Object":
            row["object"] = obj
        elif include_object != "None":
            meta = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1"}
            row["object"] = {**meta, "metadata": obj["metadata"]}
        rows.append(row)
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta,
            "columnDefinitions": definitions, "rows": rows}  # fmt: skip
