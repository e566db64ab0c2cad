"""Storage throughput: ckptstore vs hand-tuned native SDKs vs fsspec vs one file at a time.

ckptstore is measured as users get it first — ``CheckpointContext.upload`` / ``download``: a
manifest with every file's crc32c on the way up, every file verified against it on the way
down — then with ``verify=False``, then the bare storage layer (no manifest, no verification),
then tuned options.

Builds a tree of one big file (half of ``--size-mb``) plus ``--small-files`` small files (the
other half), starts each emulator itself (moto S3, fake-gcs-server, Azurite; see
tests/servers/emulators.py), and for every method uploads then downloads the tree, printing
MB/s (median of ``--repeats`` interleaved rounds, the order rotated each round), the ratios to the best native configuration
measured in the same run and to one-file-at-a-time, and the client CPU-seconds per GB (this
process, all threads; median).

    .venv/bin/python benchmarks/storage_throughput.py --size-mb 1024
    .venv/bin/python benchmarks/storage_throughput.py --size-mb 256 --backends s3
    .venv/bin/python benchmarks/storage_throughput.py --backends s3rver   # a second S3 server
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

from ckptstore.storage_backends import open_storage  # noqa: E402
from tests.servers.emulators import create_bucket, start_server  # noqa: E402

logger = logging.getLogger("storage_throughput")
MiB = 2**20


def make_tree(root: str, size_mb: int, small_files: int) -> dict[str, int]:
    rng = np.random.default_rng(0)
    big = size_mb * MiB // 2
    small = (size_mb * MiB - big) // max(1, small_files)
    files = {"big.bin": big, **{f"small/part-{i:04d}.bin": small for i in range(small_files)}}
    for rel, size in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    return files


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of fn()."""
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def pool_map(workers: int, fn: Callable, items) -> None:  # type: ignore[type-arg]
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(fn, items))


# ---- native clients -------------------------------------------------------------------------
def s3_methods(files, src):  # type: ignore[no-untyped-def]
    import boto3
    from boto3.s3.transfer import TransferConfig
    from botocore.config import Config

    client = boto3.client("s3", config=Config(max_pool_connections=128))

    def native(conc: int, part_mb: int):  # type: ignore[no-untyped-def]
        cfg = TransferConfig(multipart_chunksize=part_mb * MiB, multipart_threshold=part_mb * MiB,
                             max_concurrency=conc)  # fmt: skip

        def up(bucket, prefix):  # type: ignore[no-untyped-def]
            pool_map(
                conc,
                lambda r: client.upload_file(
                    os.path.join(src, r), bucket, f"{prefix}/{r}", Config=cfg
                ),
                files,
            )

        def down(bucket, prefix, dst):  # type: ignore[no-untyped-def]
            def one(r):  # type: ignore[no-untyped-def]
                os.makedirs(os.path.dirname(os.path.join(dst, r)), exist_ok=True)
                client.download_file(bucket, f"{prefix}/{r}", os.path.join(dst, r), Config=cfg)

            pool_map(conc, one, files)

        return up, down

    one_cfg = TransferConfig(use_threads=False, multipart_threshold=2**40)

    def serial_up(bucket, prefix):  # type: ignore[no-untyped-def]
        for r in files:
            client.upload_file(os.path.join(src, r), bucket, f"{prefix}/{r}", Config=one_cfg)

    def serial_down(bucket, prefix, dst):  # type: ignore[no-untyped-def]
        for r in files:
            os.makedirs(os.path.dirname(os.path.join(dst, r)), exist_ok=True)
            client.download_file(bucket, f"{prefix}/{r}", os.path.join(dst, r), Config=one_cfg)

    grid = {
        f"boto3 c={c} part={p}MiB": native(c, p)
        for c, p in [(8, 32), (16, 32), (16, 64), (32, 128)]
    }
    return grid, (serial_up, serial_down), "s3"


