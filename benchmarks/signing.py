"""Checkpoint signing (issue 27): what signing costs as a share of a save, and verification as a
share of a restore, for a Keras model of ``--mb`` MB of (random) weights.

One run, ``--rounds`` rounds, medians printed:

- save: ``core.init(signing_key=...)`` + ``store_path`` + ``model.save("model.keras")`` until the
  checkpoint is committed (signing included), and the same save unsigned;
- callback save: ``DeterminedCallback``'s writer thread writing ``model.keras`` (it computes
  the crc32c as it writes, so the signed commit reads the file once, for SHA-256 only) and
  committing it, signed and unsigned;
- restore: ``load_checkpoint_model(checkpoint_uuid=...)`` (checksums, Keras load) with
  ``CKPTSTORE_VERIFY_KEY`` set, and the same without.

Signing and verification have no step of their own any more: the SHA-256 of each file is
computed in the read that checksums it. Their cost is given two ways: the difference of the
medians (signed minus unsigned: the whole cost, and the machine's noise), and the time spent in
that read (``checksums.file_sums``) beyond what the unsigned run spent there, plus the
signature's own work (``signing.sign_digests`` / ``Expected.read`` + ``compare``), timed where
they run.

Local storage (the whole-file commit is a rename: the save is mostly Keras writing the file).

    .venv/bin/python benchmarks/signing.py --mb 400 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

WIDTH = 1024  # a Dense(1024, 1024) layer is 4 MiB of float32


def build(mb: float) -> Any:
    import keras

    inputs = keras.Input((WIDTH,))
    x = inputs
    for i in range(max(1, round(mb * 2**20 / (WIDTH * WIDTH * 4)))):
        x = keras.layers.Dense(WIDTH, name=f"dense_{i}")(x)
    return keras.Model(inputs, x)


def timed(module: Any, name: str, spent: list[float]) -> Callable[[], None]:
    """Wrap ``module.name`` so each call's seconds go to ``spent``; returns the undo."""
    real = getattr(module, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - started)

    setattr(module, name, wrapper)
    return lambda: setattr(module, name, real)


def save(model: Any, storage: str, registry: str, key: str | None) -> tuple[str, float]:
    import ckptstore

    started = time.perf_counter()
    with ckptstore.core.init(
        storage=storage, registry=registry, trial_id=1, preempt_signals=False, signing_key=key
    ) as ctx:
        with ctx.checkpoint.store_path({"steps_completed": 1}) as (path, uuid):
            model.save(os.path.join(path, "model.keras"))
    return uuid, time.perf_counter() - started


