"""Batch inference: load a trained checkpoint, predict on a file, write predictions to storage.

Loads the latest (or ``--best-by`` metric) checkpoint of ``--trial-id``, or the checkpoint
``--uuid``, predicts on an input ``.npy`` or ``.csv`` (numbers only, no header unless
``--csv-header``), and writes the predictions as ``.npy`` (or ``.csv`` when ``--output`` ends
with ``.csv``) to any storage URL.

Example::

    python examples/batch_inference.py --trial-id 1 --input x.npy \
        --output s3://bucket/predictions/trial1.npy
    python examples/batch_inference.py --uuid 0b7c... --input x.csv --output /tmp/preds.csv \
        --storage /tmp/ckpts --registry sqlite:////tmp/registry.db
"""

from __future__ import annotations

import argparse
import io
import logging
import sys

import numpy as np

import ckptstore
from ckptstore import errors

logger = logging.getLogger("batch_inference")


def read_input(path: str, csv_header: bool = False) -> np.ndarray:
    """The input rows from a ``.npy`` or ``.csv`` file."""
    if path.endswith(".npy"):
        return np.load(path, allow_pickle=False)
    if path.endswith(".csv"):
        return np.loadtxt(path, delimiter=",", skiprows=1 if csv_header else 0, ndmin=2).astype(
            "float32"
        )
    raise errors.InvalidConfig(f"--input must be a .npy or .csv file. Received: {path!r}.")


def encode(predictions: np.ndarray, output: str) -> bytes:
    """Predictions as ``.csv`` text or ``.npy`` bytes, by the output's extension."""
    buffer = io.BytesIO()
    if output.endswith(".csv"):
        np.savetxt(buffer, np.reshape(predictions, (len(predictions), -1)), delimiter=",")
    else:
        np.save(buffer, predictions, allow_pickle=False)
    return buffer.getvalue()


def split_output(output: str) -> tuple[str, str]:
    """``(storage prefix URL, key)`` for an output URL or path."""
    prefix, sep, key = output.rstrip("/").rpartition("/")
    if not sep or not key:
        return ".", output
    if prefix.endswith(":/"):  # "s3://bucket-only/key" would leave "s3:/"
        raise errors.InvalidConfig(f"--output needs a file name after the bucket: {output!r}.")
    return prefix or "/", key


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--trial-id", type=int, help="load this trial's latest (or best) checkpoint")
    which.add_argument("--uuid", help="load this checkpoint")
    parser.add_argument("--best-by", help="pick the trial's best checkpoint by this metric")
    parser.add_argument("--larger-is-better", action="store_true", help="direction of --best-by")
    parser.add_argument("--input", required=True, help="input rows: .npy or .csv")
    parser.add_argument("--csv-header", action="store_true", help="skip the CSV's first line")
    parser.add_argument("--output", required=True, help="storage URL/path for predictions")
    parser.add_argument("--storage", help="checkpoint storage (default: as recorded / env)")
    parser.add_argument("--registry", help="registry URL (default: CKPTSTORE_REGISTRY)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--unsafe", action="store_true", help="allow Lambda layers (trusted only)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    try:
        model = ckptstore.load_checkpoint_model(
            trial_id=args.trial_id,
            checkpoint_uuid=args.uuid,
            storage=args.storage,
            registry=args.registry,
            best_by=args.best_by,
            smaller_is_better=not args.larger_is_better,
            compile=False,
            safe_mode=not args.unsafe,
        )
        x = read_input(args.input, args.csv_header)
        predictions = np.asarray(model.predict(x, batch_size=args.batch_size, verbose=0))
        from ckptstore.storage_backends import open_storage

        prefix, key = split_output(args.output)
        with open_storage(prefix) as out:
            out.write_bytes(key, encode(predictions, args.output))
    except errors.CkptstoreError as exc:
        logger.error("%s: %s", type(exc).__name__, exc)
        return 2
    logger.info("Wrote %d predictions to %s", len(predictions), args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
