"""Network faults between ckptstore and the S3 / Azure emulators.

A :class:`~tests.servers.fault_proxy.FaultProxy` sits between ckptstore and the emulator and
injects connection resets, stalls, slow links and HTTP 500/503 bursts. Every save and load
either succeeds through retries (its content then checked by a download through a clean
connection, with checksums) or fails with ``StorageUnavailable`` after the retry budget; no
fault ever leaves a committed checkpoint with bad content.

Both checkpoint formats are covered: whole files (format 1) and deduplicated checkpoints
(``dedup=True``, format 2: content-addressed chunks in ``<prefix>/.ckptstore-blobs/``). Every
context here passes ``dedup=`` explicitly, so a test means the same whatever the default is.
Deduplicated saves use 64 KiB chunks, so each checkpoint below is 8 chunks (5 + 2 + 1), and
faults are aimed at one chunk's requests by its key. Dedup-only cases: a lost answer to a
create-only chunk PUT, faults while a checkpoint reuses stored chunks and while chunks are
read back, and faults during a GC blob sweep. After each test every committed checkpoint is
downloaded through a clean connection (each chunk's SHA-256 and each file's crc32c checked)
and the blob store is checked (:func:`ckptstore.checkpointing.blob_gc.check`: no chunk a
committed manifest names is missing or damaged).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import random
import re
import shutil
import urllib.parse
from dataclasses import dataclass

import pytest

from ckptstore import errors
from ckptstore.checkpointing import (
    CheckpointContext,
    blob_gc,
    blobs,
    commit,
    condemned,
    list_committed,
)
from ckptstore.checkpointing import format as fmt
from ckptstore.storage_backends import open_storage
from tests._helpers.trees import make_tree
from tests.servers.fault_proxy import FaultProxy

pytestmark = pytest.mark.timeout(120)

#: Tight budgets so failures are quick: 4 tries, 2 s connect/read timeout.
FAST_FAIL = {"max_attempts": 4, "timeout": 2}
#: Chunk size of the deduplicated saves: weights.bin (300,000 bytes) is 5 chunks,
#: nested/optimizer.bin (120,000) 2, config.json 1.
CHUNK = 64 * 1024
#: ``dedup`` parametrization: the same test on whole-file and on deduplicated checkpoints.
BOTH_FORMATS = pytest.mark.parametrize("dedup", [False, True], ids=["whole", "dedup"])


@dataclass
class Faulty:
    """A bucket on an emulator, and storage options that reach it through a fault proxy."""

    kind: str
    url: str
    proxy: FaultProxy
    options: dict

    def storage(self, **overrides):
        """Storage through the proxy."""
        return open_storage(self.url, **{**self.options, **overrides})

    def direct(self):
        """Storage straight to the emulator (the truth, for checking); one per test."""
        if self._direct is None:
            self._direct = open_storage(self.url)
        return self._direct

    _direct = None


@pytest.fixture(params=["s3", "azure"])
def faulty(request, storage_url_factory):
    kind = request.param
    url = storage_url_factory(kind)  # starts the emulator, creates the bucket/container
    server = request.getfixturevalue(f"{kind}_server")
    endpoint = urllib.parse.urlsplit(server.endpoint)
    # Stalls outlast the tests' own timeouts: only the client's timeout may end them.
    proxy = FaultProxy(endpoint.hostname, endpoint.port, max_stall_s=300).start()
    options = dict(FAST_FAIL)
    if kind == "s3":
        options["endpoint_url"] = proxy.url
    else:
        from tests.servers.emulators import azurite_connection_string

        options["connection_string"] = azurite_connection_string(proxy.url)
    faulty = Faulty(kind, url, proxy, options)
    try:
        yield faulty
    finally:
        proxy.stop()
        if faulty._direct is not None:
            faulty._direct.close()


def _content(seed: int, *, weights_seed: int | None = None) -> dict[str, bytes]:
    """Seeded checkpoint files, {relpath: bytes}. Contents with the same ``weights_seed``
    share weights.bin (so its chunks, when deduplicated)."""
    rng = random.Random(seed)
    wrng = rng if weights_seed is None else random.Random(weights_seed)
    return {
        "weights.bin": wrng.randbytes(300_000),
        "nested/optimizer.bin": rng.randbytes(120_000),
        "config.json": f'{{"seed": {seed}}}'.encode(),
    }


def _make_ckpt(root, seed: int, *, weights_seed: int | None = None) -> dict[str, bytes]:
    """A small checkpoint folder with seeded content; returns {relpath: bytes}."""
    files = _content(seed, weights_seed=weights_seed)
    make_tree(root, files)
    return files


def _chunk_sha(data: bytes, index: int) -> str:
    return hashlib.sha256(data[index * CHUNK : (index + 1) * CHUNK]).hexdigest()


def _chunk_key(data: bytes, index: int) -> str:
    """The storage key (under the prefix) of the ``index``-th chunk of a file: it appears in
    the request line of that chunk's PUT, HEAD, GET (and, on Azure, DELETE) only."""
    return blobs.blob_key(_chunk_sha(data, index))


