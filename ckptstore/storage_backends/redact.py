"""Keep credentials out of the DEBUG logs of the SDKs ckptstore drives.

botocore logs each request with its ``Authorization`` header (which names the access key id)
and urllib3 logs each URL with its query string (which holds an Azure SAS ``sig``). A filter on
those loggers rewrites such records before any handler sees them.

Example::

    from ckptstore.storage_backends.redact import install, redact
    install()
    redact("Credential=AKIA123/2024 sig=abc&se=1")  # 'Credential=<redacted>/2024 sig=<redacted>&se=1'
"""

from __future__ import annotations

import logging
import re

_PATTERNS = (
    (re.compile(r"(Credential=)[^/,\s'\"]+"), r"\1<redacted>"),
    (re.compile(r"(Signature=)[0-9a-fA-F]+"), r"\1<redacted>"),
    (re.compile(r"([?&;]sig=)[^&\s'\"]+", re.IGNORECASE), r"\1<redacted>"),
    (re.compile(r"(AccountKey=)[^;\s'\"]+", re.IGNORECASE), r"\1<redacted>"),
    (re.compile(r"(SharedAccessSignature=)[^;\s'\"]+", re.IGNORECASE), r"\1<redacted>"),
    (re.compile(r"(X-Amz-Credential=)[^&\s'\"]+", re.IGNORECASE), r"\1<redacted>"),
    (
        re.compile(
            r"(X-Amz-Security-Token=|x-amz-security-token['\"]?:\s*b?['\"])[^&\s'\"]+",
            re.IGNORECASE,
        ),
        r"\1<redacted>",
    ),
)

#: Loggers whose records can carry request lines or headers.
LOGGERS = (
    "botocore.endpoint",
    "botocore.auth",
    "botocore.awsrequest",
    "botocore.parsers",
    "botocore.hooks",
    "botocore.retryhandler",
    "urllib3.connectionpool",
    "azure.core.pipeline.policies.http_logging_policy",
)


def redact(text: str) -> str:
    """``text`` with access key ids, signatures, SAS ``sig`` values and account keys hidden."""
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


class RedactingFilter(logging.Filter):
    """Rewrites a record's message with :func:`redact` (never drops a record)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - leave unformattable records to the handler
            return True
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


_FILTER = RedactingFilter()


def install() -> None:
    """Add the filter to the SDK loggers (idempotent)."""
    for name in LOGGERS:
        log = logging.getLogger(name)
        if _FILTER not in log.filters:
            log.addFilter(_FILTER)
