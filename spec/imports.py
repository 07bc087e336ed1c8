"""Resolve `package.module:Name` import paths: how a job names a user's own env or reward."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["ImportPathError", "is_import_path", "resolve_import_path"]


class ImportPathError(ValueError):
    """An import path that is malformed or names nothing importable."""


def is_import_path(name: str) -> bool:
    """True for `package.module:Name`, false for a plain registered name like `frozenlake`."""
    return ":" in name


def resolve_import_path(path: str) -> Any:
    """Import `package.module:Attr[.attr]` and return the object, with errors that say which part failed."""
    module_name, sep, attr_path = path.partition(":")
    if not sep or not module_name or not attr_path:
        raise ImportPathError(f"{path!r} is not an import path; expected 'package.module:Name'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise ImportPathError(f"cannot import module {module_name!r} from {path!r}: {e}") from e
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as e:
            raise ImportPathError(f"module {module_name!r} has no attribute {attr_path!r} (from {path!r})") from e
    return obj
