"""The affinity registry: `@env` and `@reward` declare where work runs, checked when declared.

A job names envs and rewards either by their registered name (`frozenlake`)
or by import path (`mypkg.envs:Maze`). A reward is a function of the
transcript, or a reward *model*: a class whose `from_args(**reward_args)`
loads it (once per worker, lazily) and whose instances score a transcript. Built-ins are registered when their
modules are imported; `lookup_env` / `lookup_reward` import them on demand so
a worker process needs no setup step.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from rollart.infra.imports import ImportPathError, is_import_path, resolve_import_path
from rollart.infra.pools import Pool

__all__ = [
    "EnvEntry",
    "Registry",
    "RewardEntry",
    "UnknownComponentError",
    "env",
    "lookup_env",
    "lookup_reward",
    "registry",
    "reward",
]

_BUILTIN_MODULES = ("rollart.activities.envs", "rollart.activities.rewards")

T = TypeVar("T")


class UnknownComponentError(LookupError):
    """A job names an env or reward that is neither registered nor importable."""


@dataclass(frozen=True)
class EnvEntry:
    """A declared env: its class and the limits its activities run under."""

    name: str
    cls: type
    pool: Pool = Pool.CPU
    reset_timeout_s: float = 30.0
    step_timeout_s: float = 30.0


@dataclass(frozen=True)
class RewardEntry:
    """A declared reward: a function, or a model class (`from_args` loads it, instances score).

    `serverless=True` means it may run on the elastic "serverless" pool; `False` means it must
    run on the generation pool's worker (`reward_placement: colocated`), e.g. because it needs
    that worker's accelerator.
    """

    name: str
    fn: Callable[..., Any]
    serverless: bool = True

    @property
    def pool(self) -> Pool | None:
        """The pool it runs on by default: "serverless", or None (the task's generation pool)."""
        return Pool.SERVERLESS if self.serverless else None

    @property
    def is_model(self) -> bool:
        """A class loaded once per worker with the task's `reward_args`, rather than a plain function."""
        return inspect.isclass(self.fn)

    def check_args(self, args: dict[str, Any]) -> None:
        """Reject reward_args a function cannot take or the model's `check_args` refuses (cheap: loads nothing)."""
        if not self.is_model:
            if args:
                raise TypeError(f"reward {self.name!r} is a function of the transcript and takes no reward_args "
                                f"(got {', '.join(sorted(args))})")  # fmt: skip
            return
        check = getattr(self.fn, "check_args", None)
        if callable(check):
            check(args)
        else:
            inspect.signature(self.fn.from_args).bind(**args)

    def load(self, args: dict[str, Any]) -> Callable[[Any], Any]:
        """The scorer to call with each transcript: the function itself, or the model `from_args` builds."""
        if not self.is_model:
            self.check_args(args)
            return self.fn
        return self.fn.from_args(**args)


class Registry:
    """Name → declared env/reward. One instance (`registry`) serves the process."""

    def __init__(self) -> None:
        self._envs: dict[str, EnvEntry] = {}
        self._rewards: dict[str, RewardEntry] = {}
        self._builtins_loaded = False

    def add_env(self, entry: EnvEntry) -> None:
        _check_env_class(entry.cls, entry.name)
        existing = self._envs.get(entry.name)
        if existing is not None and existing.cls is not entry.cls:
            raise ValueError(f"env {entry.name!r} is already declared by {_qualname(existing.cls)}")
        self._envs[entry.name] = entry

    def add_reward(self, entry: RewardEntry) -> None:
        _check_reward_fn(entry.fn, entry.name)
        existing = self._rewards.get(entry.name)
        if existing is not None and existing.fn is not entry.fn:
            raise ValueError(f"reward {entry.name!r} is already declared by {_qualname(existing.fn)}")
        self._rewards[entry.name] = entry

    def env_names(self) -> list[str]:
        self._load_builtins()
        return sorted(self._envs)

    def reward_names(self) -> list[str]:
        self._load_builtins()
        return sorted(self._rewards)

    def lookup_env(self, name: str) -> EnvEntry:
        """The env called `name`: a registered name or an import path of an (optionally decorated) class."""
        if is_import_path(name):
            obj = _resolve(name, "env")
            declared = getattr(obj, "__rollart_env__", None)
            if isinstance(declared, EnvEntry):
                return declared
            _check_env_class(obj, name)
            return EnvEntry(name=name, cls=obj)
        self._load_builtins()
        try:
            return self._envs[name]
        except KeyError:
            raise UnknownComponentError(
                f"unknown env {name!r}; registered envs: {', '.join(sorted(self._envs)) or '(none)'}"
                " — or give an import path such as 'mypkg.envs:MyEnv'"
            ) from None

    def lookup_reward(self, name: str) -> RewardEntry:
        """The reward called `name`: a registered name or an import path of a function."""
        if is_import_path(name):
            obj = _resolve(name, "reward")
            declared = getattr(obj, "__rollart_reward__", None)
            if isinstance(declared, RewardEntry):
                return declared
            _check_reward_fn(obj, name)
            return RewardEntry(name=name, fn=obj)
        self._load_builtins()
        try:
            return self._rewards[name]
        except KeyError:
            raise UnknownComponentError(
                f"unknown reward {name!r}; registered rewards: {', '.join(sorted(self._rewards)) or '(none)'}"
                " — or give an import path such as 'mypkg.rewards:my_reward'"
            ) from None

    def _load_builtins(self) -> None:
        if not self._builtins_loaded:
            self._builtins_loaded = True
            for module in _BUILTIN_MODULES:
                importlib.import_module(module)


registry = Registry()
"""The process-wide registry the decorators write to."""


def env(
    name: str,
    *,
    pool: Pool | str = Pool.CPU,
    reset_timeout: float = 30.0,
    step_timeout: float = 30.0,
) -> Callable[[type[T]], type[T]]:
    """Declare an env class under `name`; its sessions live on `pool` workers (default "cpu")."""
    if reset_timeout <= 0 or step_timeout <= 0:
        raise ValueError(f"env {name!r}: timeouts must be positive")

    def declare(cls: type[T]) -> type[T]:
        entry = EnvEntry(name=name, cls=cls, pool=Pool(pool), reset_timeout_s=reset_timeout, step_timeout_s=step_timeout)
        registry.add_env(entry)
        cls.__rollart_env__ = entry  # type: ignore[attr-defined]
        return cls

    return declare


def reward(name: str, *, serverless: bool = True) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Declare a reward function or reward-model class under `name`.

    `serverless=True`: it may run on the elastic "serverless" pool (where tasks send rewards by
    default); `False`: only on the generation pool's worker (`reward_placement: colocated`).
    """

    def declare(fn: Callable[..., T]) -> Callable[..., T]:
        entry = RewardEntry(name=name, fn=fn, serverless=serverless)
        registry.add_reward(entry)
        fn.__rollart_reward__ = entry  # type: ignore[attr-defined]
        return fn

    return declare


def lookup_env(name: str) -> EnvEntry:
    """Shorthand for `registry.lookup_env`."""
    return registry.lookup_env(name)


def lookup_reward(name: str) -> RewardEntry:
    """Shorthand for `registry.lookup_reward`."""
    return registry.lookup_reward(name)


def _resolve(path: str, kind: str) -> Any:
    try:
        return resolve_import_path(path)
    except ImportPathError as e:
        raise UnknownComponentError(f"unknown {kind} {path!r}: {e}") from e


def _check_env_class(obj: Any, name: str) -> None:
    if not inspect.isclass(obj):
        raise TypeError(f"env {name!r} must be a class with reset(seed) and step(action), got {obj!r}")
    missing = [m for m in ("reset", "step") if not callable(getattr(obj, m, None))]
    if missing:
        raise TypeError(f"env {name!r} ({_qualname(obj)}) lacks {', '.join(missing)}(); subclass rollart Env")


def _check_reward_fn(obj: Any, name: str) -> None:
    if inspect.isclass(obj):
        scores = any("__call__" in vars(k) for k in obj.__mro__[:-1])
        if not callable(getattr(obj, "from_args", None)) or not scores:
            raise TypeError(f"reward {name!r} ({_qualname(obj)}) must be a function taking a Transcript, or a "
                            "reward-model class with a classmethod from_args(**reward_args) that loads it and "
                            "__call__(transcript) that scores")  # fmt: skip
        return
    if not callable(obj):
        raise TypeError(f"reward {name!r} must be a function taking a Transcript, got {obj!r}")
    params = [p for p in inspect.signature(obj).parameters.values() if p.default is inspect.Parameter.empty]
    if len(params) != 1:
        raise TypeError(f"reward {name!r} ({_qualname(obj)}) must take exactly one argument (the Transcript)")


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"
