"""What the UI tests do with a checkpoint page through Starlette's TestClient."""

from __future__ import annotations

import io
import re
import tarfile
from typing import Any


def verify_and_archive(client: Any, uuid: str, extract_to: str | None = None) -> list[str]:
    """POSTs the checkpoint page's verify form (with its CSRF token) and asserts it passed, then
    downloads the checkpoint's archive; returns the archive's names (extracted into
    ``extract_to`` when given)."""
    html = client.get(f"/checkpoints/{uuid}").text
    csrf = re.search(r'name="csrf" value="([^"]+)"', html).group(1)
    verified = client.post(f"/checkpoints/{uuid}/verify", data={"csrf": csrf})
    assert verified.status_code == 200 and 'class="ok"' in verified.text
    response = client.get(f"/checkpoints/{uuid}/archive.tar")
    assert response.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(response.content)) as tar:
        if extract_to is not None:
            tar.extractall(extract_to, filter="data")
        return tar.getnames()
