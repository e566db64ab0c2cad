"""``python -m ckptstore.keras_io.exporting``: ``--worker`` serves :class:`ExportWorker` requests
(the child the training process starts); ``checkpoint UUID`` is what ``ckptstore checkpoint
export`` runs (the command itself never imports TensorFlow)."""

from __future__ import annotations

import logging
import os
import sys

from ckptstore import defaults
from ckptstore.keras_io.exporting._export_checkpoint import checkpoint_main
from ckptstore.keras_io.exporting._worker import worker_main


def _main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="ckptstore's SavedModel exports")
    parser.add_argument("--worker", action="store_true", help="serve ExportWorker requests")
    parser.add_argument("--nice", type=int, default=5)
    sub = parser.add_subparsers(dest="command")
    one = sub.add_parser("checkpoint", help="add saved_model/ to a committed checkpoint")
    one.add_argument("uuid")
    # The caller's storage always wins over a row's URL: ``ckptstore checkpoint export`` hands
    # it over in CKPTSTORE_STORAGE (with its options, which never belong on a command line).
    one.add_argument("--storage", default=os.environ.get(defaults.STORAGE_ENV) or None)
    one.add_argument("--registry")
    one.add_argument("--no-verify", action="store_true")
    one.add_argument("--unsafe-deserialization", action="store_true")
    one.add_argument("--module", action="append", help="allow importing this module")
    args = parser.parse_args(argv)
    if args.command == "checkpoint":
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
        return checkpoint_main(args)
    if not args.worker:
        parser.error("pass --worker or the 'checkpoint' command")
    return worker_main(args.nice)


if __name__ == "__main__":
    sys.exit(_main())
