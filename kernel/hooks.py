"""Plug-in hooks: load a recipe's functions by dotted path, and the protocols they follow.

A recipe provides two hooks, each with exactly one signature:

- ``async def generate(ctx: RolloutContext, sample: Sample) -> list[Sample | None]`` rolls out
  one episode seeded by ``sample`` (prompt, label, group) and returns every agent's samples
  (None for an agent that never spoke: the rollout drops it).
- ``def reward(ctx: RolloutContext, samples: list[Sample]) -> float | dict[str, float | None]
  | list[float | None] | None`` scores one episode: a float applies to every sample of it, a
  dict gives one reward per agent (bilateral rewards), a list one per sample (in order), None
  means "does not apply". It may also be ``async def``.

New inputs for hooks go on ``RolloutContext``, never into new call shapes. Paths are resolved
at start-up (``load_function``) so a typo fails before any process or GPU is touched.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import inspect
import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pydantic import TypeAdapter, ValidationError

from kernel.dialogue import Agent
from kernel.sample import Sample


class HookError(ValueError):
    """A dotted path does not resolve to a usable function; the message names the path."""


@dataclass
class RolloutContext:
    """Everything a hook may use, handed to every call. Extend here, not in signatures."""

    agents: Mapping[str, Agent] = field(default_factory=dict)  # name -> the agent (its engines)
    config: Any = None  # the recipe's own config (its RecipeConfig, or the recipe_args dict)
    step: int = 0
    envs: Mapping[str, Any] = field(default_factory=dict)  # name -> kernel.env.EnvSpec
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    """What a hook started for the run (a server, a pool): each is awaited once when the run
    ends, before its engines stop (``kernel.gateway`` closes its server so)."""


class GenerateFn(Protocol):
    """One episode from a seed sample: its samples, one per agent turn trained on. A None
    entry (an agent that never spoke, ``Dialogue.sample``) is dropped by the rollout."""

    def __call__(self, ctx: RolloutContext, sample: Sample) -> Awaitable[list[Sample | None]]: ...


RewardResult = float | dict[str, float | None] | list[float | None] | None


class RewardFn(Protocol):
    def __call__(
        self, ctx: RolloutContext, samples: list[Sample]
    ) -> RewardResult | Awaitable[RewardResult]: ...


@functools.cache
def load_function(path: str, n_args: int | None = None, must_be_async: bool = False) -> Callable:
    """Resolve ``package.module.function``; check it is callable with ``n_args`` positionals.

    Cached, so every caller gets the same object and the import happens once.
    """
    module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise HookError(f"{path!r} is not a dotted path like 'package.module.function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise HookError(f"cannot import module {module_name!r} of hook {path!r}: {e}") from e
    try:
        fn = getattr(module, attr)
    except AttributeError:
        raise HookError(
            f"module {module_name!r} has no attribute {attr!r} (hook {path!r})"
        ) from None
    if not callable(fn):
        raise HookError(f"hook {path!r} is a {type(fn).__name__}, not a function")
    if must_be_async and not inspect.iscoroutinefunction(fn):
        raise HookError(f"hook {path!r} must be 'async def'")
    if n_args is not None:
        try:
            inspect.signature(fn).bind(*([None] * n_args))
        except TypeError as e:
            raise HookError(f"hook {path!r} must accept {n_args} positional arguments: {e}") from e
    return fn


def load_recipe_config(path: str | None, args: Mapping[str, Any]) -> Any:
    """Build the recipe's config dataclass at ``path`` from ``args`` and validate it.

    None -> ``dict(args)``. Unknown or ill-typed keys fail naming the key and the path.
    """
    if path is None:
        return dict(args)
    return _built(load_function(path), args, path)


def _built(cls: type, args: Mapping[str, Any], where: str) -> Any:
    """``cls(**args)``, each value first read as its field's type (``as_field_types``: the flag
    ``--recipe_args.max_turns 3`` arrives as the string "3" and is the int 3; a string field
    keeps "1" a string), so a wrong type fails naming the key, not inside ``validate``."""
    try:
        typed = as_field_types(cls, args)
    except FieldTypeError as e:
        raise HookError(
            f"recipe_args.{e.key}: {e.value!r} does not fit {where}.{e.key} ({e.reason})"
        ) from None
    try:
        config = cls(**typed)
    except TypeError as e:  # an unknown or missing key, named by the dataclass
        raise HookError(f"recipe_args do not fit {where}: {e}") from e
    if hasattr(config, "validate"):
        config.validate()
    return config


class FieldTypeError(ValueError):
    """A value that does not fit its dataclass field's type: the field's ``key``, the
    ``value``, the type ``expected`` (as written) and pydantic's ``reason``."""

    def __init__(self, key: str, value: Any, expected: str, reason: str) -> None:
        super().__init__(f"{key}: {value!r} is not a valid {expected} ({reason})")
        self.key, self.value, self.expected, self.reason = key, value, expected, reason