def _target(dedup: bool, files: dict[str, bytes]) -> str:
    """What to aim a fault at to hit the transfer of weights.bin's bytes: the file itself, or
    its second (full, 64 KiB) chunk."""
    return _chunk_key(files["weights.bin"], 1) if dedup else "weights.bin"


def _ctx(storage, dedup: bool, **kwargs) -> CheckpointContext:
    return CheckpointContext(storage, dedup=dedup, dedup_chunk_bytes=CHUNK, **kwargs)


def _assert_content(folder, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        with open(os.path.join(folder, *rel.split("/")), "rb") as f:
            got = f.read()
        # A bool, not the bytes: pytest's diff of two 300 KB byte strings takes minutes.
        same = got == data
        assert same, f"{rel} differs: {len(got)} bytes ({got.count(0)} zero), {len(data)} stored"


def _assert_format(faulty: Faulty, uuid: str, dedup: bool) -> dict:
    """The checkpoint was stored as asked: whole files, or only chunks (5 + 2 + 1) plus
    metadata and manifest in its folder. Returns its manifest."""
    storage = faulty.direct()
    manifest = fmt.read_manifest(storage, uuid)
    assert fmt.Manifest.of(manifest).deduplicated is dedup
    assert manifest["format_version"] == (2 if dedup else 1)
    names = set(storage.list(uuid))
    if dedup:
        assert names <= {fmt.METADATA_NAME, fmt.MANIFEST_NAME, fmt.PENDING_MARKER_NAME}, names
        counts = {r: len(e["blobs"]) for r, e in manifest["files"].items() if "blobs" in e}
        assert counts == {"weights.bin": 5, "nested/optimizer.bin": 2, "config.json": 1}
    else:
        assert {"weights.bin", "nested/optimizer.bin"} <= names
    return manifest


def _check_through_clean_connection(faulty: Faulty, uuid: str, files, tmp_path) -> None:
    """Download ``uuid`` straight from the emulator with checksum verification (for a
    deduplicated checkpoint: every chunk's SHA-256 and every file's crc32c)."""
    dest = tmp_path / f"verify-{uuid}"
    # Reading does not depend on dedup; does not own the storage.
    with CheckpointContext(faulty.direct(), verify=True, dedup=False) as ctx:
        ctx.download(uuid, dest)
    _assert_content(dest, files)
    shutil.rmtree(dest)


def _assert_blob_store_sound(faulty: Faulty) -> dict:
    """``ckptstore storage validate``'s blob check, every chunk read back: nothing a committed
    manifest names is missing or damaged."""
    report = blob_gc.check(faulty.direct(), sample=None)
    assert report["missing"] == {} and report["damaged"] == {}, report
    assert report["checked"] == report["referenced"]
    return report


def _assert_all_committed_are_good(faulty: Faulty, saved: dict[str, dict], tmp_path) -> None:
    """Every committed checkpoint in the bucket is one we saved and it verifies, and the blob
    store holds every chunk they name."""
    storage = faulty.direct()
    committed = list_committed(storage)
    for uuid in committed:
        assert uuid in saved, f"committed checkpoint {uuid} was not reported as saved"
        _check_through_clean_connection(faulty, uuid, saved[uuid], tmp_path)
    _assert_blob_store_sound(faulty)


def _save(
    faulty: Faulty,
    tmp_path,
    seed: int,
    storage=None,
    *,
    dedup: bool = False,
    ctx: CheckpointContext | None = None,
    weights_seed: int | None = None,
    **storage_overrides,
):
    """Save a seeded folder through the proxy (a new context, or ``ctx``); returns
    ``(uuid, files)`` after checking the stored format."""
    src = tmp_path / f"src-{seed}"
    files = _make_ckpt(src, seed, weights_seed=weights_seed)
    if ctx is not None:
        uuid = ctx.upload(src, {"steps_completed": seed})
        _assert_format(faulty, uuid, ctx.dedup)
        return uuid, files
    own = storage is None
    storage = storage or faulty.storage(**storage_overrides)
    try:
        with _ctx(storage, dedup, trial_id=1) as new:
            uuid = new.upload(src, {"steps_completed": seed})
    finally:
        if own:
            storage.close()
    _assert_format(faulty, uuid, dedup)
    return uuid, files


def _uploaded(caplog) -> list[int]:
    """The new (uploaded) bytes of each commit logged so far: its INFO line's "bytes new"."""
    pattern = re.compile(r" committed to .*: \d+ files, [\d,]+ bytes, ([\d,]+) bytes new")
    return [
        int(m.group(1).replace(",", ""))
        for r in caplog.records
        if (m := pattern.search(r.getMessage()))
    ]


# ---- HTTP error bursts -------------------------------------------------------------------------
@BOTH_FORMATS
def test_503_burst_on_save_is_retried(faulty, tmp_path, dedup):
    faulty.proxy.fail_next(3, status=503)
    uuid, files = _save(faulty, tmp_path, 1, dedup=dedup)
    assert faulty.proxy.stats["faults"]["http"] == 3
    _check_through_clean_connection(faulty, uuid, files, tmp_path)
    _assert_blob_store_sound(faulty)


def test_500_burst_on_every_kind_of_request(faulty, tmp_path):
    # one 500 aimed at each verb the save uses
    for verb in ("PUT ", "GET ", "HEAD ", "POST ", "DELETE "):
        faulty.proxy.fail_next(1, status=500, match=verb)
    uuid, files = _save(faulty, tmp_path, 2, dedup=False)
    _check_through_clean_connection(faulty, uuid, files, tmp_path)
    faulty.proxy.clear()
    faulty.proxy.fail_next(2, status=500, match="GET ")
    dest = tmp_path / "through-proxy"
    storage = faulty.storage()
    with CheckpointContext(storage, dedup=False) as ctx:
        ctx.download(uuid, dest)
    storage.close()
    _assert_content(dest, files)
    assert faulty.proxy.stats["faults"]["http"] >= 2


@BOTH_FORMATS
def test_persistent_503_fails_with_storage_unavailable(faulty, tmp_path, dedup):
    faulty.proxy.fail_next(100_000, status=503)
    with pytest.raises(errors.StorageUnavailable) as info:
        _save(faulty, tmp_path, 3, dedup=dedup)
    message = str(info.value)
    assert faulty.url.split("://", 1)[1].split("/", 1)[0] in message  # names the bucket
    faulty.proxy.clear()
    _assert_all_committed_are_good(faulty, {}, tmp_path)  # nothing committed


# ---- connection resets -------------------------------------------------------------------------
@BOTH_FORMATS
def test_resets_mid_upload_are_retried(faulty, tmp_path, dedup):
    target = _target(dedup, _content(4))
    faulty.proxy.reset_next(2, after_bytes=50_000, match=target)
    uuid, files = _save(faulty, tmp_path, 4, dedup=dedup)
    assert faulty.proxy.stats["faults"]["reset"] == 2
    assert faulty.proxy.pending == 0
    _check_through_clean_connection(faulty, uuid, files, tmp_path)
    _assert_blob_store_sound(faulty)


@BOTH_FORMATS
def test_resets_mid_download_never_leave_a_bad_file(faulty, tmp_path, dedup):
    uuid, files = _save(faulty, tmp_path, 5, dedup=dedup)
    faulty.proxy.reset_next(2, after_bytes=60_000, match=_target(dedup, files))
    dest = tmp_path / "dl"
    storage = faulty.storage()
    with CheckpointContext(storage, dedup=dedup) as ctx:
        ctx.download(uuid, dest)
    storage.close()
    assert faulty.proxy.stats["faults"]["reset"] == 2
    _assert_content(dest, files)


def test_dedup_chunk_read_reset_three_times_is_within_the_retry_budget(faulty, tmp_path):
    """Three resets in the body of one chunk's GET: FAST_FAIL allows 4 tries of each request,
    so the download succeeds."""
    uuid, files = _save(faulty, tmp_path, 14, dedup=True)
    faulty.proxy.reset_next(3, after_bytes=30_000, match=_target(True, files))
    with faulty.storage() as storage, CheckpointContext(storage, dedup=True) as ctx:
        ctx.download(uuid, tmp_path / "dl")
    assert faulty.proxy.stats["faults"]["reset"] == 3
    _assert_content(tmp_path / "dl", files)


@BOTH_FORMATS
def test_lost_response_to_the_commit_is_not_a_conflict(faulty, tmp_path, dedup):
    """The manifest PUT reached the server but its answer was lost; the retry must see its
    own commit, not report another writer."""
    faulty.proxy.reset_next(1, after_bytes=0, match="MANIFEST.json", in_response=True)
    uuid, files = _save(faulty, tmp_path, 6, dedup=dedup)
    assert faulty.proxy.stats["faults"]["reset"] == 1
    _check_through_clean_connection(faulty, uuid, files, tmp_path)
    _assert_blob_store_sound(faulty)


@BOTH_FORMATS
def test_persistent_resets_fail_with_storage_unavailable(faulty, tmp_path, dedup):
    faulty.proxy.reset_next(100_000, after_bytes=0)
    with pytest.raises(errors.StorageUnavailable):
        _save(faulty, tmp_path, 7, dedup=dedup)
    faulty.proxy.clear()
    _assert_all_committed_are_good(faulty, {}, tmp_path)


# ---- stalls and slow links ---------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_stalled_upload_times_out_instead_of_hanging(faulty, tmp_path):
    faulty.proxy.stall_next(100_000, after_bytes=10_000, match="weights.bin")
    with pytest.raises(errors.StorageUnavailable):
        _save(faulty, tmp_path, 8, dedup=False, timeout=1, max_attempts=2)
    assert faulty.proxy.stats["faults"]["stall"] >= 1
    faulty.proxy.clear()
    _assert_all_committed_are_good(faulty, {}, tmp_path)


def _assert_nothing_complete_looking(dest, files: dict[str, bytes]) -> None:
    """A failed download left no file at its final name with other bytes than the original
    (whole-file downloads write a temporary name and rename it when complete)."""
    for root, _dirs, names in os.walk(dest):
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), dest).replace(os.sep, "/")
            if rel in files:
                _assert_content(dest, {rel: files[rel]})


