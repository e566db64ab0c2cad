"""Issue 39, finding 7: a script that enters ``core.init()`` and ends without leaving it used to
hang at exit: closing at interpreter shutdown wrote the trial state through a registry call
that started a thread, which Python 3.11 never starts then. Now one watcher thread serves
every registry call, and the process exits."""

from __future__ import annotations

import subprocess
import sys
import threading

from ckptstore.registry import Registry
from tests._helpers.fresh_home import fresh_home_env

SCRIPT = """
import ckptstore
opened = ckptstore.core.init(preempt_signals=False)
context = opened.__enter__()
with context.checkpoint.store_path({"steps_completed": 1}) as (path, uuid):
    (path / "notes.txt").write_text("x")
print("ending with the context open", flush=True)
"""


def test_a_context_left_open_at_exit_closes_without_hanging(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=fresh_home_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with Registry(f"sqlite:///{tmp_path / 'registry.db'}") as registry:
        assert len(registry.checkpoint_records(trial_id=1)) == 1
        assert registry.get_trial(1).state != "ACTIVE"  # closed: its end was recorded


def test_registry_calls_share_one_watcher_thread(tmp_path):
    with Registry(f"sqlite:///{tmp_path / 'r.db'}") as registry:
        registry.ensure_trial(1)
        before = {t.ident for t in threading.enumerate()}
        for _ in range(20):
            registry.get_trial(1)
        started = {t.ident for t in threading.enumerate()} - before
    assert not started
    assert sum(t.name == "ckptstore-registry-wait" for t in threading.enumerate()) <= 1
