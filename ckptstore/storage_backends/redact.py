"""Keep credentials out of the DEBUG logs of the SDKs ckptstore drives.

botocore logs each request with its ``Authorization`` header (which names the access key id)
and urllib3 logs each URL with its query string (which holds an Azure SAS ``sig``). The masking
filter of :mod:`ckptstore.masking` (the one rule for secrets) goes on those loggers, so it
rewrites such records before any handler sees them.

Example::

    from ckptstore.storage_backends.redact import install, redact
    install()
    redact("Credential=AKIA123/2024 sig=abc&se=1")  # 'Credential=***/2024 sig=***&se=1'
"""

from __future__ import annotations

from ckptstore.masking import MaskingFilter as RedactingFilter
from ckptstore.masking import install_log_filter
from ckptstore.masking import mask_text as redact

__all__ = ["LOGGERS", "RedactingFilter", "install", "redact"]

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


def install() -> None:
    """Add the masking filter to the SDK loggers (idempotent)."""
    install_log_filter(LOGGERS)