@pytest.mark.timeout(60)
def test_stalled_download_times_out_instead_of_hanging(faulty, tmp_path):
    uuid, files = _save(faulty, tmp_path, 9, dedup=False)
    faulty.proxy.stall_next(100_000, after_bytes=20_000, match="weights.bin")
    storage = faulty.storage(timeout=1, max_attempts=2)
    dest = tmp_path / "dl"
    with pytest.raises(errors.StorageUnavailable):
        with CheckpointContext(storage, dedup=False) as ctx:
            ctx.download(uuid, dest)
    storage.close()
    _assert_nothing_complete_looking(dest, files)


@BOTH_FORMATS
def test_failed_download_leaves_no_complete_looking_file(faulty, tmp_path, dedup):
    """A download that fails (a persistent reset on weights.bin's bytes) raises
    StorageUnavailable and leaves no file at its final name with other bytes than stored."""
    uuid, files = _save(faulty, tmp_path, 13, dedup=dedup)
    faulty.proxy.reset_next(100_000, after_bytes=30_000, match=_target(dedup, files))
    storage = faulty.storage(max_attempts=2)
    dest = tmp_path / "dl"
    with pytest.raises(errors.StorageUnavailable):
        with CheckpointContext(storage, dedup=dedup) as ctx:
            ctx.download(uuid, dest)
    storage.close()
    faulty.proxy.clear()
    assert faulty.proxy.stats["faults"]["reset"] >= 2
    _assert_nothing_complete_looking(dest, files)