def callback_save(model: Any, storage: str, registry: str, key: str | None) -> tuple[str, float]:
    """One checkpoint of ``DeterminedCallback`` (one step, then the epoch's save): the seconds
    its writer spent on it (writing ``model.keras`` and committing, off the training thread)."""
    import numpy as np

    import ckptstore
    from ckptstore.keras_io.saving import _writer

    writers: list[Any] = []
    real_init = _writer.CheckpointWriter.__init__

    def keep(self: Any, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        writers.append(self)

    _writer.CheckpointWriter.__init__ = keep  # type: ignore[method-assign]
    x = np.zeros((8, WIDTH), "float32")
    with ckptstore.core.init(
        storage=storage, registry=registry, trial_id=2, preempt_signals=False, signing_key=key
    ) as ctx:
        cb = ckptstore.keras.DeterminedCallback(ctx, None, 1, export_saved_model="never")
        try:
            model.fit(x, x, batch_size=8, epochs=1, verbose=0, callbacks=[cb])
        finally:
            _writer.CheckpointWriter.__init__ = real_init  # type: ignore[method-assign]
    return str(cb.last_checkpoint), writers[-1].write_seconds[-1]


def restore(uuid: str, storage: str, registry: str, pub: str | None) -> float:
    import ckptstore
    from ckptstore.checkpointing import signing

    if pub:
        os.environ[signing.VERIFY_KEY_ENV] = pub
    started = time.perf_counter()
    try:
        ckptstore.load_checkpoint_model(checkpoint_uuid=uuid, storage=storage, registry=registry)
    finally:
        os.environ.pop(signing.VERIFY_KEY_ENV, None)
    return time.perf_counter() - started


def ordered(flip: bool, pair: tuple[Any, ...]) -> tuple[Any, ...]:
    return pair[::-1] if flip else pair


def attribute(spent: dict[str, list[float]], run: Callable[[], Any]) -> tuple[Any, float]:
    """Run ``run()``; returns its result and the seconds the timed functions took in it."""
    for calls in spent.values():
        calls.clear()
    result = run()
    return result, sum(sum(calls) for calls in spent.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from ckptstore.checkpointing import format as fmt_module
    from ckptstore.checkpointing import signing
    from tests.checkpointing._helpers import ec_key_pair

    model = build(args.mb)
    size = sum(w.size * w.dtype.itemsize for w in model.get_weights()) / 2**20
    model.compile(optimizer="sgd", loss="mse")
    kinds = ("save", "save_s", "callback", "callback_s", "restore", "restore_v")
    walls: dict[str, list[float]] = {k: [] for k in kinds}
    inside: dict[str, list[float]] = {k: [] for k in walls}  # seconds in the timed functions
    spent: dict[str, list[float]] = {"sums": [], "sign": [], "read": [], "compare": []}
    undo = [
        timed(fmt_module, "file_sums", spent["sums"]),  # the checksum read (manifest, verify)
        timed(signing, "sign_digests", spent["sign"]),
        timed(signing.Expected, "read", spent["read"]),
        timed(signing.Expected, "compare", spent["compare"]),
    ]
    with tempfile.TemporaryDirectory(prefix="ckptstore-bench-sign-") as tmp:
        key, pub = ec_key_pair(tmp)
        storage, registry = os.path.join(tmp, "store"), f"sqlite:///{tmp}/reg.db"
        started = time.perf_counter()
        signing.load_model_signing()  # a one-off import, paid when the context opens
        imported = time.perf_counter() - started
        for round_ in range(args.rounds):
            # Odd rounds run the signed step of each pair first: the step after the other
            # one meets its writeback and page-cache churn, so neither side always pays it.
            flip = round_ % 2 == 1
            for name, signed_key in ordered(flip, (("save", None), ("save_s", key))):
                (uuid, seconds), extra = attribute(
                    spent, lambda k=signed_key: save(model, storage, registry, k)
                )
                walls[name].append(seconds)
                inside[name].append(extra)
                if signed_key is None:
                    plain = uuid
                else:
                    signed = uuid
            for name, signed_key in ordered(flip, (("callback", None), ("callback_s", key))):
                (_uuid, seconds), extra = attribute(
                    spent, lambda k=signed_key: callback_save(model, storage, registry, k)
                )
                walls[name].append(seconds)
                inside[name].append(extra)
            pairs = (("restore", plain, None), ("restore_v", signed, pub))
            for name, which, verify_key in ordered(flip, pairs):
                seconds, extra = attribute(
                    spent, lambda u=which, v=verify_key: restore(u, storage, registry, v)
                )
                walls[name].append(seconds)
                inside[name].append(extra)
    for restore_undo in undo:
        restore_undo()
    med = {k: statistics.median(v) for k, v in walls.items()}
    cost = {k: statistics.median(v) for k, v in inside.items()}
    sign_in = cost["save_s"] - cost["save"]
    sign_cb = cost["callback_s"] - cost["callback"]
    verify_in = cost["restore_v"] - cost["restore"]
    print(f"one-off import of model_signing when a context with a key opens: {imported:.2f} s")
    print(
        f"model: {size:.0f} MiB of weights, {args.rounds} rounds, medians; hash "
        f"{signing.HASH_ALGORITHM}, key EC P-256; local storage; load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    print(
        f"save unsigned {med['save']:.2f} s | signed {med['save_s']:.2f} s "
        f"(x{med['save_s'] / med['save']:.3f}, +{med['save_s'] - med['save']:.2f} s) | "
        f"signing in the checksum read + signer {sign_in:.2f} s = "
        f"{100 * sign_in / med['save_s']:.1f}% of the signed save"
    )
    print(
        f"callback save (writer thread) unsigned {med['callback']:.2f} s | signed "
        f"{med['callback_s']:.2f} s (x{med['callback_s'] / med['callback']:.3f}, "
        f"+{med['callback_s'] - med['callback']:.2f} s) | signing in the commit's read + signer "
        f"{sign_cb:.2f} s = {100 * sign_cb / med['callback_s']:.1f}% of the signed save"
    )
    print(
        f"restore unverified {med['restore']:.2f} s | verified {med['restore_v']:.2f} s "
        f"(x{med['restore_v'] / med['restore']:.3f}, +{med['restore_v'] - med['restore']:.2f} s)"
        f" | verification in the checksum read + envelope {verify_in:.2f} s = "
        f"{100 * verify_in / med['restore_v']:.1f}% of the verified restore"
    )


if __name__ == "__main__":
    main()
