"""Storage throughput: ckptstore vs hand-tuned native SDKs vs fsspec vs one file at a time.

Builds a tree of one big file (half of ``--size-mb``) plus ``--small-files`` small files (the
other half), starts each emulator itself (moto S3, fake-gcs-server, Azurite; see
tests/servers/emulators.py), and for every method uploads then downloads the tree, printing
MB/s, the ratio to the best native configuration measured in the same run, and the client
CPU-seconds per GB (this process, all threads).

    .venv/bin/python benchmarks/storage_throughput.py --size-mb 1024
    .venv/bin/python benchmarks/storage_throughput.py --size-mb 256 --backends s3
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
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
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage
    from google.cloud.storage import transfer_manager as tm

    client = storage.Client(project="bench", credentials=AnonymousCredentials())

    def native(conc: int, part_mb: int):  # type: ignore[no-untyped-def]
        def up(bucket, prefix):  # type: ignore[no-untyped-def]
            b = client.bucket(bucket)
            pool_map(
                conc,
                lambda r: b.blob(f"{prefix}/{r}").upload_from_filename(
                    os.path.join(src, r), checksum=None
                ),
                files,
            )

        def down(bucket, prefix, dst):  # type: ignore[no-untyped-def]
            b = client.bucket(bucket)
            big = [r for r, s in files.items() if s >= 64 * MiB]

            def one(r):  # type: ignore[no-untyped-def]
                path = os.path.join(dst, r)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                if r in big:
                    tm.download_chunks_concurrently(b.get_blob(f"{prefix}/{r}"), path, chunk_size=part_mb * MiB,
                                                    max_workers=conc, worker_type=tm.THREAD, crc32c_checksum=False)  # fmt: skip
                else:
                    b.blob(f"{prefix}/{r}").download_to_filename(path, checksum=None)

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
        f"google-cloud-storage c={c} part={p}MiB": native(c, p)
        for c, p in [(8, 32), (16, 32), (16, 64)]
    }
    return grid, (serial_up, serial_down), "gs"


def azure_methods(files, src):  # type: ignore[no-untyped-def]
    from azure.storage.blob import BlobServiceClient

    conn = os.environ["AZURE_STORAGE_CONNECTION_STRING"]

    def native(conc: int, part_mb: int):  # type: ignore[no-untyped-def]
        svc = BlobServiceClient.from_connection_string(conn, max_block_size=part_mb * MiB,
                                                       max_single_put_size=64 * MiB, max_chunk_get_size=part_mb * MiB)  # fmt: skip

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
        f"azure-storage-blob c={c} part={p}MiB": native(c, p)
        for c, p in [(8, 8), (16, 32), (16, 64)]
    }
    return grid, (serial_up, serial_down), "az"


def fsspec_method(scheme: str, src: str):  # type: ignore[no-untyped-def]
    import fsspec

    if scheme == "gs":
        fs = fsspec.filesystem(
            "gcs", token="anon", endpoint_url=os.environ["STORAGE_EMULATOR_HOST"]
        )
    elif scheme == "az":
        fs = fsspec.filesystem(
            "abfs", connection_string=os.environ["AZURE_STORAGE_CONNECTION_STRING"]
        )
    else:
        fs = fsspec.filesystem("s3")

    def up(bucket, prefix):  # type: ignore[no-untyped-def]
        fs.put(src + "/", f"{bucket}/{prefix}/", recursive=True)

    def down(bucket, prefix, dst):  # type: ignore[no-untyped-def]
        fs.get(f"{bucket}/{prefix}/", dst + "/", recursive=True)

    return up, down


METHODS = {"s3": s3_methods, "gcs": gcs_methods, "azure": azure_methods}


def run_backend(kind: str, src: str, files: dict[str, int], work: str, args) -> list[dict]:  # type: ignore[type-arg,no-untyped-def]
    server = start_server(kind, os.path.join(work, kind))
    os.environ.update(server.env)
    rows = []
    total_mb = sum(files.values()) / MiB
    try:
        grid, serial, scheme = METHODS[kind](files, src)
        candidates: dict[str, tuple] = dict(grid)  # type: ignore[type-arg]
        candidates["one file at a time"] = serial
        if not args.skip_fsspec:
            candidates[f"fsspec ({ {'s3': 's3fs', 'gs': 'gcsfs', 'az': 'adlfs'}[scheme] })"] = (
                fsspec_method(scheme, src)
            )

        def ckpt_methods(conc: int, part_mb: int):  # type: ignore[no-untyped-def]
            def up(bucket, prefix):  # type: ignore[no-untyped-def]
                with open_storage(
                    f"{scheme}://{bucket}", concurrency=conc, part_size=part_mb * MiB
                ) as st:
                    st.upload(src, prefix)

            def down(bucket, prefix, dst):  # type: ignore[no-untyped-def]
                with open_storage(
                    f"{scheme}://{bucket}", concurrency=conc, part_size=part_mb * MiB
                ) as st:
                    st.download(prefix, dst)

            return up, down

        candidates["ckptstore (defaults)"] = ckpt_methods(16, 32)
        candidates["ckptstore c=32 part=128MiB"] = ckpt_methods(32, 128)
        for name, (up, down) in candidates.items():
            bucket = f"bench-{uuid.uuid4().hex[:10]}"
            create_bucket(server, bucket)
            dst = os.path.join(work, "dst")
            shutil.rmtree(dst, ignore_errors=True)
            try:
                up_wall, up_cpu = timed(lambda up=up, bucket=bucket: up(bucket, "tree"))
                down_wall, down_cpu = timed(
                    lambda down=down, bucket=bucket, dst=dst: down(bucket, "tree", dst)
                )
            except Exception as exc:  # noqa: BLE001 - report and go on
                logger.warning("%s %s failed: %s", kind, name, exc)
                rows.append({"backend": kind, "method": name, "error": type(exc).__name__})
                continue
            got = sum(os.path.getsize(os.path.join(r, n)) for r, _d, ns in os.walk(dst) for n in ns)
            if got != sum(files.values()):
                logger.warning(
                    "%s %s downloaded %d bytes, expected %d", kind, name, got, sum(files.values())
                )
            rows.append({
                "backend": kind, "method": name,
                "up": total_mb / up_wall, "down": total_mb / down_wall,
                "cpu_up": up_cpu / (total_mb / 1024), "cpu_down": down_cpu / (total_mb / 1024),
            })  # fmt: skip
            logger.info(
                "%s %-40s up %7.1f MB/s down %7.1f MB/s",
                kind,
                name,
                rows[-1]["up"],
                rows[-1]["down"],
            )
    finally:
        server.stop()
    return rows


def print_table(rows: list[dict]) -> None:  # type: ignore[type-arg]
    print(
        "| backend | method | upload MB/s | download MB/s | up vs best native | down vs best native | CPU s/GB up | CPU s/GB down |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for kind in dict.fromkeys(r["backend"] for r in rows):
        mine = [r for r in rows if r["backend"] == kind and "error" not in r]
        native = [
            r
            for r in mine
            if r["method"].split()[0] in ("boto3", "google-cloud-storage", "azure-storage-blob")
        ]
        best_up = max((r["up"] for r in native), default=float("nan"))
        best_down = max((r["down"] for r in native), default=float("nan"))
        for r in [r for r in rows if r["backend"] == kind]:
            if "error" in r:
                print(f"| {kind} | {r['method']} | failed ({r['error']}) | | | | | |")
                continue
            print(f"| {kind} | {r['method']} | {r['up']:.0f} | {r['down']:.0f} | {r['up'] / best_up:.2f}x | "
                  f"{r['down'] / best_down:.2f}x | {r['cpu_up']:.1f} | {r['cpu_down']:.1f} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--size-mb", type=int, default=1024, help="tree size (half is one big file)"
    )
    parser.add_argument("--small-files", type=int, default=200)
    parser.add_argument("--backends", default="s3,gcs,azure")
    parser.add_argument("--skip-fsspec", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for noisy in ("ckptstore", "azure", "urllib3", "botocore", "s3transfer", "google"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    work = tempfile.mkdtemp(prefix="ckptstore-bench-")
    try:
        src = os.path.join(work, "src")
        files = make_tree(src, args.size_mb, args.small_files)
        print(
            f"tree: {len(files)} files, {sum(files.values()) / MiB:.0f} MiB; {os.cpu_count()} CPUs"
        )
        rows = []
        for kind in args.backends.split(","):
            rows.extend(run_backend(kind, src, files, work, args))
        print_table(rows)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
