"""Incremental checkpoints (issue 19): what a checkpoint costs with ``dedup=True`` against the
whole-file path of ckptstore and Keras's own ``ModelCheckpoint`` / ``BackupAndRestore``.

Two scenarios, one run:

- (a) fine-tuning: a frozen Dense backbone of ``--backbone-mb`` MB and a small trained head;
- (b) full training: the same model with every layer trained (every tensor changes).

For each, ``fit()`` runs ``--epochs`` epochs with a checkpoint every epoch through
``DeterminedCallback`` (``export_saved_model="never"``) on a local folder and on the moto S3
emulator (``--storage``), with the whole-file path (format 1) and with ``dedup=True`` (format
2), and with Keras's savers on local disk. Printed per checkpoint after the first (the first stores everything): bytes uploaded
(counted from the manifests: whole files, and blobs no earlier checkpoint stored, which a
create-only upload skips), the bytes of the tensors that changed (trainable weights + optimizer state), the
whole cost (``fit()`` + waiting for the last commit, minus the same ``fit()`` without
checkpoints, divided by the number of checkpoints), and the time to restore the last
checkpoint (download, verify, ``keras.models.load_model``). Ratios are against the whole-file
path measured in the same run; with ``--rounds N`` the methods run N times, interleaved, and
the medians are printed.

    .venv/bin/python benchmarks/incremental.py --backbone-mb 64 --epochs 3
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MiB = 2**20
WIDTH = 1024  # a Dense(1024, 1024) layer is 4 MiB of float32
#: (title, frozen backbone?) of the two scenarios (also used by benchmarks/restore.py).
SCENARIOS = (("(a) frozen backbone, trained head", True), ("(b) full training", False))


@contextlib.contextmanager
def moto_s3(prefix: str):  # type: ignore[no-untyped-def]
    """A temporary work folder and the moto S3 emulator (its endpoint in ``os.environ``)."""
    from tests.servers.emulators import start_server

    work = tempfile.mkdtemp(prefix=prefix)
    server = start_server("s3", os.path.join(work, "s3"))
    try:
        os.environ.update(server.env)
        yield server, work
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def build(backbone_mb: float, frozen: bool):  # type: ignore[no-untyped-def]
    import keras

    layers = max(1, round(backbone_mb * MiB / (WIDTH * WIDTH * 4)))
    inputs = keras.Input((WIDTH,))
    x = inputs
    for i in range(layers):
        dense = keras.layers.Dense(WIDTH, activation="relu", name=f"backbone_{i}")
        dense.trainable = not frozen
        x = dense(x)
    outputs = keras.layers.Dense(10, name="head")(x)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(True))
    return model


def data(n: int = 256):  # type: ignore[no-untyped-def]
    import numpy as np

    rng = np.random.default_rng(0)
    return rng.random((n, WIDTH), dtype="float32"), rng.integers(0, 10, n)


def changed_bytes(model) -> int:  # type: ignore[no-untyped-def]
    """Bytes of the tensors one epoch changes: trainable weights and the optimizer's state."""
    weights = sum(int(v.numpy().nbytes) for v in model.trainable_variables)
    slots = sum(int(v.numpy().nbytes) for v in model.optimizer.variables)
    return weights + slots


def uploaded_per_checkpoint(storage, by_file=None) -> list[int]:  # type: ignore[no-untyped-def]
    """Bytes each checkpoint sent, oldest first: its whole files, its manifest and the blobs
    no earlier checkpoint had stored (create-only uploads skip those). ``by_file`` (a dict)
    gets the bytes each file sent, summed over the checkpoints after the first."""
    from ckptstore.checkpointing import format as fmt
    from ckptstore.checkpointing import scan

    seen: set[str] = set()
    out = []
    for i, record in enumerate(scan.sort_records(scan.scan_checkpoints(storage))):
        manifest = fmt.read_manifest(storage, record.uuid)
        sent = len(storage.read_bytes(f"{record.uuid}/{fmt.MANIFEST_NAME}"))  # as stored
        files = {fmt.MANIFEST_NAME: sent}
        for rel, entry in manifest["files"].items():
            if "blobs" not in entry:
                files[rel] = entry["size"]
                sent += entry["size"]
                continue
            files[rel] = 0
            for chunk in entry["blobs"]:
                if chunk["sha256"] not in seen:
                    seen.add(chunk["sha256"])
                    sent += chunk["size"]
                    files[rel] += chunk["size"]
        if i and by_file is not None:
            for rel, n in files.items():
                by_file[rel] = by_file.get(rel, 0) + n
        out.append(sent)
    return out


