"""A calculator tool's expression, checked to be arithmetic before anything runs it (`sandbox.run_calc` runs it).

Why its own module: the check is pure (an AST walk) and is the whole of the calculator's safety, so it reads and
tests apart from the process sandbox it hands the expression to.
"""

from __future__ import annotations

import ast
from typing import Final

__all__ = ["MAX_EXPRESSION_CHARS", "CalcError", "check_expression"]

MAX_EXPRESSION_CHARS: Final = 500

_BIN_OPS: Final = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
}
_UNARY_OPS: Final = {ast.UAdd: "+", ast.USub: "-"}


class CalcError(ValueError):
    """A calculator expression uses something other than numbers, arithmetic operators and parentheses."""


def check_expression(expression: str) -> str:
    """The canonical source of a calculator expression, or CalcError saying what is not allowed.

    Allowed: int and float literals, ``+ - * / // % **``, unary ``+``/``-``, parentheses.
    Everything else — names, attributes, calls, subscripts, strings, comparisons — is refused
    here, before anything runs; evaluation itself happens in the sandbox (``9**9**9`` is a
    valid expression that only the limits stop).
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalcError(f"expression longer than {MAX_EXPRESSION_CHARS} chars")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise CalcError(f"not an arithmetic expression: {e.msg}") from None
    for node in ast.walk(tree):
        if (
            isinstance(node, (ast.Expression, ast.BinOp, ast.UnaryOp))
            or type(node) in _BIN_OPS
            or type(node) in _UNARY_OPS
        ):
            continue
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            continue
        raise CalcError(_refusal(node))
    return ast.unparse(tree)


def _refusal(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return f"names are not allowed ({node.id!r}); use numbers and + - * / // % ** only"
    if isinstance(node, ast.Attribute):
        return f"attributes are not allowed (.{node.attr}); use numbers and + - * / // % ** only"
    if isinstance(node, ast.Call):
        return "function calls are not allowed; use numbers and + - * / // % ** only"
    if isinstance(node, ast.Constant):
        return f"only int and float literals are allowed, not {type(node.value).__name__}"
    return f"{type(node).__name__} is not allowed; use numbers and + - * / // % ** only"
