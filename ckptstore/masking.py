"""The one rule for hiding secrets in what ckptstore shows: pages, reports, logs, errors and
``--json`` output.

A value is hidden (replaced by :data:`MASK`) when it is

- under a secret-named key of a mapping (:func:`is_secret_name`: ``password``, ``secret``,
  ``token``, ``api_key``, ``*_private_key``, ``wandb_api_key``, ``Authorization``, ...);
- the value of a ``NAME=value`` or ``NAME: value`` text whose NAME is secret-named, which
  covers Determined's ``environment.environment_variables: ["AWS_SECRET_ACCESS_KEY=..."]``,
  query strings (``?password=...&sig=...``), headers and the repr of a dict;
- the password of a URL in user-info form (``postgresql://me:PASSWORD@db/ckpts``);
- a credential in the shapes the cloud SDKs log (``Credential=AKIA.../``, ``Signature=<hex>``,
  ``AccountKey=...``);
- every value under a config's ``environment_variables`` key (Determined's
  ``environment.environment_variables``, a list of ``NAME=value`` or a list per accelerator),
  whatever its name: trials receive them as their environment, and a name such as
  ``DATABASE_URL`` or ``HF_HUB`` says nothing about whether its value is a secret. The names
  stay visible (``NAME=***``).

The keys of a checkpoint's file listing (a mapping under ``resources`` or ``files``: file path
-> size or entry) are file names, not names of settings: ``model.sig`` or ``secrets/vocab.txt``
is a file, its size stays a number, and only its values are looked at.

Names ending in ``_id``, ``_path``, ``_file``, ``_env``, ``_count``, ... name, locate or
measure a secret without holding it (``AWS_ACCESS_KEY_ID``, ``private_key_path``) and stay
visible.

Example::

    from ckptstore import masking

    masking.mask_text("postgresql://me:pw@db/x?password=pw2")  # 'postgresql://me:***@db/x?password=***'
    masking.mask_value({"env": ["WANDB_API_KEY=abc", "SEED=1"], "token": "t"})
    # {'env': ['WANDB_API_KEY=***', 'SEED=1'], 'token': '***'}
"""

from __future__ import annotations

import functools
import itertools
import logging
import re
from collections.abc import Iterable, Mapping
from typing import TypeVar

__all__ = [
    "ENVIRONMENT_KEY",
    "FILE_LISTING_KEYS",
    "MASK",
    "MaskingFilter",
    "install_log_filter",
    "is_secret_name",
    "mask_text",
    "mask_value",
]

T = TypeVar("T")

#: What a hidden value is replaced with.
MASK = "***"

#: Words that make a name secret on their own.
_SECRET_WORDS = frozenset(
    {
        "password",
        "passwd",
        "passphrase",
        "secret",
        "secrets",
        "token",
        "credential",
        "credentials",
        "authorization",
        "cookie",
        "sas",
        "sig",
        "apikey",
        "privatekey",
        "accesskey",
        "accountkey",
        "secretkey",
        "connectionstring",
        "accesstoken",
        "authtoken",
    }
)
#: Words that make a following ``key`` a secret (``api_key``, ``ssh_private_key``).
_KEY_QUALIFIERS = frozenset(
    {"api", "private", "access", "account", "secret", "client", "signing", "encryption"}
    | {"master", "auth", "storage", "shared", "ssh", "sas"}
)
#: Last words of names that point at or measure a secret without holding it.
_POINTER_WORDS = frozenset(
    {"id", "ids", "path", "file", "env", "name", "type", "length", "count", "size"}
)
_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")

_NAME = r"[A-Za-z_][\w.\-]*"
#: The look-behinds start a match only at the start of a word: linear time on long text.
_USERINFO_PASSWORD = re.compile(
    r"(?<![\w+.\-])(?P<head>[A-Za-z][\w+.\-]*://[^\s/@:]*):(?P<pw>[^\s/]*)@"
)
#: ``NAME=``, ``NAME:``, ``'NAME': `` (a whole name: not preceded by a name character).
_ASSIGNMENT = re.compile(rf"(?<![\w.\-])(?P<name>{_NAME})[\"']?\s*[:=]\s*")
#: The value after a secret name: a quoted one ends at its quote, a bare one at a separator of
#: query strings, lists and headers (a ``Bearer``/``Basic`` scheme word is part of it).
_VALUE = re.compile(
    r"(?P<quote>[\"'])[^\"']*(?P=quote)|(?:(?:bearer|basic|token)\s+)?[^\s&;,\"'}\])]+",
    re.IGNORECASE,
)
_ENV_ASSIGNMENT = re.compile(rf"\s*(?P<name>{_NAME})\s*=(?P<value>.*)", re.DOTALL)
#: What botocore and the Azure SDK put in their debug logs (not ``NAME=value`` shaped).
_SDK_PATTERNS = (
    re.compile(r"(Credential=)[^/,\s'\"]+"),
    re.compile(r"(Signature=)[0-9a-fA-F]+"),
    re.compile(r"(AccountKey=)[^;\s'\"]+", re.IGNORECASE),
    re.compile(r"(SharedAccessSignature=)[^;\s'\"]+", re.IGNORECASE),
    re.compile(r"(x-amz-security-token['\"]?:\s*b?['\"])[^&\s'\"]+", re.IGNORECASE),
)