def run_ckptstore(url: str, reg: str, dedup: bool, args, frozen: bool) -> dict[str, float]:  # type: ignore[no-untyped-def]
    import keras

    import ckptstore as det
    from ckptstore.checkpointing import scan

    x, y = data()
    model = build(args.backbone_mb, frozen)
    model.fit(x, y, epochs=1, verbose=0)  # warm-up and optimizer built
    t0 = time.perf_counter()
    model.fit(x, y, epochs=args.epochs, verbose=0)
    plain = time.perf_counter() - t0
    with det.core.init(storage=url, registry=reg, trial_id=1, preempt_signals=False) as ctx:
        ctx.checkpoint.dedup = dedup
        ctx.checkpoint.dedup_chunk_bytes = args.chunk_kb * 1024
        callback = det.keras.DeterminedCallback(ctx, None, 1, export_saved_model="never")
        t0 = time.perf_counter()
        model.fit(x, y, epochs=args.epochs, verbose=0, callbacks=[callback])
        ctx.checkpoint.wait()
        whole = time.perf_counter() - t0
        store = ctx.checkpoint.storage
        committed = scan.list_committed(store)
        by_file: dict[str, int] = {}
        sent = uploaded_per_checkpoint(store, by_file)
        last = ctx.checkpoint.latest_checkpoint()
        t0 = time.perf_counter()
        with ctx.checkpoint.restore_path(last) as path:
            keras.models.load_model(os.path.join(path, "model.keras"))
        restore = time.perf_counter() - t0
    return {
        "checkpoints": len(committed),
        # Steady state: every checkpoint after the first (the first stores everything).
        "uploaded/ckpt": sum(sent[1:]) / max(1, len(sent) - 1),
        "first": sent[0],
        "cost/ckpt": (whole - plain) / len(committed),
        "restore": restore,
        "changed": changed_bytes(model),
        "by_file": {k: v / max(1, len(sent) - 1) for k, v in by_file.items()},
    }


def run_keras(kind: str, work: str, args, frozen: bool) -> dict[str, float]:  # type: ignore[no-untyped-def]
    import keras

    x, y = data()
    model = build(args.backbone_mb, frozen)
    model.fit(x, y, epochs=1, verbose=0)
    t0 = time.perf_counter()
    model.fit(x, y, epochs=args.epochs, verbose=0)
    plain = time.perf_counter() - t0
    folder = os.path.join(work, kind)
    os.makedirs(folder)
    if kind == "ModelCheckpoint":
        cb = keras.callbacks.ModelCheckpoint(os.path.join(folder, "m{epoch}.keras"))
    else:
        cb = keras.callbacks.BackupAndRestore(folder, delete_checkpoint=False)
    t0 = time.perf_counter()
    model.fit(x, y, epochs=args.epochs, verbose=0, callbacks=[cb])
    whole = time.perf_counter() - t0
    written = sum(os.path.getsize(os.path.join(r, f)) for r, _d, fs in os.walk(folder) for f in fs)
    t0 = time.perf_counter()
    if kind == "ModelCheckpoint":
        keras.models.load_model(os.path.join(folder, f"m{args.epochs}.keras"))
    restore = time.perf_counter() - t0
    per = written / args.epochs if kind == "ModelCheckpoint" else written
    return {
        "checkpoints": args.epochs,
        "written/ckpt": per,
        "cost/ckpt": (whole - plain) / args.epochs,
        "restore": restore,
    }


