"""Runs one documentation page's examples in order (``python -m tests.docs.run_page PAGE``).

Started by tests/docs/test_examples.py in the page's working folder; see tests/docs/examples.py
for the conventions. Prints ``ran N`` on success; on failure names the page and line.
"""

from __future__ import annotations

import subprocess
import sys
import traceback
from pathlib import Path

from tests.docs.examples import DOCS, blocks_of


def main(page: str) -> int:
    namespace: dict[str, object] = {"__name__": "__main__"}
    ran = 0
    for block in blocks_of(DOCS / page):
        where = f"{block.page}:{block.line}"
        if block.kind == "file":
            Path(block.title).parent.mkdir(parents=True, exist_ok=True)
            Path(block.title).write_text(block.code)
            continue
        if block.kind not in ("python", "bash"):
            continue
        print(f"--- {where} ({block.kind})", flush=True)
        if block.kind == "python":
            try:
                exec(compile(block.code, where, "exec"), namespace)  # noqa: S102 - the docs' own code
            except BaseException:  # noqa: BLE001 - reported with the page and line
                traceback.print_exc()
                print(f"FAILED: {where}", flush=True)
                return 1
        else:
            done = subprocess.run(["bash", "-euo", "pipefail", "-c", block.code], check=False)
            if done.returncode != 0:
                print(f"FAILED: {where} exited {done.returncode}", flush=True)
                return 1
        ran += 1
    print(f"ran {ran}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