@pytest.mark.timeout(60)
def test_one_stall_is_retried(faulty, tmp_path):
    faulty.proxy.stall_next(1, after_bytes=20_000, match="weights.bin")
    uuid, files = _save(faulty, tmp_path, 10, dedup=False, timeout=1)
    assert faulty.proxy.stats["faults"]["stall"] == 1
    _check_through_clean_connection(faulty, uuid, files, tmp_path)


def test_slow_link_still_succeeds(faulty, tmp_path):
    faulty.proxy.throttle(2_000_000)  # bytes keep flowing, so no read timeout fires
    uuid, files = _save(faulty, tmp_path, 11, dedup=False)
    assert faulty.proxy.stats["throttle_sleeps"] > 0
    faulty.proxy.throttle(None)
    _check_through_clean_connection(faulty, uuid, files, tmp_path)


# ---- background uploads ------------------------------------------------------------------------
def test_background_upload_failure_surfaces_from_wait(faulty, tmp_path):
    src = tmp_path / "src"
    _make_ckpt(src, 12)
    faulty.proxy.fail_next(100_000, status=503)
    storage = faulty.storage()
    ctx = CheckpointContext(storage, trial_id=1, dedup=False)
    ctx.upload(src, {"steps_completed": 1}, background=True)
    with pytest.raises(errors.BackgroundUploadError) as info:
        ctx.wait()
    assert isinstance(info.value.__cause__, errors.StorageUnavailable)
    faulty.proxy.clear()
    with contextlib.suppress(errors.BackgroundUploadError):  # already reported by wait()
        ctx.close()
    storage.close()
    _assert_all_committed_are_good(faulty, {}, tmp_path)