def as_field_types(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` each read as the type of ``cls``'s field of that key (pydantic, lax: the YAML
    or flag string "1e-5" is a float, "fast" is not); a key that is no field, or a class whose
    hints do not resolve, passes its value as given. FieldTypeError names the first misfit."""
    hints: dict[str, Any] = {}
    if dataclasses.is_dataclass(cls):
        try:
            hints = typing.get_type_hints(cls)
        except Exception:  # a hint naming what the module cannot resolve at run time
            hints = {}
    typed = dict(values)
    for key, value in values.items():
        if key not in hints:
            continue
        try:
            typed[key] = TypeAdapter(hints[key]).validate_python(value)
        except ValidationError as e:
            hint = hints[key]
            expected = hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")
            raise FieldTypeError(key, value, expected, e.errors()[0]["msg"]) from None
    return typed


def recipe_config(value: Any, cls: type) -> Any:
    """``ctx.config`` as the recipe's config class ``cls``: the object the kernel built, or,
    in a run with no config class, built (and validated) from the recipe_args dict it hands
    over instead (None: the defaults), as ``load_recipe_config`` builds it."""
    if isinstance(value, cls):
        return value
    if value is None or isinstance(value, Mapping):
        return _built(cls, value or {}, cls.__qualname__)
    raise TypeError(
        f"ctx.config must be a {cls.__qualname__} or a dict, got {type(value).__name__}"
    )


def recipes_root() -> Path | None:
    """The folder of the importable ``recipes`` package (wherever it is installed or on the
    path), or None when there is none: recipes are found by import, not by this checkout."""
    try:
        spec = importlib.util.find_spec("recipes")
    except ModuleNotFoundError:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def package_file(path: str) -> str:
    """``path`` itself when it exists or is absolute; else, a path relative to the folder that
    holds the ``kernel`` or the ``recipes`` package (presets name their data files so:
    ``recipes/takes_two/data/train.jsonl``) when the file is there."""
    if not path or Path(path).is_absolute() or Path(path).exists():
        return path
    roots = [Path(__file__).resolve().parent.parent]
    if (found := recipes_root()) is not None:
        roots.insert(0, found.parent)
    for root in roots:
        if (root / path).exists():
            return str(root / path)
    return path


def default_recipe_config(recipe: str) -> str | None:
    """``recipes.<recipe>.config.RecipeConfig`` if the recipe has that module, else None."""
    name = f"recipes.{recipe}.config"
    try:
        return f"{name}.RecipeConfig" if importlib.util.find_spec(name) else None
    except ModuleNotFoundError:  # no such recipe package
        return None


def load_generate(path: str) -> GenerateFn:
    """The recipe's ``async def generate(ctx, sample) -> list[Sample | None]``."""
    return load_function(path, n_args=2, must_be_async=True)


def load_reward(path: str) -> RewardFn:
    """The recipe's ``reward(ctx, samples)`` (sync or async)."""
    return load_function(path, n_args=2)


async def call_reward(fn: RewardFn, ctx: RolloutContext, samples: list[Sample]) -> RewardResult:
    """Call a reward hook, awaiting it if it is async."""
    out = fn(ctx, samples)
    return await out if inspect.isawaitable(out) else out
