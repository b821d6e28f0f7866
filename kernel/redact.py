"""Secrets out of logs and saved configs: a URL's password and the values of secret-named keys
become ``'***'``.

A run writes its whole config to ``config.json`` (and recipes log the endpoints they call), so
whatever a user puts in ``recipe_args`` or an environment URL would otherwise land on disk and
in terminals. A key is secret when one of its ``_``/``-``/``.``-separated words is ``token``,
``password``, ``passwd``, ``secret`` or ``apikey``, or it contains ``api_key`` (so ``hf_token``
and ``openai_api_key`` are hidden, ``max_tokens`` and ``tokenizer`` are not).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

MASK = "***"
_SECRET_WORDS = frozenset({"token", "password", "passwd", "secret", "apikey"})


def is_secret_key(key: str) -> bool:
    """Whether a config key names a secret (see the module docstring)."""
    key = key.lower()
    return "api_key" in key or not _SECRET_WORDS.isdisjoint(re.split(r"[_\-.]", key))


def redact_url(url: str) -> str:
    """``url`` with its password (``user:password@host``) replaced by ``***``; a URL without a
    password, or any other string, is returned unchanged."""
    if "://" not in url:
        return url
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
    except ValueError:  # unparsable (a bad IPv6 host): it may still hold a secret
        return MASK
    userinfo, _, host = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{userinfo.partition(':')[0]}:{MASK}@{host}"))


def redact(value: Any) -> Any:
    """A copy of ``value`` (JSON-like: dicts, lists, strings) with secret-named keys' values
    (unless None) and URL passwords replaced by ``***``."""
    if isinstance(value, dict):
        return {
            k: MASK if is_secret_key(str(k)) and v is not None else redact(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return type(value)(redact(v) for v in value)
    if isinstance(value, str):
        return redact_url(value)
    return value
