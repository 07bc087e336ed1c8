"""The affinity registry: `@env` and `@reward` declare where work runs, checked when declared.

A job names envs and rewards either by their registered name (`frozenlake`)
or by import path (`mypkg.envs:Maze`). A reward is a function of the
transcript, or a reward *model*: a class whose `from_args(**reward_args)`
loads it (once per worker, lazily) and whose instances score a transcript.

A declaration registers when its module is imported. Installed packages name theirs as Python entry
points (groups `rollart.envs` and `rollart.rewards`, name → `module:object`; rollart's built-ins are
declared so in its pyproject.toml); `lookup_env` / `lookup_reward` import an entry point's module
when its name is first asked for, so a worker process needs no set-up step and this module names
no implementation.
"""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib.metadata import EntryPoint, entry_points
from typing import Any, TypeVar

from rollart.spec.imports import ImportPathError, is_import_path, resolve_import_path
from rollart.spec.pools import DEFAULT_POOLS, POOL_NAME_PATTERN, SESSION_ROLES, Pool

__all__ = [
    "EnvEntry",
    "Registry",
    "RewardEntry",
    "UnknownComponentError",
    "declared_env_pool",
    "declared_reward_serverless",
    "env",
    "lookup_env",
    "lookup_reward",
    "registry",
    "reward",
]

ENV_ENTRY_POINTS = "rollart.envs"
"""The entry-point group naming envs: `name = "package.module:EnvClass"`."""

REWARD_ENTRY_POINTS = "rollart.rewards"
"""The entry-point group naming rewards: `name = "package.module:reward_fn"` (or a reward-model class)."""

log = logging.getLogger(__name__)

T = TypeVar("T")


class UnknownComponentError(LookupError):
    """A job names an env or reward that is neither registered nor importable."""


@dataclass(frozen=True)
class EnvEntry:
    """A declared env: its class and the limits its activities run under."""

    name: str
    cls: type
    pool: str = Pool.CPU.value
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
    def pool(self) -> str | None:
        """The pool it runs on by default: "serverless", or None (the task's generation pool)."""
        return Pool.SERVERLESS.value if self.serverless else None

    @property
    def is_model(self) -> bool:
        """A class loaded once per worker with the task's `reward_args`, rather than a plain function."""
        return inspect.isclass(self.fn)

    def check_args(self, args: dict[str, Any]) -> None:
        """Reject reward_args a function cannot take or the model's `check_args` refuses (cheap: loads nothing)."""
        if not self.is_model:
            if args:
                raise TypeError(
                    f"reward {self.name!r} is a function of the transcript and takes no reward_args "
                    f"(got {', '.join(sorted(args))})"
                )
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

    def add_env(self, entry: EnvEntry) -> None:
        """Register a declared env; the same name for another class is an error."""
        _check_env_class(entry.cls, entry.name)
        existing = self._envs.get(entry.name)
        if existing is not None and existing.cls is not entry.cls:
            raise ValueError(f"env {entry.name!r} is already declared by {_qualname(existing.cls)}")
        self._envs[entry.name] = entry

    def add_reward(self, entry: RewardEntry) -> None:
        """Register a declared reward; the same name for another function is an error."""
        _check_reward_fn(entry.fn, entry.name)
        existing = self._rewards.get(entry.name)
        if existing is not None and existing.fn is not entry.fn:
            raise ValueError(f"reward {entry.name!r} is already declared by {_qualname(existing.fn)}")
        self._rewards[entry.name] = entry

    def env_names(self) -> list[str]:
        """Every env a job may name: declared here, or named by an installed entry point."""
        return sorted(set(self._envs) | set(_entry_points(ENV_ENTRY_POINTS)))

    def reward_names(self) -> list[str]:
        """Every reward a job may name: declared here, or named by an installed entry point."""
        return sorted(set(self._rewards) | set(_entry_points(REWARD_ENTRY_POINTS)))

    def lookup_env(self, name: str) -> EnvEntry:
        """The env called `name`: a registered name, an entry point, or an import path of a class."""
        if is_import_path(name):
            return _env_entry(_resolve(name, "env"), name)
        if name not in self._envs:
            point = _entry_points(ENV_ENTRY_POINTS).get(name)
            if point is None:
                raise UnknownComponentError(
                    f"unknown env {name!r}; registered envs: {', '.join(self.env_names()) or '(none)'}"
                    " — or give an import path such as 'mypkg.envs:MyEnv'"
                )
            self.add_env(replace(_env_entry(_load(point, "env"), name), name=name))  # the entry point's name wins
        return self._envs[name]

    def lookup_reward(self, name: str) -> RewardEntry:
        """The reward called `name`: a registered name, an entry point, or an import path of a function."""
        if is_import_path(name):
            return _reward_entry(_resolve(name, "reward"), name)
        if name not in self._rewards:
            point = _entry_points(REWARD_ENTRY_POINTS).get(name)
            if point is None:
                raise UnknownComponentError(
                    f"unknown reward {name!r}; registered rewards: {', '.join(self.reward_names()) or '(none)'}"
                    " — or give an import path such as 'mypkg.rewards:my_reward'"
                )
            self.add_reward(replace(_reward_entry(_load(point, "reward"), name), name=name))
        return self._rewards[name]


