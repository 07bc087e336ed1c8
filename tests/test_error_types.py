"""Error types by recoverability: each type says whether a retry may help, and the code raises them only so."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rollart.contracts.agent import TurnRefused
from rollart.contracts.errors import NEVER_RETRY, ErrorType
from rollart.workflows.policies import RESET, STEP

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("workflows", "activities", "workers", "client", "cli", "infra", "contracts", "sdk")


def application_errors() -> list[tuple[str, ast.Call]]:
    """Every `ApplicationError(...)` call in the product's source, with where it is."""
    calls = []
    for room in PRODUCT:
        for path in sorted((ROOT / room).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Call):
                    name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                    if name == "ApplicationError":
                        calls.append((f"{path.relative_to(ROOT)}:{node.lineno}", node))
    return calls


def test_the_scan_sees_the_raises() -> None:
    """The scan below is not vacuous: the product builds ApplicationErrors in more than one place."""
    assert len(application_errors()) >= 3


def test_no_error_type_is_a_string_literal() -> None:
    """A type spelt as a string escapes the enum: it is retried or not by accident, and a typo goes unseen."""
    literal = [
        where
        for where, call in application_errors()
        for kw in call.keywords
        if kw.arg == "type" and isinstance(kw.value, ast.Constant)
    ]
    assert literal == [], f"raise ErrorType.X.error(message) instead of a string type at {literal}"


def test_an_error_is_built_only_through_its_type() -> None:
    """`ErrorType.X.error` sets `non_retryable` from the type; a raise that sets it by hand can disagree."""
    by_hand = [
        where
        for where, call in application_errors()
        for kw in call.keywords
        if kw.arg == "type" and isinstance(kw.value, ast.Attribute) and kw.value.attr.isupper()
    ]
    assert by_hand == [], f"use ErrorType.X.error(message) at {by_hand}"


def test_never_retry_is_every_type_that_says_so_and_no_other() -> None:
    assert set(NEVER_RETRY) == {t.value for t in ErrorType if not t.retryable}
    retryable = {t.value for t in ErrorType if t.retryable}
    assert {"TrainerRankFailed", "EnvStepTransient", "WeightsNotPublished"} <= retryable
    assert not retryable & set(NEVER_RETRY)
    for policy in (RESET, STEP):  # the activity policies take the derived list, not a copy
        assert set(policy.retry.non_retryable_error_types) == set(NEVER_RETRY)


@pytest.mark.parametrize("kind", list(ErrorType))
def test_an_error_is_retryable_exactly_when_its_type_is(kind: ErrorType) -> None:
    err = kind.error("why")
    assert err.type == kind.value and err.message == "why"
    assert err.non_retryable is not kind.retryable


def test_types_are_unique_and_refusals_are_types() -> None:
    values = [t.value for t in ErrorType]
    assert len(values) == len(set(values))
    refusals = [v for k, v in vars(TurnRefused).items() if k.isupper()]
    assert refusals and all(isinstance(r, ErrorType) and not r.retryable for r in refusals)
