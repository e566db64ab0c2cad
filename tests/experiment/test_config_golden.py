"""Every problem the experiment config reported before its rules moved next to their sections
(issue 43) is still reported with the same error type and message.

``golden/config_errors.jsonl`` was recorded from the code before the move (commit 6f4d1a6): one
line per distinct (error type, message) seen over 9,872 configs (the config tests' inputs, the
repo's YAMLs, and each valid one with one key removed, replaced by a wrong value or misspelt),
each with the smallest config that still gave exactly that error. A config with several problems
may now name another of them first (docs/determined-compat.md says which comes first); these
golden configs are each reduced to the problem they record.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from ckptstore import errors
from ckptstore.experiment.config import parse_config

GOLDEN = Path(__file__).parent / "golden" / "config_errors.jsonl"


def _outcome(config: object) -> tuple[str, str] | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ignored-key warnings are not the point here
            parse_config(config)
    except errors.InvalidConfig as exc:
        return type(exc).__name__, str(exc)
    return None


def test_every_recorded_config_problem_keeps_its_error_type_and_message():
    rows = [json.loads(line) for line in GOLDEN.read_text().splitlines()]
    assert len(rows) > 400
    changed = [
        (row["config"], (row["error"], row["message"]), got)
        for row in rows
        if (got := _outcome(row["config"])) != (row["error"], row["message"])
    ]
    assert changed == [], f"{len(changed)} of {len(rows)} changed; first: {changed[:2]}"