def is_secret_name(name: object) -> bool:
    """Whether a key or variable called ``name`` holds a secret (see the module docstring)."""
    return _is_secret_name(str(name))


@functools.lru_cache(maxsize=4096)  # the same few names recur in every row and log line
def _is_secret_name(name: str) -> bool:
    words = [w.lower() for w in _WORDS.findall(name)]
    if not words or words[-1] in _POINTER_WORDS:
        return False
    if any(w in _SECRET_WORDS for w in words):
        return True
    return any(
        prev + w in _SECRET_WORDS or (w == "key" and prev in _KEY_QUALIFIERS)
        for prev, w in itertools.pairwise(words)
    )


def _mask_assignments(text: str) -> str:
    out, pos = [], 0
    # A scan rather than one re.sub: after a name that is not secret the scan resumes right
    # after its separator, so "a: Authorization: Bearer x" still finds the second name.
    while (found := _ASSIGNMENT.search(text, pos)) is not None:
        out.append(text[pos : found.end()])
        pos = found.end()
        value = _VALUE.match(text, pos) if is_secret_name(found.group("name")) else None
        if value is not None:
            quote = value.group("quote") or ""
            out.append(f"{quote}{MASK}{quote}")
            pos = value.end()
    out.append(text[pos:])
    return "".join(out)


def mask_text(text: str) -> str:
    """``text`` with URL passwords, secret ``NAME=value`` / ``NAME: value`` values and SDK
    credentials replaced by :data:`MASK`."""
    if not isinstance(text, str) or not text:
        return text
    text = _USERINFO_PASSWORD.sub(rf"\g<head>:{MASK}@", text)
    for pattern in _SDK_PATTERNS:
        text = pattern.sub(rf"\g<1>{MASK}", text)
    return _mask_assignments(text)


def _empty(value: object) -> bool:
    return value is None or (isinstance(value, str) and not value)


#: The config key whose every value is hidden (see the module docstring).
ENVIRONMENT_KEY = "environment_variables"
#: Keys whose mapping is a file listing: its keys are file paths (see the module docstring).
FILE_LISTING_KEYS = frozenset({"resources", "files"})


def _mask_file_listing(value: object) -> object:
    if isinstance(value, Mapping):
        return {k: mask_value(v) for k, v in value.items()}
    return mask_value(value)


def _mask_item(key: object, value: object) -> object:
    if key == ENVIRONMENT_KEY:
        return _mask_environment(value)
    if key in FILE_LISTING_KEYS:
        return _mask_file_listing(value)
    return MASK if is_secret_name(key) and not _empty(value) else mask_value(value)


def _mask_environment(value: object) -> object:
    """``NAME=value`` entries (in lists, or lists under accelerator names) as ``NAME=***``."""
    if isinstance(value, Mapping):
        return {k: _mask_environment(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_mask_environment(v) for v in value)
    if isinstance(value, str):
        env = _ENV_ASSIGNMENT.fullmatch(value)
        return f"{env.group('name')}={MASK}" if env else MASK
    return value if _empty(value) else MASK


def mask_value(value: T) -> T:
    """``value`` (a config, metadata, hparams, a ``--json`` record) with the secrets of
    :func:`mask_text`, every value under a secret-named key and every environment variable
    of an ``environment_variables`` key hidden; a new object, the argument is not changed."""
    if isinstance(value, Mapping):
        return {k: _mask_item(k, v) for k, v in value.items()}  # type: ignore[return-value]
    if isinstance(value, list | tuple):
        return type(value)(mask_value(v) for v in value) if not hasattr(value, "_fields") else value
    if isinstance(value, str):
        env = _ENV_ASSIGNMENT.fullmatch(value)
        if env and is_secret_name(env.group("name")):  # "AWS_SECRET_ACCESS_KEY=a b c"
            return f"{env.group('name')}={MASK}"  # type: ignore[return-value]
        return mask_text(value)  # type: ignore[return-value]
    return value


class MaskingFilter(logging.Filter):
    """Rewrites a record's message with :func:`mask_text` (never drops a record)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - leave unformattable records to the handler
            return True
        cleaned = mask_text(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


_FILTER = MaskingFilter()


def install_log_filter(
    loggers: Iterable[str] = (), handlers: Iterable[logging.Handler] = ()
) -> None:
    """Add the masking filter to the named loggers (it sees only records logged on them, not on
    their children) and to ``handlers`` (they see every record they emit); idempotent."""
    targets: list[logging.Filterer] = [logging.getLogger(name) for name in loggers]
    for target in [*targets, *handlers]:
        if _FILTER not in target.filters:
            target.addFilter(_FILTER)