def gcs_methods(files, src):  # type: ignore[no-untyped-def]
    import requests
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage
    from google.cloud.storage import transfer_manager as tm

    client = storage.Client(project="bench", credentials=AnonymousCredentials())
    adapter = requests.adapters.HTTPAdapter(pool_connections=128, pool_maxsize=128)
    client._http.mount("http://", adapter)

    def native(conc: int, part_mb: int, tuned: bool):  # type: ignore[no-untyped-def]
        """tuned: big files as ONE resumable chunk (the SDK default is 100 MiB chunks, each a
        request) and raw downloads (no transcoding layer); otherwise SDK defaults."""
        dl = {"raw_download": True} if tuned else {}

        def up(bucket, prefix):  # type: ignore[no-untyped-def]
            b = client.bucket(bucket)

            def one(r):  # type: ignore[no-untyped-def]
                size = files[r]
                chunk = -(-size // (256 * 1024)) * 256 * 1024 if tuned and size > 8 * MiB else None
                b.blob(f"{prefix}/{r}", chunk_size=chunk).upload_from_filename(
                    os.path.join(src, r), checksum=None
                )

            pool_map(conc, one, files)

        def down(bucket, prefix, dst):  # type: ignore[no-untyped-def]
            b = client.bucket(bucket)
            big = [r for r, s in files.items() if s >= 64 * MiB]

            def one(r):  # type: ignore[no-untyped-def]
                path = os.path.join(dst, r)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                if r in big:
                    tm.download_chunks_concurrently(b.get_blob(f"{prefix}/{r}"), path, chunk_size=part_mb * MiB,
                                                    max_workers=conc, worker_type=tm.THREAD, crc32c_checksum=False,
                                                    download_kwargs=dl)  # fmt: skip
                else:
                    b.blob(f"{prefix}/{r}").download_to_filename(path, checksum=None, **dl)

            pool_map(conc, one, files)

        return up, down

    def serial_up(bucket, prefix):  # type: ignore[no-untyped-def]
        b = client.bucket(bucket)
        for r in files:
            b.blob(f"{prefix}/{r}").upload_from_filename(os.path.join(src, r))

    def serial_down(bucket, prefix, dst):  # type: ignore[no-untyped-def]
        b = client.bucket(bucket)
        for r in files:
            os.makedirs(os.path.dirname(os.path.join(dst, r)), exist_ok=True)
            b.blob(f"{prefix}/{r}").download_to_filename(os.path.join(dst, r))

    grid = {
        f"google-cloud-storage c={c} part={p}MiB{' tuned' if t else ''}": native(c, p, t)
        for c, p, t in [
            (16, 32, False),
            (8, 32, True),
            (16, 32, True),
            (16, 64, True),
        ]
    }
    return grid, (serial_up, serial_down), "gs"


def azure_methods(files, src):  # type: ignore[no-untyped-def]
    from azure.storage.blob import BlobServiceClient

    conn = os.environ["AZURE_STORAGE_CONNECTION_STRING"]

    def native(conc: int, part_mb: int, block: int | None):  # type: ignore[no-untyped-def]
        """block: the SDK's connection_data_block_size (None: its 4 KiB default)."""
        extra = {"connection_data_block_size": block} if block else {}
        svc = BlobServiceClient.from_connection_string(conn, max_block_size=part_mb * MiB,
                                                       max_single_put_size=64 * MiB, max_chunk_get_size=part_mb * MiB,
                                                       **extra)  # fmt: skip

        def up(bucket, prefix):  # type: ignore[no-untyped-def]
            cc = svc.get_container_client(bucket)

            def one(r):  # type: ignore[no-untyped-def]
                with open(os.path.join(src, r), "rb") as f:
                    cc.upload_blob(f"{prefix}/{r}", f, overwrite=True, max_concurrency=conc)

            pool_map(conc, one, files)

        def down(bucket, prefix, dst):  # type: ignore[no-untyped-def]
            cc = svc.get_container_client(bucket)

            def one(r):  # type: ignore[no-untyped-def]
                os.makedirs(os.path.dirname(os.path.join(dst, r)), exist_ok=True)
                with open(os.path.join(dst, r), "wb") as f:
                    cc.download_blob(f"{prefix}/{r}", max_concurrency=conc).readinto(f)

            pool_map(conc, one, files)

        return up, down

    svc1 = BlobServiceClient.from_connection_string(conn)

    def serial_up(bucket, prefix):  # type: ignore[no-untyped-def]
        cc = svc1.get_container_client(bucket)
        for r in files:
            with open(os.path.join(src, r), "rb") as f:
                cc.upload_blob(f"{prefix}/{r}", f, overwrite=True)

    def serial_down(bucket, prefix, dst):  # type: ignore[no-untyped-def]
        cc = svc1.get_container_client(bucket)
        for r in files:
            os.makedirs(os.path.dirname(os.path.join(dst, r)), exist_ok=True)
            with open(os.path.join(dst, r), "wb") as f:
                cc.download_blob(f"{prefix}/{r}").readinto(f)

    grid = {
        f"azure-storage-blob c={c} part={p}MiB{f' block={b // 1024}KiB' if b else ''}": native(
            c, p, b
        )
        for c, p, b in [(8, 8, None), (8, 8, MiB), (16, 32, MiB), (16, 64, MiB)]
    }
    return grid, (serial_up, serial_down), "az"


def fsspec_method(scheme: str, src: str):  # type: ignore[no-untyped-def]
    import fsspec

    if scheme == "gs":
        fs = fsspec.filesystem(
            "gcs",
            token="anon",
            endpoint_url=os.environ["STORAGE_EMULATOR_HOST"],
            skip_instance_cache=True,
        )
    elif scheme == "az":
        fs = fsspec.filesystem(
            "abfs",
            connection_string=os.environ["AZURE_STORAGE_CONNECTION_STRING"],
            skip_instance_cache=True,
        )
    else:
        fs = fsspec.filesystem("s3", skip_instance_cache=True)

    def up(bucket, prefix):  # type: ignore[no-untyped-def]
        fs.put(src + "/", f"{bucket}/{prefix}/", recursive=True)

    def down(bucket, prefix, dst):  # type: ignore[no-untyped-def]
        fs.get(f"{bucket}/{prefix}/", dst + "/", recursive=True)

    return up, down


METHODS = {"s3": s3_methods, "gcs": gcs_methods, "azure": azure_methods, "s3rver": s3_methods}


NATIVE_PREFIXES = ("boto3", "google-cloud-storage", "azure-storage-blob")
SERIAL = "one file at a time"


def ckptstore_methods(scheme: str, src: str, bucket: str, opened: list, **options):  # type: ignore[no-untyped-def,type-arg]
    """Like the native clients, the storage (and its SDK client) is opened before the clock
    starts; ``opened`` collects it for closing after the run."""
    if not bucket:
        return None, None
    storage = open_storage(f"{scheme}://{bucket}", **options)
    opened.append(storage)

    def up(bucket_, prefix):  # type: ignore[no-untyped-def]
        assert bucket_ == bucket
        storage.upload(src, prefix)

    def down(bucket_, prefix, dst):  # type: ignore[no-untyped-def]
        assert bucket_ == bucket
        storage.download(prefix, dst)

    return up, down


def checkpoint_methods(scheme: str, src: str, bucket: str, opened: list, verify: bool):  # type: ignore[no-untyped-def,type-arg]
    """What users get: ``CheckpointContext.upload`` (checksums every file and commits a
    manifest) and ``download`` (with ``verify``, checks every file's size and crc32c against
    the manifest; ``verify=False`` skips it). Storage opened before the clock, like the rest."""
    if not bucket:
        return None, None
    from ckptstore.checkpointing import CheckpointContext

    storage = open_storage(f"{scheme}://{bucket}")
    opened.append(storage)
    ctx = CheckpointContext(storage, verify=verify)
    committed: dict[str, str] = {}

    def up(bucket_, prefix):  # type: ignore[no-untyped-def]
        committed[prefix] = ctx.upload(src, {"steps_completed": 0})

    def down(bucket_, prefix, dst):  # type: ignore[no-untyped-def]
        ctx.download(committed[prefix], dst)

    return up, down


def build_candidates(
    kind: str, src: str, files: dict[str, int], args, bucket: str = "", opened: list | None = None
) -> dict[str, tuple]:  # type: ignore[type-arg,no-untyped-def]
    """Every method's (up, down) pair, with clients bound to the running emulator's env
    (ckptstore's storages are opened on ``bucket`` and appended to ``opened``)."""
    opened = [] if opened is None else opened
    grid, serial, scheme = METHODS[kind](files, src)
    candidates: dict[str, tuple] = dict(grid)  # type: ignore[type-arg]
    candidates[SERIAL] = serial
    if not args.skip_fsspec:
        label = {"s3": "s3fs", "gs": "gcsfs", "az": "adlfs"}[scheme]
        candidates[f"fsspec ({label})"] = fsspec_method(scheme, src)
    # Defaults first: the checkpoint API users call (manifest + verified download), then the
    # storage layer alone, then options.
    candidates["ckptstore checkpoint (defaults: manifest, verified download)"] = checkpoint_methods(
        scheme, src, bucket, opened, verify=True
    )
    candidates["ckptstore checkpoint, verify=False"] = checkpoint_methods(
        scheme, src, bucket, opened, verify=False
    )
    candidates["ckptstore storage layer (defaults)"] = ckptstore_methods(
        scheme, src, bucket, opened
    )
    candidates["ckptstore c=32 part=64MiB"] = ckptstore_methods(
        scheme, src, bucket, opened, concurrency=32, part_size=64 * MiB
    )
    return candidates


def run_backend(kind: str, src: str, files: dict[str, int], work: str, args) -> list[dict]:  # type: ignore[type-arg,no-untyped-def]
    """Every method ``args.repeats`` times, the methods interleaved within each round (so a
    burst of load from elsewhere hits all of them) and their order rotated every round (so
    none always runs first or last); one row per method and round.

    Each measured upload + download gets a freshly started emulator: the emulators keep
    objects in memory and grow (fake-gcs-server's memory backend was OOM-killed at 22 GB after
    a few rounds on one server), so no method inherits another's leftovers."""
    rows = []
    total = sum(files.values())
    total_mb = total / MiB
    with_server = start_server(kind, os.path.join(work, kind))  # to learn the method names
    os.environ.update(with_server.env)
    try:
        names = list(build_candidates(kind, src, files, args))
    finally:
        with_server.stop()
    for round_ in range(args.repeats):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            server = start_server(kind, os.path.join(work, kind, f"{round_}-{names.index(name)}"))
            os.environ.update(server.env)
            dst = os.path.join(work, "dst")
            shutil.rmtree(dst, ignore_errors=True)
            opened: list = []  # type: ignore[type-arg]
            try:
                bucket = f"bench-{uuid.uuid4().hex[:10]}"
                create_bucket(server, bucket)
                up, down = build_candidates(kind, src, files, args, bucket, opened)[name]
                up_wall, up_cpu = timed(lambda up=up, bucket=bucket: up(bucket, "tree"))
                down_wall, down_cpu = timed(
                    lambda down=down, bucket=bucket, dst=dst: down(bucket, "tree", dst)
                )
            except Exception as exc:  # noqa: BLE001 - report and go on
                logger.warning("%s %s failed: %r", kind, name, exc)
                rows.append({"backend": kind, "method": name, "error": type(exc).__name__})
                continue
            finally:
                for storage in opened:
                    storage.close()
                server.stop()
                shutil.rmtree(os.path.join(work, kind), ignore_errors=True)
            got = sum(  # metadata.json of the checkpoint methods is not part of the tree
                os.path.getsize(os.path.join(dst, rel))
                for rel in files
                if os.path.exists(os.path.join(dst, rel))
            )
            if got != total:
                logger.warning("%s %s downloaded %d bytes, expected %d", kind, name, got, total)
            rows.append({
                "backend": kind, "method": name, "round": round_,
                "up": total_mb / up_wall, "down": total_mb / down_wall,
                "cpu_up": up_cpu / (total_mb / 1024), "cpu_down": down_cpu / (total_mb / 1024),
            })  # fmt: skip
            logger.info(
                "%s round %d %-52s up %7.1f MB/s down %7.1f MB/s  (load %.2f)",
                kind,
                round_ + 1,
                name,
                rows[-1]["up"],
                rows[-1]["down"],
                os.getloadavg()[0],
            )
    return rows


def summarize(rows: list[dict]) -> list[dict]:  # type: ignore[type-arg]
    """One row per (backend, method): the median MB/s and CPU-s/GB over the rounds, and the
    ratios to the native configuration with the best median (and to one-file-at-a-time).

    Medians, not best-of: a best-of favours whichever side has more samples (the native grid
    has four configurations, so its "best" would be the maximum of 4 x rounds noisy runs)."""
    out = []
    for kind in dict.fromkeys(r["backend"] for r in rows):
        methods = dict.fromkeys(r["method"] for r in rows if r["backend"] == kind)
        merged = {}
        for m in methods:
            ok = [r for r in rows if r["backend"] == kind and r["method"] == m and "error" not in r]
            if not ok:
                merged[m] = {"backend": kind, "method": m, "error": "failed"}
                continue
            merged[m] = {
                "backend": kind, "method": m, "rounds": len(ok),
                "up": statistics.median(r["up"] for r in ok),
                "down": statistics.median(r["down"] for r in ok),
                "cpu_up": statistics.median(r["cpu_up"] for r in ok),
                "cpu_down": statistics.median(r["cpu_down"] for r in ok),
            }  # fmt: skip
        good = [r for r in merged.values() if "error" not in r]
        native = [r for r in good if r["method"].startswith(NATIVE_PREFIXES)]
        best_up = max((r["up"] for r in native), default=float("nan"))
        best_down = max((r["down"] for r in native), default=float("nan"))
        serial = merged.get(SERIAL, {})
        for r in merged.values():
            if "error" not in r:
                r["up_vs_native"] = r["up"] / best_up
                r["down_vs_native"] = r["down"] / best_down
                r["up_vs_serial"] = r["up"] / serial.get("up", float("nan"))
                r["down_vs_serial"] = r["down"] / serial.get("down", float("nan"))
            out.append(r)
    return out


def print_table(summary: list[dict]) -> None:  # type: ignore[type-arg]
    print(
        "| backend | method | upload MB/s | download MB/s | up vs best native | "
        "down vs best native | up vs one-at-a-time | down vs one-at-a-time | "
        "CPU s/GB up | CPU s/GB down |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in summary:
        if "error" in r:
            print(f"| {r['backend']} | {r['method']} | failed | | | | | | | |")
            continue
        print(
            f"| {r['backend']} | {r['method']} | {r['up']:.0f} | {r['down']:.0f} | "
            f"{r['up_vs_native']:.2f}x | {r['down_vs_native']:.2f}x | "
            f"{r['up_vs_serial']:.1f}x | {r['down_vs_serial']:.1f}x | "
            f"{r['cpu_up']:.1f} | {r['cpu_down']:.1f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--size-mb", type=int, default=1024, help="tree size (half is one big file)"
    )
    parser.add_argument("--small-files", type=int, default=200)
    parser.add_argument("--backends", default="s3,gcs,azure")
    parser.add_argument("--skip-fsspec", action="store_true")
    parser.add_argument(
        "--repeats", type=int, default=2, help="rounds per method; the table shows the median"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for noisy in ("ckptstore", "azure", "urllib3", "botocore", "s3transfer", "google"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    work = tempfile.mkdtemp(prefix="ckptstore-bench-")
    try:
        src = os.path.join(work, "src")
        files = make_tree(src, args.size_mb, args.small_files)
        print(
            f"tree: {len(files)} files, {sum(files.values()) / MiB:.0f} MiB; {os.cpu_count()} CPUs; "
            f"load {os.getloadavg()[0]:.2f}"
        )
        rows = []
        for kind in args.backends.split(","):
            rows.extend(run_backend(kind, src, files, work, args))
        print_table(summarize(rows))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
