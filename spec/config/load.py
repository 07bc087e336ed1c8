"""Reading a job spec file: parse, validate, resolve; every error names the file and the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rollart.spec.config.job import JobSpec
from rollart.spec.config.resolve import resolve

__all__ = ["JobSpecError", "format_validation_error", "load_job"]


class JobSpecError(ValueError):
    """A job spec that cannot be read or does not validate; the message names the file and fields."""


def format_validation_error(err: ValidationError, source: str) -> str:
    """One line per problem: `source: field.path: message (got value)`."""
    lines = [f"{source}: invalid job spec ({err.error_count()} problem{'s' if err.error_count() > 1 else ''})"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        got = "" if e["type"] == "missing" else f" (got {e['input']!r})"
        if len(got) > 80:
            got = got[:77] + "...)"
        lines.append(f"  {loc}: {e['msg']}{got}")
    return "\n".join(lines)


def load_job(path: str | Path, overrides: dict[str, Any] | None = None) -> JobSpec:
    """Read a job spec from YAML (.yaml/.yml) or JSON, validate it and resolve it (`resolve`: where its tasks'
    envs and rewards declare they run).

    `overrides` are merged over the file's top level (for CLI flags such as
    `--temporal-address`). Relative model/store paths stay relative to the cwd.
    A job naming a cluster file (`cluster: cluster.yaml`) takes its pools from there (`_with_cluster`).
    """
    path = Path(path)
    raw = _with_cluster(_read_mapping(path, "job spec"), path)
    for key, value in (overrides or {}).items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key] = {**raw[key], **value}
        else:
            raw[key] = value
    try:
        return resolve(JobSpec.model_validate(raw))
    except ValidationError as e:
        raise JobSpecError(format_validation_error(e, str(path))) from e


def _read_mapping(path: Path, what: str) -> dict[str, Any]:
    """The mapping a YAML (.yaml/.yml) or JSON file holds; a JobSpecError naming the file otherwise."""
    try:
        text = path.read_text()
    except OSError as e:
        raise JobSpecError(f"{path}: cannot read {what}: {e.strerror or e}") from e
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            raw = yaml.safe_load(text)
        else:
            raw = json.loads(text)
    except Exception as e:  # yaml.YAMLError / json.JSONDecodeError: both carry line numbers
        raise JobSpecError(f"{path}: not valid {'YAML' if path.suffix in ('.yaml', '.yml') else 'JSON'}: {e}") from e
    if not isinstance(raw, dict):
        raise JobSpecError(f"{path}: a {what} is a mapping at the top level, got {type(raw).__name__}")
    return raw


def _with_cluster(raw: dict[str, Any], job_path: Path) -> dict[str, Any]:
    """The job with the pools of the cluster file it names (`cluster:`, relative to the job's file) under its own.

    A cluster's pools are declared once for every job run on it; the job's `pools:` entries are laid over the
    cluster's field by field, as both are over the defaults.
    """
    if "cluster" not in raw:
        return raw
    job = dict(raw)
    path = job_path.parent / str(job.pop("cluster"))
    cluster = _read_mapping(path, "cluster file")
    if set(cluster) - {"pools"} or not isinstance(cluster.get("pools"), dict):
        raise JobSpecError(f"{path}: a cluster file holds one section, `pools:` (a mapping of pool name to pool)")
    declared = job.get("pools") or {}
    if not isinstance(declared, dict):
        return job  # not a mapping: validation says so
    pools = dict(cluster["pools"])
    for name, entry in declared.items():
        below = pools.get(name)
        pools[name] = {**below, **entry} if isinstance(below, dict) and isinstance(entry, dict) else entry
    return {**job, "pools": pools}