def report(name: str, rows: dict[str, dict[str, float]]) -> None:
    """Each ckptstore row against the whole-file path on the same storage (Keras's savers,
    which write local files, against the local whole-file path when it ran)."""
    bases = {k.rsplit("(", 1)[1]: r for k, r in rows.items() if k.startswith("ckptstore whole")}
    first = next(iter(bases.values()))
    print(f"\n## {name}  (changed tensors per checkpoint: {first['changed'] / MiB:.2f} MiB)")
    print(
        f"{'method':34s} {'MiB up/ckpt':>12s} {'x whole':>8s} {'x changed':>9s} "
        f"{'cost s/ckpt':>11s} {'x whole':>8s} {'restore s':>9s}"
    )
    for method, r in rows.items():
        base = bases.get(method.rsplit("(", 1)[-1], bases.get("local)", first))
        up = r.get("uploaded/ckpt", r.get("written/ckpt", 0.0))
        kind = "" if "uploaded/ckpt" in r else " (local, written)"
        print(
            f"{method + kind:34s} {up / MiB:12.2f} {up / base['uploaded/ckpt']:8.3f} "
            f"{up / base['changed']:9.2f} {r['cost/ckpt']:11.3f} "
            f"{r['cost/ckpt'] / base['cost/ckpt'] if base['cost/ckpt'] > 0 else float('nan'):8.2f} "
            f"{r['restore']:9.2f}"
        )
    for method, r in rows.items():
        if "by_file" in r:
            files = ", ".join(f"{k} {v / 1024:.1f}" for k, v in sorted(r["by_file"].items()))
            print(f"  {method}: KiB uploaded per checkpoint by file: {files}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backbone-mb", type=float, default=64.0)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--chunk-kb", type=int, default=4096)
    parser.add_argument(
        "--storage", default="local,s3", help="comma-separated: local (a folder), s3 (moto)"
    )
    parser.add_argument("--rounds", type=int, default=1, help="runs per method (medians)")
    parser.add_argument(
        "--keras",
        default="ModelCheckpoint,BackupAndRestore",
        help="Keras's own savers to measure beside ckptstore (comma-separated; empty: none)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    from tests.servers.emulators import create_bucket

    with moto_s3("incremental-") as (server, work):
        print(
            f"backbone {args.backbone_mb:g} MB, {args.epochs} checkpoints per method, "
            f"chunks of {args.chunk_kb} KiB"
        )
        for name, frozen in SCENARIOS:
            runs: dict[str, list[dict[str, float]]] = {}
            tag = "a" if frozen else "b"
            # Rounds interleave the methods, so a burst of load on a shared machine hits all
            # of them; medians are printed (bytes are exact and the same in every round).
            for round_ in range(args.rounds):
                for store in args.storage.split(","):
                    for label, dedup in (("whole-file", False), ("dedup", True)):
                        bucket = f"inc-{tag}-{label}-{store}-{round_}"
                        if store == "s3":
                            create_bucket(server, bucket)
                            url = f"s3://{bucket}/ckpts"
                        else:
                            url = os.path.join(work, bucket)
                        runs.setdefault(f"ckptstore {label} ({store})", []).append(
                            run_ckptstore(url, f"sqlite:///{work}/{bucket}.db", dedup, args, frozen)
                        )
                for kind in args.keras.split(",") if args.keras else ():
                    where = os.path.join(work, f"{tag}{round_}")
                    runs.setdefault(f"Keras {kind}", []).append(
                        run_keras(kind, where, args, frozen)
                    )
            report(name, {method: median_row(rs) for method, rs in runs.items()})
            sys.stdout.flush()


def median_row(rows: list[dict[str, float]]) -> dict[str, float]:
    """The median of every number over rounds (``by_file`` from the first round)."""
    import statistics

    out = dict(rows[0])
    for key, value in rows[0].items():
        if isinstance(value, (int, float)):
            out[key] = statistics.median(r[key] for r in rows)
    return out


if __name__ == "__main__":
    main()
