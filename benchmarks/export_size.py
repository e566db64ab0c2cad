"""The final SavedModel export (issue 41): bytes stored and peak memory, beside Keras's own
in-process ``model.export()`` of the same model, each in a fresh process.

The model is :mod:`incremental`'s Dense(1024) stack of ``--mb`` MiB (Adam, one epoch trained),
saved once as ``model.keras``. Methods:

- ``keras``: load ``model.keras`` and ``model.export()`` in the process (what a user does);
- ``ckptstore``: :func:`ckptstore.keras_io.exporting._savedmodel.export_model_file`, what the
  export worker runs (load, export, verify the ``serve`` endpoint).

Printed per method (medians of ``--rounds``): the peak resident memory of the process
(``VmHWM``) and its growth over the process after ``import tensorflow, keras``, the
SavedModel's bytes, its ``variables/`` bytes, and those over the model's weights bytes.

    .venv/bin/python benchmarks/export_size.py --mb 104 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

MiB = 2**20
METHODS = ("keras", "ckptstore")


def _folder_bytes(path: str) -> int:
    return sum(
        os.path.getsize(os.path.join(root, name))
        for root, _dirs, names in os.walk(path)
        for name in names
    )


def _peak_rss() -> int:
    """This process's peak resident bytes (``VmHWM``: unlike ``ru_maxrss``, not inherited
    from the parent across ``exec``)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def worker(method: str, model_file: str, out: str) -> dict[str, float]:
    import keras  # noqa: F401 - imported before the baseline, as in a training process
    import tensorflow  # noqa: F401

    base = _peak_rss()
    if method == "keras":
        model = keras.models.load_model(model_file, compile=False)
        model.export(out, verbose=False)
    else:
        from ckptstore.keras_io.exporting._savedmodel import export_model_file

        model = export_model_file(model_file, out, safe_mode=False)
    peak = _peak_rss()
    return {"peak": peak, "growth": peak - base}


def make_model(mb: float, path: str) -> int:
    from incremental import build, data

    model = build(mb, frozen=False)
    x, y = data()
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    model.save(path)
    return sum(int(v.numpy().nbytes) for v in model.weights)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, default=104.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.model, args.out)))
        return
    work = tempfile.mkdtemp(prefix="ckptstore-export-bench-")
    model_file = os.path.join(work, "model.keras")
    weights = make_model(args.mb, model_file)
    rows: dict[str, list[dict[str, float]]] = {m: [] for m in METHODS}
    for r in range(args.rounds):
        for method in METHODS:  # interleaved: load drifts the same for both
            out = os.path.join(work, f"{method}-{r}")
            proc = subprocess.run(
                [sys.executable, __file__, "--worker", method, "--model", model_file, "--out", out],
                capture_output=True,
                text=True,
                check=True,
            )
            row = json.loads(proc.stdout.strip().splitlines()[-1])
            row["bytes"] = _folder_bytes(out)
            row["variables"] = _folder_bytes(os.path.join(out, "variables"))
            rows[method].append(row)
    print(f"weights {weights / MiB:.1f} MiB; load average {os.getloadavg()[0]:.1f}")
    for method, found in rows.items():
        med = {k: statistics.median(r[k] for r in found) for k in found[0]}
        print(
            f"{method:10s} peak {med['peak'] / MiB:7.0f} MiB (+{med['growth'] / MiB:5.0f} after "
            f"imports)  SavedModel {med['bytes'] / MiB:7.1f} MiB = {med['bytes'] / weights:.2f}x "
            f"weights (variables/ {med['variables'] / weights:.2f}x)"
        )


if __name__ == "__main__":
    main()