# ---- random faults, seeded ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("seed", "dedup"),
    [(1, False), (2, False), (3, True)],  # one seed of dedup: its saves make 3x the requests
    ids=["1-whole", "2-whole", "3-dedup"],
)
def test_random_faults_either_succeed_or_fail_cleanly(faulty, tmp_path, seed, dedup):
    faulty.proxy.random_faults(0.3, seed=seed, kinds=("http", "reset"), max_after_bytes=200_000)
    saved: dict[str, dict] = {}
    outcomes = []
    storage = faulty.storage()
    for i in range(4):
        try:
            uuid, files = _save(faulty, tmp_path, seed * 100 + i, storage=storage, dedup=dedup)
        except errors.StorageUnavailable:
            outcomes.append("unavailable")
            continue
        saved[uuid] = files
        outcomes.append("saved")
        dest = tmp_path / f"load-{uuid}"
        try:
            with CheckpointContext(storage, dedup=dedup) as ctx:
                ctx.download(uuid, dest)
        except errors.StorageUnavailable:
            outcomes.append("load-unavailable")
        else:
            _assert_content(dest, files)
            outcomes.append("loaded")
    storage.close()
    faults = sum(faulty.proxy.stats["faults"].values())
    faulty.proxy.clear()
    assert faults > 0, "no fault was injected"
    # Issue 15 item 9: the outcomes are asserted. Retries must absorb faults: a backend that
    # gave up on every fault would have at most one success-free outcome per fault, and would
    # never save *and* load back through the faulty connection.
    failures = outcomes.count("unavailable") + outcomes.count("load-unavailable")
    assert "loaded" in outcomes, f"nothing survived the faults: {outcomes}"
    assert faults > failures, f"{faults} faults, {failures} failures: retries absorbed none"
    assert set(saved) <= set(list_committed(faulty.direct())), "a reported save is missing"
    _assert_all_committed_are_good(faulty, saved, tmp_path)


# ---- deduplicated checkpoints only -------------------------------------------------------------
def test_dedup_lost_response_to_a_chunk_put_is_not_a_conflict(faulty, tmp_path, caplog):
    """The create-only PUT of a chunk reached the server, which stored it, but the answer was
    lost: the retry gets 412 (S3) / 409 (Azure) "already exists". The chunk is the one the
    commit meant (its key is its SHA-256), so the commit goes on and the checkpoint reads."""
    caplog.set_level(logging.INFO, logger="ckptstore.checkpointing.commit")
    files = _content(20)
    key = _chunk_key(files["weights.bin"], 1)
    faulty.proxy.reset_next(1, after_bytes=0, match=key, in_response=True)
    uuid, _ = _save(faulty, tmp_path, 20, dedup=True)
    assert faulty.proxy.stats["faults"]["reset"] == 1 and faulty.proxy.pending == 0
    # In an empty bucket the only chunk "already stored" is the one whose answer was lost:
    # the server did act on the first try, and the retry saw the chunk there.
    total = sum(len(d) for d in files.values())
    assert _uploaded(caplog) == [total - CHUNK]
    assert faulty.direct().read_bytes(key) == files["weights.bin"][CHUNK : 2 * CHUNK]
    _check_through_clean_connection(faulty, uuid, files, tmp_path)
    _assert_blob_store_sound(faulty)


