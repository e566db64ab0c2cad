"""What ckptstore's part of a resume's ``begin`` phase is made of (issue 41), part by part.

``resume_phases.py``'s ``begin`` runs from ``fit()``'s start to the first ``on_train_begin``:
``core.init`` and the callback's creation. This script resumes one of ``peers.py``'s stores
(``--work``, written by its train phase) in this process and gives each part its process CPU
seconds (``time.process_time``, all threads): the imports ``core.init`` and the callback make
(SQLAlchemy first), then ``core.init``'s steps (registry open, the trial and its latest
checkpoint, trial state, heartbeat, ``CheckpointContext``, the other contexts), each wrapped by
a timer, and ``begin``'s total. Keras's own share of ``begin`` is the total less the parts.

    .venv/bin/python benchmarks/peers.py --worker ckptstore --regime a --phase train \\
        --work /tmp/w --mb 8 --epochs 1
    .venv/bin/python benchmarks/resume_begin.py --work /tmp/w --mb 8 --rounds 3
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

IMPORTS = ("sqlalchemy", "ckptstore.registry", "ckptstore.core", "ckptstore.keras")
#: (module, attribute) of each timed step of ``core.init`` and the callback
STEPS = (
    ("ckptstore.core._context", "check_reachable"),
    ("ckptstore.registry", "open_registry"),
    ("ckptstore.core._context", "_resolve_trial"),
    ("ckptstore.registry.registry", "Registry.set_trial_state"),
    ("ckptstore.core._context", "Heartbeat"),
    ("ckptstore.checkpointing", "CheckpointContext"),
    ("ckptstore.core._context", "PreemptContext"),
    ("ckptstore.core._context", "TrainContext"),
    ("ckptstore.core._context", "SearcherContext.from_env"),
    ("ckptstore.core._context", "_open_context"),
    ("ckptstore.checkpointing.context", "CheckpointContext.latest_checkpoint"),
    ("ckptstore.keras", "DeterminedCallback"),
)


def _timed(spent: dict[str, float], label: str, fn):  # type: ignore[no-untyped-def]
    def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
        start = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[label] = spent.get(label, 0.0) + time.process_time() - start

    return timed


def split(args) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """One resume's ``begin`` in this process, part by part."""
    import incremental
    import keras
    import peers

    import ckptstore  # noqa: F401 - imported by the script before fit(), as users do

    x, y = incremental.data()
    model = incremental.build(args.mb, args.regime == "a")
    spent: dict[str, float] = {}
    start = time.process_time()
    for name in IMPORTS:
        before = time.process_time()
        importlib.import_module(name)
        spent[f"import {name}"] = time.process_time() - before
    for module_name, attr in STEPS:
        owner_name, _, name = attr.rpartition(".")
        module = importlib.import_module(module_name)
        owner = getattr(module, owner_name) if owner_name else module
        setattr(owner, name, _timed(spent, f"{attr}", getattr(owner, name)))

    class First(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):  # type: ignore[no-untyped-def]
            spent["begin, total"] = time.process_time() - start
            raise peers._Ready

    with peers._callback("ckptstore", args.work, resume=True) as cb:
        try:
            model.fit(x, y, epochs=args.epochs + 1, verbose=0, callbacks=[First(), cb])
        except peers._Ready:
            pass
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", required=True, help="a peers.py work folder (ckptstore)")
    parser.add_argument("--mb", type=float, default=104.0)
    parser.add_argument("--regime", default="a")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(split(args)))
        return
    rows = []
    for _ in range(args.rounds):  # each resume a fresh process
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", *sys.argv[1:]]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.1f}; CPU s, median [rounds]")
    for key in rows[0]:
        values = [row.get(key, 0.0) for row in rows]
        cells = " ".join(f"{v:.4f}" for v in values)
        print(f"  {key:45s} {statistics.median(values):.4f}  [{cells}]")


if __name__ == "__main__":
    main()
