"""Arithmetic as a one-turn env: reasoning-gym's `basic_arithmetic` generator, rendered for a tiny model.

Problems and answers come from reasoning-gym (offline, procedural), so
correctness is reasoning-gym's, not ours. The prompt is only the expression
without spaces followed by ``=``, e.g. ``"3+4="``: reasoning-gym's own
question text ("Calculate 3 + 4.") is too long for a ~0.6M-parameter policy.
The action is the model's raw text; the episode ends after one step with
reward 1.0 iff the stripped action equals reasoning-gym's answer string.

We use reasoning-gym's *simple* generator (``allow_parentheses=False``,
``allow_negation=False``): plain left-to-right expressions the tiny
tokenizer reads well. Two quirks of that generator shape the allowed
``operators``:

- it evaluates left to right, so mixing ``*`` with ``+``/``-`` gives
  answers that contradict operator precedence (``2+3*4`` → 20): ``*`` is
  allowed only on its own;
- with ``/`` it writes the ``/`` but silently multiplies when no exact
  divisor exists: ``/`` is rejected.

Operands are drawn from ``0..10**digits`` inclusive (so 1-digit problems
include the operand 10 now and then); that is reasoning-gym's behaviour and
is kept.
"""

from __future__ import annotations

import re
from typing import Any, Final

from rollart.spec.env import Env, StepOutcome
from rollart.spec.registry import env

__all__ = ["Arithmetic", "is_integer", "render"]

DATASET: Final = "basic_arithmetic"
_ALLOWED_OPERATOR_SETS: Final = ("+", "-", "+-", "-+", "*")
_MAX_DIGITS: Final = 9
_MAX_TERMS: Final = 8
_INTEGER: Final = re.compile(r"[+-]?[0-9]+")


def render(expression: str) -> str:
    """The prompt for an expression: no spaces, then ``=`` (``"3 + 4"`` → ``"3+4="``)."""
    return expression.replace(" ", "") + "="


def is_integer(text: str) -> bool:
    """Whether `text` (already stripped) is a plain ASCII integer such as ``7`` or ``-12``."""
    return _INTEGER.fullmatch(text) is not None