def test_dedup_faults_while_reusing_chunks_and_restoring(faulty, tmp_path, caplog):
    """A second checkpoint reuses the first one's chunks (weights.bin) under faults, then both
    are restored with chunk GETs reset mid-body: success with identical bytes, or
    StorageUnavailable once the retry budget is spent, never a committed checkpoint with a
    missing or damaged chunk."""
    caplog.set_level(logging.INFO, logger="ckptstore.checkpointing.commit")
    storage = faulty.storage()
    ctx = _ctx(storage, True, trial_id=1)
    try:
        u1, f1 = _save(faulty, tmp_path, 30, ctx=ctx, weights_seed=99)
        shared = _chunk_key(f1["weights.bin"], 1)
        f2 = _content(31, weights_seed=99)
        new_chunk = _chunk_key(f2["nested/optimizer.bin"], 0)
        # The second commit uploads only its new chunks (the writer knows the shared ones) and
        # lists GC's condemnations once: two 503s on that listing, and two resets in the
        # middle of a new chunk's PUT.
        faulty.proxy.fail_next(2, status=503, match=".condemned")
        faulty.proxy.reset_next(2, after_bytes=20_000, match=new_chunk)
        u2, _ = _save(faulty, tmp_path, 31, ctx=ctx, weights_seed=99)
        assert faulty.proxy.stats["faults"] == {"http": 2, "reset": 2}
        assert faulty.proxy.pending == 0
        m1, m2 = (fmt.read_manifest(faulty.direct(), u) for u in (u1, u2))
        assert m1["files"]["weights.bin"]["blobs"] == m2["files"]["weights.bin"]["blobs"]
        assert _uploaded(caplog)[-1] == sum(len(d) for d in f2.values()) - 300_000

        # Restores: the shared chunk's GET is reset mid-body and answered 503 / 500.
        faulty.proxy.reset_next(1, after_bytes=30_000, match=shared)
        faulty.proxy.fail_next(1, status=503, match=shared)
        with ctx.restore_path(u1) as path:
            _assert_content(path, f1)
        faulty.proxy.fail_next(1, status=500, match=shared)
        faulty.proxy.reset_next(1, after_bytes=30_000, match=shared)
        # From storage: the restore cache would serve the shared chunk u1's restore kept.
        ctx.download(u2, tmp_path / "dl2", cache=False)
        _assert_content(tmp_path / "dl2", f2)
        assert faulty.proxy.stats["faults"] == {"http": 4, "reset": 4}
        assert faulty.proxy.pending == 0

        # Beyond the retry budget: StorageUnavailable, for a restore ...
        faulty.proxy.reset_next(100_000, after_bytes=30_000, match=shared)
        with pytest.raises(errors.StorageUnavailable):
            ctx.download(u2, tmp_path / "dl3", cache=False)
        faulty.proxy.clear()
        # ... and for a save that cannot read GC's condemnations: nothing is committed.
        faulty.proxy.fail_next(100_000, status=503, match=".condemned")
        with pytest.raises(errors.StorageUnavailable):
            _save(faulty, tmp_path, 32, ctx=ctx, weights_seed=99)
        faulty.proxy.clear()
        assert set(list_committed(faulty.direct())) == {u1, u2}
    finally:
        faulty.proxy.clear()
        ctx.close()
        storage.close()
    _assert_all_committed_are_good(faulty, {u1: f1, u2: f2}, tmp_path)


def _unfinished_claims(storage) -> set[str]:
    """Condemnations claimed by a sweep that did not say it finished."""
    listing = condemned.read_all(storage)
    return {name for name in listing.claims if listing.running(name)}


def _delete_requests(faulty: Faulty) -> str:
    """What the request line of a delete holds: S3 deletes are ``POST /bucket?delete``
    (DeleteObjects, the keys in the body), Azure deletes are ``DELETE /.../key``."""
    return "?delete" if faulty.kind == "s3" else "DELETE "


