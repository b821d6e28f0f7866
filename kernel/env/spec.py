"""``EnvSpec``: one environment of a run (``TrainConfig.environments``, ``ctx.envs[name]``),
played in this process or, with ``url``, on an environment server (``kernel.env``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from kernel.env import API_KEY_ENV, Environment
from kernel.env.client import RemoteEnvironment
from kernel.hooks import HookError, load_function

KNOWN = {
    "math": "recipes.math_solver_verifier.env.MathEnv",
    "code": "recipes.code_pair.env.CodeEnv",
    "tools": "kernel.env.tools.ToolEnv",
}
"""Short names of the recipes' environments (``--environments math,code``)."""


@dataclass
class EnvSpec:
    """One environment of a run: where it is played and how it is built."""

    name: str
    """What recipes call it (``ctx.envs[name]``) and a data row names in its ``env`` column."""
    path: str | None = None
    """Dotted path of its class (or factory) called with ``args`` once per episode (default:
    ``KNOWN[name]``); building one must be cheap: it holds nothing until its reset."""
    args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the class (e.g. the math scorer's ``format_penalty``)."""
    url: str | None = None
    """A ``kernel env serve`` server that hosts it (None: played in this process). The server
    builds it from its own ``--environments`` settings; ``path`` and ``args`` here are unused."""
    api_key: str | None = None
    """The server's key (default: the TANDEM_API_KEY environment variable)."""
    timeout_s: float = 60.0
    """Longest wait for one reset or step of a remote environment."""

    def validate(self) -> EnvSpec:
        if not self.name or "/" in self.name:
            raise ValueError(f"environments: {self.name!r} is not a usable environment name")
        if self.timeout_s <= 0:
            raise ValueError(f"environments[{self.name!r}].timeout_s must be > 0")
        if self.url is None:  # a wrong path or args fail here, before anything starts
            make = self.factory()
            try:
                make(**self.args)  # built, never reset: an environment holds nothing until reset
            except (TypeError, ValueError) as e:
                raise ValueError(
                    f"environments[{self.name!r}].args do not fit {make.__qualname__}: {e}"
                ) from None
        elif not self.url.startswith(("http://", "https://")):
            raise ValueError(
                f"environments[{self.name!r}].url must be http(s)://, got {self.url!r}"
            )
        return self

    def factory(self):
        """The class or factory of a local environment."""
        path = self.path or KNOWN.get(self.name)
        if path is None:
            raise ValueError(
                f"environments[{self.name!r}]: no path given and no known environment of that "
                f"name (known: {', '.join(sorted(KNOWN))})"
            )
        try:
            return load_function(path)
        except HookError as e:
            raise ValueError(f"environments[{self.name!r}].path: {e}") from None

    def open(self) -> Environment:
        """A new episode's environment, not yet reset."""
        if self.url is not None:
            key = self.api_key if self.api_key is not None else os.environ.get(API_KEY_ENV)
            return RemoteEnvironment(self.url, self.name, key or None, self.timeout_s)
        return self.factory()(**self.args)

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[Environment]:
        """``open`` for one episode, closed at the end whatever happens."""
        env = self.open()
        try:
            yield env
        finally:
            await env.close()


def env_specs(settings: Mapping[str, Any]) -> dict[str, EnvSpec]:
    """``TrainConfig.environments`` (name -> {path, args, url, api_key, timeout_s}) as checked
    specs; a key that is not a field is named."""
    specs = {}
    for name, value in settings.items():
        value = dict(value or {})
        known = set(EnvSpec.__dataclass_fields__) - {"name"}
        if unknown := sorted(set(value) - known):
            raise ValueError(
                f"environments[{name!r}]: unknown key(s) {unknown} (known: {sorted(known)})"
            )
        specs[name] = EnvSpec(name=name, **value).validate()
    return specs