registry = Registry()
"""The process-wide registry the decorators write to."""


def env(
    name: str,
    *,
    pool: str = Pool.CPU.value,
    reset_timeout: float = 30.0,
    step_timeout: float = 30.0,
) -> Callable[[type[T]], type[T]]:
    """Declare an env class under `name`; its sessions live on `pool` workers (default "cpu").

    `pool` is one whose workers keep env sessions: "cpu" or another env pool a job declares (`sandbox`), or a
    generation pool ("h800", "h20") for an env that needs that hardware (its sessions then live beside the
    engine). Tasks route the env's activities there (`TaskSpec.env_queue`); a job using the env checks that
    it declares the pool with such a role.
    """
    if reset_timeout <= 0 or step_timeout <= 0:
        raise ValueError(f"env {name!r}: timeouts must be positive")
    session_pool = _env_pool(name, pool)

    def declare(cls: type[T]) -> type[T]:
        entry = EnvEntry(
            name=name, cls=cls, pool=session_pool, reset_timeout_s=reset_timeout, step_timeout_s=step_timeout
        )
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


def declared_env_pool(name: str) -> str | None:
    """The pool env `name` declares, or None when it cannot be looked up in this process (a debug log says why).

    Used where a job spec is loaded: an env only the workers can import keeps the default pool.
    """
    try:
        return lookup_env(name).pool
    except Exception as e:  # unknown here, not importable here, not a class: the job check reports it
        log.debug("env %r: no declared pool in this process (%s); its sessions go to the default pool", name, e)
        return None


def declared_reward_serverless(name: str) -> bool | None:
    """Whether reward `name` may run on the serverless pool, or None when it cannot be looked up here."""
    try:
        return lookup_reward(name).serverless
    except Exception as e:  # as for envs: the job check reports it
        log.debug("reward %r: no declaration in this process (%s); its task's reward_placement applies", name, e)
        return None


def _env_pool(name: str, pool: str) -> str:
    """The declared pool, refused at once when it cannot be a pool's name or is a default pool whose workers
    cannot hold env sessions (another name is checked against the declaration of each job that uses the env)."""
    pool = str(pool)
    default = DEFAULT_POOLS.get(pool)
    if re.match(POOL_NAME_PATTERN, pool) is None or (default is not None and default.role not in SESSION_ROLES):
        allowed = ", ".join(p for p, spec in DEFAULT_POOLS.items() if spec.role in SESSION_ROLES)
        raise ValueError(
            f"env {name!r}: pool {pool!r} cannot hold env sessions (its workers are stateless, "
            f"busy training, or run workflows only); use one of: {allowed}, or an env pool a job declares"
        )
    return pool


def _entry_points(group: str) -> dict[str, EntryPoint]:
    """The installed entry points of `group`, by name."""
    return {point.name: point for point in entry_points(group=group)}


def _load(point: EntryPoint, kind: str) -> Any:
    try:
        return point.load()
    except (ImportError, AttributeError) as e:
        raise UnknownComponentError(f"{kind} {point.name!r} (entry point {point.value!r}) cannot be loaded: {e}") from e


def _env_entry(obj: Any, name: str) -> EnvEntry:
    """The declaration of an env class (its `@env`), or a plain class under `name` with the defaults."""
    declared = getattr(obj, "__rollart_env__", None)
    if isinstance(declared, EnvEntry):
        return declared
    _check_env_class(obj, name)
    return EnvEntry(name=name, cls=obj)


def _reward_entry(obj: Any, name: str) -> RewardEntry:
    """The declaration of a reward (its `@reward`), or a plain function under `name` with the defaults."""
    declared = getattr(obj, "__rollart_reward__", None)
    if isinstance(declared, RewardEntry):
        return declared
    _check_reward_fn(obj, name)
    return RewardEntry(name=name, fn=obj)


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
            raise TypeError(
                f"reward {name!r} ({_qualname(obj)}) must be a function taking a Transcript, or a "
                "reward-model class with a classmethod from_args(**reward_args) that loads it and "
                "__call__(transcript) that scores"
            )
        return
    if not callable(obj):
        raise TypeError(f"reward {name!r} must be a function taking a Transcript, got {obj!r}")
    params = [p for p in inspect.signature(obj).parameters.values() if p.default is inspect.Parameter.empty]
    if len(params) != 1:
        raise TypeError(f"reward {name!r} ({_qualname(obj)}) must take exactly one argument (the Transcript)")


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"