def test_dedup_blob_sweep_under_faults_never_removes_a_needed_chunk(faulty, tmp_path):
    """GC's blob sweep under faults on its delete requests: transient faults are retried and
    the sweep removes exactly the unreferenced chunks; a persistent fault (on one chunk, then
    on every delete) stops it with StorageUnavailable, having removed nothing a committed
    manifest names. Every committed checkpoint still downloads and verifies."""
    direct = faulty.direct()
    storage = faulty.storage()
    deletes = _delete_requests(faulty)
    try:
        with _ctx(storage, True, trial_id=1) as ctx:
            u1, _ = _save(faulty, tmp_path, 40, ctx=ctx, weights_seed=99)
            u2, f2 = _save(faulty, tmp_path, 41, ctx=ctx, weights_seed=99)
            u3, _ = _save(faulty, tmp_path, 42, ctx=ctx)
        for gone in (u1, u3):
            commit.delete_checkpoint(direct, gone)
        needed = fmt.load_manifest(direct, u2).blobs()
        doomed = blobs.listed(direct) - needed
        assert len(needed) == 8 and len(doomed) == 3 + 8  # u1's own chunks and all of u3's

        # Transient: a 503, a delete whose answer is lost (the server deleted), a 500.
        faulty.proxy.reset_stats()
        faulty.proxy.fail_next(1, status=503, match=deletes)
        faulty.proxy.reset_next(1, after_bytes=0, match=deletes, in_response=True)
        faulty.proxy.fail_next(1, status=500, match=deletes)
        assert sorted(blob_gc.sweep(storage)) == sorted(doomed)
        assert faulty.proxy.stats["faults"] == {"http": 2, "reset": 1}
        assert faulty.proxy.pending == 0
        assert blobs.listed(direct) == needed
        assert _unfinished_claims(direct) == set()
        _assert_all_committed_are_good(faulty, {u2: f2}, tmp_path)

        # Persistent, on one chunk: the sweep stops there (StorageUnavailable) after removing
        # the chunks before it; its claim stays unfinished (writers avoid those blobs).
        with _ctx(storage, True, trial_id=1) as ctx:
            u4, f4 = _save(faulty, tmp_path, 43, ctx=ctx, weights_seed=99)
        commit.delete_checkpoint(direct, u2)
        needed = fmt.load_manifest(direct, u4).blobs()
        doomed = sorted(blobs.listed(direct) - needed)
        assert len(doomed) == 3  # u2's optimizer.bin and config.json chunks
        faulty.proxy.reset_stats()
        faulty.proxy.fail_next(100_000, status=503, match=blobs.blob_key(doomed[1]))
        with pytest.raises(errors.StorageUnavailable):
            blob_gc.sweep(storage)
        faulty.proxy.clear()
        assert faulty.proxy.stats["faults"]["http"] == FAST_FAIL["max_attempts"]
        assert blobs.listed(direct) == needed | set(doomed[1:])
        assert len(_unfinished_claims(direct)) == 1
        _assert_all_committed_are_good(faulty, {u4: f4}, tmp_path)

        # Persistent, on every delete (two tries each, to stay quick): nothing is removed.
        faulty.proxy.reset_stats()
        faulty.proxy.fail_next(100_000, status=503, match=deletes)
        with faulty.storage(max_attempts=2) as impatient, pytest.raises(errors.StorageUnavailable):
            blob_gc.sweep(impatient)
        faulty.proxy.clear()
        assert faulty.proxy.stats["faults"]["http"] >= 2
        assert blobs.listed(direct) == needed | set(doomed[1:])
        _assert_all_committed_are_good(faulty, {u4: f4}, tmp_path)
        # Failed sweeps leave claims without "done"; a save meanwhile commits at once.
        with _ctx(storage, True, trial_id=1) as ctx:
            u5, f5 = _save(faulty, tmp_path, 44, ctx=ctx, weights_seed=99)
        # A clean sweep finishes the job (the failed sweeps' condemnation is still open).
        assert sorted(blob_gc.sweep(storage)) == doomed[1:]
        assert blobs.listed(direct) >= needed
        assert not set(doomed) & blobs.listed(direct)
        _assert_all_committed_are_good(faulty, {u4: f4, u5: f5}, tmp_path)
    finally:
        faulty.proxy.clear()
        storage.close()