@env("arithmetic")
class Arithmetic(Env):
    """One arithmetic problem per episode; reward 1.0 for the exact answer, else 0.0.

    env_args: ``min_digits`` / ``max_digits`` (digits per operand, 1..9,
    default 1 / 1), ``operators`` (one of "+", "-", "+-" (or "-+"), "*"; default "+"),
    ``num_terms`` (operands per problem, 2..8, default 2). The same seed
    always gives the same problem.
    """

    def __init__(
        self,
        *,
        min_digits: int = 1,
        max_digits: int = 1,
        operators: str = "+",
        num_terms: int = 2,
        **unknown: Any,
    ) -> None:
        super().__init__(**unknown)
        _validate_args(min_digits, max_digits, operators, num_terms)
        self.min_digits = min_digits
        self.max_digits = max_digits
        self.operators = operators
        self.num_terms = num_terms
        self._entry: dict[str, Any] | None = None
        self._dataset: Any = None
        self._done = False

    def _rg_kwargs(self) -> dict[str, Any]:
        """reasoning-gym `BasicArithmeticDatasetConfig` fields for this env's problems."""
        return {
            "min_terms": self.num_terms,
            "max_terms": self.num_terms,
            "min_digits": self.min_digits,
            "max_digits": self.max_digits,
            "operators": tuple(self.operators),
            "allow_parentheses": False,
            "allow_negation": False,
            "whitespace": "no_space",
        }

    def reset(self, seed: int) -> str:
        """Draw the problem for `seed` and return its prompt, e.g. ``"3+4="``.

        A fresh one-item dataset per reset costs ~15 µs (measured), so
        nothing is cached; reasoning-gym itself (~1 s to import) is imported
        on first use, not when the env package is imported.
        """
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"Arithmetic.reset: seed must be an int, got {seed!r}")
        import reasoning_gym

        self._dataset = reasoning_gym.create_dataset(DATASET, size=1, seed=seed, **self._rg_kwargs())
        self._entry = self._dataset[0]
        self._done = False
        return render(self._entry["metadata"]["expression"])

    @property
    def answer(self) -> str:
        """reasoning-gym's answer to the current problem; reset first."""
        if self._entry is None:
            raise RuntimeError("Arithmetic has no problem yet: call reset(seed) before using it")
        return str(self._entry["answer"])

    def step(self, action: str) -> StepOutcome:
        """Score the model's answer; always ends the episode."""
        answer = self.answer
        if self._done:
            raise RuntimeError("Arithmetic.step called after the episode ended; call reset(seed) to start a new one")
        self._done = True
        text = action.strip()
        success = self._dataset.score_answer(text, self._entry) == 1.0  # reasoning-gym's exact-match score
        return StepOutcome(
            observation="",
            reward=1.0 if success else 0.0,
            done=True,
            info={"answer": answer, "success": success, "valid": is_integer(text)},
        )

    @property
    def answer_range(self) -> tuple[int, int]:
        """The least and greatest answer this env's problems can have (its env_args decide).

        reasoning-gym draws every operand from ``0..10**digits`` and evaluates left to right, so with
        ``top = 10**max_digits`` and n terms: ``+`` gives 0..n·top, ``-`` gives −(n−1)·top..top, ``+-``
        both ends, and ``*`` gives 0..top**n.
        """
        top, n = 10**self.max_digits, self.num_terms
        if self.operators == "*":
            return 0, top**n
        low = -(n - 1) * top if "-" in self.operators else 0
        high = n * top if "+" in self.operators else top
        return low, high

    def action_of(self, text: str) -> str | None:
        """The answer given (``" 07"`` → ``"7"``), or None for text that is no answer a problem here can have.

        Why the range: with `trainer.loss.entropy_over: actions` the bonus keeps every action alive, and the
        actions that matter are the answers. An integer no problem has as its answer (57 for 1-digit sums) is
        always wrong; counted as an action it would take a share of the bonus from the answers that are rare
        but right (0 and 20 are each the sum of one pair of the 121), which RL otherwise pushes down wherever
        they are wrong until no prompt samples them (docs/learning.md).
        """
        text = text.strip()
        if not is_integer(text):
            return None
        low, high = self.answer_range
        return str(int(text)) if low <= int(text) <= high else None


def _validate_args(min_digits: Any, max_digits: Any, operators: Any, num_terms: Any) -> None:
    """Reject bad env_args when the session is built, naming the argument and what it accepts."""
    for name, value in (("min_digits", min_digits), ("max_digits", max_digits)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _MAX_DIGITS:
            raise ValueError(f"arithmetic: {name} must be an int in 1..{_MAX_DIGITS}, got {value!r}")
    if max_digits < min_digits:
        raise ValueError(f"arithmetic: max_digits ({max_digits}) must be >= min_digits ({min_digits})")
    if isinstance(num_terms, bool) or not isinstance(num_terms, int) or not 2 <= num_terms <= _MAX_TERMS:
        raise ValueError(f"arithmetic: num_terms must be an int in 2..{_MAX_TERMS}, got {num_terms!r}")
    if not isinstance(operators, str) or operators not in _ALLOWED_OPERATOR_SETS:
        why = ""
        if isinstance(operators, str) and "/" in operators:
            why = " ('/' is unsupported: reasoning-gym's simple generator writes '/' but may multiply)"
        elif isinstance(operators, str) and "*" in operators:
            why = " ('*' only on its own: reasoning-gym evaluates left to right, against operator precedence)"
        raise ValueError(
            f"arithmetic: operators must be one of {', '.join(map(repr, _ALLOWED_OPERATOR_SETS))}, got "
            f"{operators!r}{why}"
        )
