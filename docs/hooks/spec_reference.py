"""mkdocs hook: the job spec reference, generated from the pydantic models at build time, so it cannot drift.

A page holding the line `<!-- spec-reference -->` gets, in its place, one section per model reached from
`JobSpec` (spec/config/; `kubernetes:` is `KubernetesConfig` of spec/config/kubernetes.py): each field's path in
a job's YAML, type and constraints, default, and description (the field's `description`, or the docstring
written under it).
"""

from __future__ import annotations

import ast
import enum
import inspect
import itertools
import json
import textwrap
import types
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

MARKER = "<!-- spec-reference -->"

_BOUNDS = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER not in markdown:
        return markdown
    from rollart.spec.config import JobSpec

    return markdown.replace(MARKER, reference(JobSpec))


def reference(root: type[BaseModel]) -> str:
    """Markdown: a section per model reachable from `root`, each after the section that first reaches it.

    A model reached by several paths (`LatencyModel` under `reset_latency` and `step_latency`) gets one
    section: its title names every path, its rows are spelled under the first.
    """
    order: list[type[BaseModel]] = []
    paths: dict[type[BaseModel], list[str]] = {}

    def visit(model: type[BaseModel], path: str) -> None:
        if model in paths:
            paths[model].append(path)
            return
        paths[model] = [path]
        order.append(model)
        for name, field in model.model_fields.items():
            full = f"{path}.{name}" if path else name
            for nested, suffix in nested_models(field.annotation):
                visit(nested, full + suffix)

    visit(root, "")
    return "\n".join(section(model, paths[model]) for model in order)


def section(model: type[BaseModel], paths: list[str]) -> str:
    """One model's section: a heading naming where a job's YAML reaches it, its docstring, a row per field."""
    path = paths[0]
    docs = attribute_docs(model)
    rows = []
    for name, field in model.model_fields.items():
        full = f"{path}.{name}" if path else name
        cells = [
            f"`{full}`",
            type_name(field.annotation) + constraints(field),
            default(field),
            cell(field.description or docs.get(name, "")),
        ]
        rows.append("| " + " | ".join(cells) + " |")
    where = ", ".join(f"`{p}`" for p in paths)
    title = f"{where}: {model.__name__}" if path else f"The job: {model.__name__}"
    doc = inspect.cleandoc(model.__doc__ or "")
    return "\n".join(
        [
            f"## {title} {{#{anchor(model)}}}",
            "",
            *([doc, ""] if doc else []),
            "| field | type | default | description |",
            "|---|---|---|---|",
            *rows,
            "",
        ]
    )


def anchor(model: type) -> str:
    return model.__name__.lower()


def nested_models(annotation: Any) -> list[tuple[type[BaseModel], str]]:
    """The models inside a field's type, with the path suffix a YAML key takes to reach them (`[]`, `.<key>`)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [(annotation, "")]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (list, tuple, set, frozenset):
        return [(m, "[]" + s) for a in args for m, s in nested_models(a)]
    if origin is dict and len(args) == 2:
        return [(m, ".<name>" + s) for m, s in nested_models(args[1])]
    if origin in (typing.Union, types.UnionType):
        return [ms for a in args for ms in nested_models(a)]
    return []


def type_name(annotation: Any) -> str:
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{anchor(annotation)})"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " \\| ".join(f"`{m.value}`" for m in annotation)
    if isinstance(annotation, type) and issubclass(annotation, Path):
        return "path"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return " \\| ".join(f"`{json.dumps(a)}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(type_name(a) for a in args)
    if origin in (list, tuple, set, frozenset, dict):
        inner = ", ".join("…" if a is Ellipsis else type_name(a) for a in args)
        return f"{origin.__name__}[{inner}]"
    if annotation is Any:
        return "any"
    return getattr(annotation, "__name__", str(annotation))


def constraints(field: FieldInfo) -> str:
    """`≥ 0`, `length ≥ 1`, a pattern: what the field's validators check, besides its type."""
    out = []
    for m in field.metadata:
        for attr, sign in _BOUNDS.items():
            if getattr(m, attr, None) is not None:
                out.append(f"{sign} {getattr(m, attr)}")
        for attr, sign in (("min_length", "≥"), ("max_length", "≤")):
            if getattr(m, attr, None) is not None:
                out.append(f"length {sign} {getattr(m, attr)}")
        if getattr(m, "pattern", None):
            out.append(f"matches `{m.pattern}`")
    return f" ({', '.join(out)})".replace("|", "\\|") if out else ""


def default(field: FieldInfo) -> str:
    """The default as YAML would spell it (JSON); a nested model's is its own section's defaults."""
    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "**required**"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return f"[its defaults](#{anchor(type(value))})"
    return f"`{_json(value)}`"


def _json(value: Any) -> str:
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if isinstance(value, dict):
        value = {k: v.model_dump(mode="json") if isinstance(v, BaseModel) else v for k, v in value.items()}
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, Path):
        value = str(value)
    return json.dumps(value, default=str, ensure_ascii=False).replace("|", "\\|")


def cell(text: str) -> str:
    """Text fit for one table cell: one line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def attribute_docs(model: type) -> dict[str, str]:
    """The docstrings written under a class's fields (`x: int = 0` then `\"\"\"...\"\"\"`), by field name,
    from the model and its bases."""
    docs: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if cls is object or not issubclass(cls, BaseModel) or cls is BaseModel:
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in itertools.pairwise(body):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs
