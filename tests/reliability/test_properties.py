"""Property-based tests (Hypothesis) against the real servers: local storage and the S3
emulator, with a SQLite registry.

- Saves: random file trees (names from the whole Unicode range, path separators, control
  characters, reserved names, undecodable and very long names), random metadata (nested,
  deep, huge, NaN/inf, non-string keys) through every save path. Every save either commits a
  checkpoint that downloads, verifies and loads back byte-identical (and whose metadata reads
  back as the one JSON policy says), or raises a typed ``CkptstoreError`` and commits nothing;
  a save whose every name and value is valid by the one rule must succeed.
- Storage specs: random and mistyped URLs open a storage or raise a typed error, never create
  a folder anywhere.
- Deletes and GC under injected faults (a read-only registry, storage errors mid-delete):
  afterwards no registry row points at a missing checkpoint, nothing committed that was not
  deleted is lost, and a clean GC finishes every delete that was cut short. (SIGKILL between
  the steps: ``test_delete_order.py``.)

Example counts are modest for 2-core CI (profile ``ckptstore-ci``; ``HYPOTHESIS_PROFILE=
ckptstore-dev`` runs 10x more); ``--hypothesis-show-statistics`` prints the cases per run.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import tempfile
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, assume, event, example, given, settings
from hypothesis import strategies as st

from ckptstore import errors
from ckptstore.checkpointing import CheckpointContext, scan
from ckptstore.checkpointing import format as fmt
from ckptstore.checkpointing import metadata as ckpt_metadata
from ckptstore.checkpointing.retention import LatestN
from ckptstore.jsonsafe import to_json
from ckptstore.registry import Registry
from ckptstore.storage_backends import open_storage
from tests._helpers.trees import read_tree

settings.register_profile(
    "ckptstore-ci",
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)
settings.register_profile("ckptstore-dev", parent=settings.get_profile("ckptstore-ci"),
                          max_examples=250)  # fmt: skip
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ckptstore-ci")
BASE = settings.get_profile(PROFILE)
# S3 examples cost ~10x local ones on the emulator: fewer of them.
S3 = settings(BASE, max_examples=max(8, BASE.max_examples // 3))
DELETES = settings(BASE, max_examples=max(8, BASE.max_examples // 2))

_counter = itertools.count()

# ---- strategies ---------------------------------------------------------------------------------
SPECIAL_SEGMENTS = [
    "MANIFEST.json", "metadata.json", ".ckptstore-pending.json", "CON", "nul", "aux.txt",
    "x:y.txt", "C:", "back\\slash.txt", "tab\tthere.txt", "nl\nx", "del\x7f", "c1\x85",
    "\udcff", "bad\udc80.bin", " ", "-", ".hidden", "...", "é", "e\u0301", "\u202eevil",
    "\ufeffbom", "emoji 🎉", "\u2028",
]  # fmt: skip
segment = st.one_of(
    st.text(st.characters(), min_size=1, max_size=12),  # any code point but lone surrogates
    st.sampled_from(SPECIAL_SEGMENTS),
    st.text(st.characters(), min_size=120, max_size=300),  # long: over 255 UTF-8 bytes often
)
relpath = st.lists(segment, min_size=1, max_size=3).map("/".join)
# Half the trees use names valid by the rule (any code point but control characters,
# surrogates, separators and ':'), so about half the saves are expected to commit.
plain_segment = st.text(
    st.characters(exclude_categories=("Cc", "Cs"), exclude_characters="/\\:"),
    min_size=1,
    max_size=40,
).filter(lambda name: name not in (".", "..") and len(name.encode()) <= 255)
plain_relpath = st.lists(plain_segment, min_size=1, max_size=3).map("/".join)
tree = st.one_of(
    st.dictionaries(relpath, st.binary(max_size=3000), min_size=1, max_size=6),
    st.dictionaries(plain_relpath, st.binary(max_size=3000), min_size=1, max_size=6),
)

scalar = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
    st.sampled_from(["\udcff", "nul\x00inside"]),
)  # fmt: skip
key = st.one_of(  # mostly str keys, sometimes int (allowed) or other types (refused)
    st.text(max_size=10), st.text(max_size=10), st.integers(),
    st.sampled_from([None, True, 1.5, (1, 2)]),
)  # fmt: skip
nested = st.recursive(
    scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(key, inner, max_size=4)),
    max_leaves=12,
)


# Half the metadata is valid by construction (str keys, JSON values; NaN/inf allowed: they
# become null), so about half the saves are expected to commit.
plain = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def metadata(draw: st.DrawFn) -> dict[Any, Any]:
    if draw(st.booleans()):
        return {"user": draw(plain), "steps_completed": draw(st.integers(0, 10**6))}
    meta: dict[Any, Any] = {"user": draw(nested)}
    depth = draw(st.sampled_from([0, 0, 0, 50, 150, 5000]))
    if depth:
        deep: Any = 1
        for _ in range(depth):
            deep = [deep]
        meta["deep"] = deep
    if draw(st.integers(0, 9)) == 0:
        meta["huge"] = "x" * draw(st.sampled_from([10_000, 2**20 + 10]))
    if draw(st.booleans()):
        meta["metrics"] = {"val_loss": draw(st.floats(allow_nan=True, allow_infinity=True))}
    steps = st.integers(0, 10**6)
    bad_steps = st.sampled_from([float("inf"), "ten", -1, 2.5, None])
    meta["steps_completed"] = draw(st.one_of(steps, steps, steps, bad_steps))
    return meta


save_path = st.sampled_from(["store_path", "store_path_background", "upload", "upload_background"])


# ---- helpers ------------------------------------------------------------------------------------
def _write_tree(root: str, files: dict[str, bytes]) -> dict[str, bytes]:
    """Create what the OS lets us create of ``files`` under ``root``; returns what was made."""
    made: dict[str, bytes] = {}
    os.makedirs(root, exist_ok=True)
    for rel, data in files.items():
        parts = rel.split("/")
        if any(p in ("", ".", "..") for p in parts):
            continue  # not a file name anywhere (and ".." would leave root)
        try:
            path = os.path.join(os.fsencode(root), *(os.fsencode(p) for p in parts))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "xb") as f:
                f.write(data)
        except (OSError, ValueError, UnicodeEncodeError):
            continue  # NUL, a name too long for the file system, a file/folder clash, ...
        made[rel] = data
    return made


def _entries(root: str) -> list[str]:
    """Relative paths of the files and empty folders (``"dir/"``) under ``root``: what a save
    of that folder has to store."""
    out = []
    broot = os.fsencode(root)
    for folder, dirs, names in os.walk(broot):
        rel = os.fsdecode(os.path.relpath(folder, broot)).replace(os.sep, "/")
        prefix = "" if rel == "." else rel + "/"
        if prefix and not dirs and not names:
            out.append(prefix)
        out += [prefix + os.fsdecode(n) for n in names]
    return out


def _valid_by_the_rules(root: str, meta: dict[Any, Any]) -> bool:
    try:
        for rel in _entries(root):
            fmt.check_entry(rel)
        ckpt_metadata.build_metadata("0" * 8, meta)
    except errors.CkptstoreError:
        return False
    return True


def _save(ctx: CheckpointContext, how: str, files: dict[str, bytes], meta, scratch: str):
    if how.startswith("store_path"):
        with ctx.store_path(meta, background=how.endswith("background")) as (path, uuid):
            made = _write_tree(path, files)
    else:
        src = os.path.join(scratch, "src")
        made = _write_tree(src, files)
        uuid = ctx.upload(src, meta, background=how.endswith("background"))
    ctx.wait()
    return uuid, made


def _fresh_url(base: str) -> str:
    return f"{base}-{next(_counter)}"


def check_save_property(base_url: str, files, meta, how) -> None:
    url = _fresh_url(base_url)
    scratch = tempfile.mkdtemp(prefix="ckptstore-prop-")
    try:
        with Registry(f"sqlite:///{scratch}/r.db") as registry:
            registry.ensure_trial(1)
            with CheckpointContext(url, index=registry, trial_id=1) as ctx:
                made: dict[str, bytes] = {}
                try:
                    uuid, made = _save(ctx, how, files, meta, scratch)
                except errors.CkptstoreError as exc:
                    event(f"refused: {type(exc).__name__}")
                    probe = os.path.join(scratch, "probe")
                    _write_tree(probe, files)
                    assert not _valid_by_the_rules(probe, meta), "a valid save was refused"
                    assert scan.list_committed(ctx.storage) == []
                    assert ctx.latest_checkpoint() is None
                    assert registry.checkpoint_records(trial_id=1) == []
                    return
                # committed: it downloads, verifies and reads back byte-identical
                event("committed")
                expected = {r: d for r, d in made.items() if r not in fmt.RESERVED_NAMES}
                assert scan.list_committed(ctx.storage) == [uuid]
                assert ctx.latest_checkpoint() == uuid
                dest = os.path.join(scratch, "dest")
                ctx.download(uuid, dest)
                got = read_tree(dest)
                got.pop(fmt.METADATA_NAME)
                assert got == expected
                with ctx.restore_path(uuid) as path:  # local: the committed folder itself
                    restored = read_tree(path)
                restored.pop(fmt.METADATA_NAME)
                restored.pop(fmt.MANIFEST_NAME, None)
                assert restored == expected
                stored = ctx.get_metadata(uuid)
                assert stored["user"] == to_json(meta["user"])
                assert stored["steps_completed"] == meta["steps_completed"]
                assert registry.get_checkpoint(uuid).metadata["user"] == stored["user"]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# ---- saves --------------------------------------------------------------------------------------
@settings(BASE)
@given(files=tree, meta=metadata(), how=save_path)
def test_every_local_save_commits_readable_or_raises_typed(tmp_path_factory, files, meta, how):
    base = str(tmp_path_factory.getbasetemp() / "prop-local" / "store")
    check_save_property(base, files, meta, how)


@pytest.fixture(scope="module")
def s3_base(s3_server) -> str:
    import uuid

    from tests.servers.emulators import create_bucket

    bucket = f"prop-{uuid.uuid4().hex[:10]}"
    create_bucket(s3_server, bucket)
    return f"s3://{bucket}/root"


@S3
@given(files=tree, meta=metadata(), how=save_path)
def test_every_s3_save_commits_readable_or_raises_typed(s3_base, files, meta, how):
    check_save_property(s3_base, files, meta, how)


# ---- storage specs ------------------------------------------------------------------------------
spec = st.one_of(
    st.text(max_size=20),
    st.builds("{}:{}{}".format, st.sampled_from(["s3", "gs", "az", "file", "memory", "abfs", "x"]),
              st.sampled_from(["", "/", "//", "///"]), st.text(max_size=10)),
    st.sampled_from(["", " ", "\t", "s3:/b", "s3://", "s3:///b", "gs:b", " s3://b/p", "~"]),
)  # fmt: skip


@settings(BASE, max_examples=BASE.max_examples * 4)
@given(spec=spec)
@example(spec="GS://;")  # found by this test: the GCS client's bucket-name ValueError escaped
def test_storage_specs_open_or_raise_typed_and_create_nothing(tmp_path_factory, spec):
    home = tmp_path_factory.mktemp("spec")
    cwd = os.getcwd()
    os.chdir(home)
    try:
        try:
            storage = open_storage(spec)
        except errors.CkptstoreError:
            pass
        except ValueError as exc:  # never a bare ValueError
            pytest.fail(f"untyped error for {spec!r}: {exc!r}")
        else:
            assume(storage.url.startswith(("file://", "memory://")))  # no bucket to reach
            storage.close()
            # What must have been refused: empty, surrounding whitespace, "scheme:" without //.
            assert spec.strip() and spec == spec.strip(), spec
            mistyped = re.match(r"[A-Za-z][A-Za-z0-9+.\-]+:(?!//)", spec)
            assert not mistyped or mistyped.group(0).lower() == "file:", spec
    finally:
        os.chdir(cwd)
    assert os.listdir(home) == []  # opening never creates a folder


# ---- deletes and GC under injected faults -------------------------------------------------------
class ReadOnlyRegistry:
    """Injected fault: the registry's write methods fail as a read-only database does."""

    WRITES = {"record_checkpoint", "set_checkpoint_state", "pin_checkpoint", "unpin_checkpoint"}

    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._registry, name)
        if name in self.WRITES:

            def refuse(*_args: Any, **_kwargs: Any) -> None:
                raise errors.RegistryError(
                    "injected: attempt to write a readonly database (registry read-only)"
                )

            return refuse
        return attr


class FailingDeletes:
    """Injected fault: while active, the ``fail_at``-th delete of the (real) storage raises."""

    def __init__(self, storage: Any, fail_at: int | None) -> None:
        self.storage, self.fail_at, self.calls = storage, fail_at, 0

    def __enter__(self) -> Any:
        if self.fail_at is not None:
            original = type(self.storage).delete

            def delete(key: str, globs=None):
                self.calls += 1
                if self.calls == self.fail_at:
                    raise errors.StorageUnavailable(f"injected: delete of {key!r} failed")
                return original(self.storage, key, globs)

            self.storage.delete = delete  # instance attribute shadows the method
        return self.storage

    def __exit__(self, *exc: object) -> None:
        self.storage.__dict__.pop("delete", None)


op = st.one_of(
    st.tuples(st.just("save"), st.integers(0, 0), st.none()),
    st.tuples(st.just("delete"), st.integers(0, 20),
              st.one_of(st.none(), st.just("registry"), st.integers(1, 2))),
    st.tuples(st.just("gc"), st.integers(1, 2),
              st.one_of(st.none(), st.just("registry"), st.integers(1, 3))),
)  # fmt: skip


def check_delete_property(base_url: str, ops) -> None:
    url = _fresh_url(base_url)
    scratch = tempfile.mkdtemp(prefix="ckptstore-prop-")
    try:
        with Registry(f"sqlite:///{scratch}/r.db") as registry:
            registry.ensure_trial(1)
            saved: list[str] = []
            asked: set[str] = set()  # deletes that were asked for (done or cut short)
            shared = open_storage(url)  # one client per program: opening one costs ~1 s on S3
            for step, (kind, arg, fault) in enumerate(ops):
                index: Any = ReadOnlyRegistry(registry) if fault == "registry" else registry
                policy = LatestN(arg) if kind == "gc" else None
                fail_at = fault if isinstance(fault, int) else None
                with FailingDeletes(shared, fail_at) as storage, CheckpointContext(
                    storage, index=index, trial_id=1, gc_policy=policy, gc_grace_seconds=0,
                    owns_storage=False,
                ) as ctx:  # fmt: skip
                    try:
                        if kind == "save":
                            with ctx.store_path({"steps_completed": step}) as (path, uuid):
                                with open(os.path.join(path, "w.bin"), "wb") as f:
                                    f.write(os.urandom(500))
                            saved.append(uuid)
                        elif kind == "delete" and saved:
                            target = saved[arg % len(saved)]
                            asked.add(target)
                            ctx.delete(target)
                        elif kind == "gc":
                            # LatestN(arg) may delete any live checkpoint but the newest
                            # ``arg`` (oldest first, as GC orders them), fault or not: those
                            # stay in ``saved - asked``, which the invariants check.
                            live = registry.checkpoint_records(trial_id=1)
                            asked |= {r.uuid for r in live[:-arg]}
                            ctx.gc()
                        event(f"{kind}, fault {type(fault).__name__}: completed")
                    except errors.CkptstoreError as exc:
                        # a typed failure is fine; the invariants below must hold
                        event(f"{kind}, fault {type(fault).__name__}: {type(exc).__name__}")
                    except Exception as exc:  # noqa: BLE001
                        pytest.fail(f"untyped {type(exc).__name__} from {kind}: {exc}")
                _check_invariants(shared, registry, set(saved) - asked, scratch, verify=False)
            _check_invariants(shared, registry, set(saved) - asked, scratch, verify=True)
            # a clean GC finishes every delete cut short
            with CheckpointContext(shared, index=registry, trial_id=1, gc_grace_seconds=0) as ctx:
                ctx.gc()
            rows = registry.checkpoint_records(trial_id=1, states=None)
            assert not [r.uuid for r in rows if r.state == "DELETING"]
            live = {r.uuid for r in rows if r.state in ("COMMITTED", "PARTIALLY_DELETED")}
            assert set(scan.list_committed(shared)) == live
            shared.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _check_invariants(
    storage: Any, registry: Registry, must_live: set[str], scratch: str, *, verify: bool
) -> None:
    committed = set(scan.list_committed(storage))
    for record in registry.checkpoint_records(trial_id=1):
        assert record.uuid in committed, f"row {record.uuid} points at a missing checkpoint"
    assert must_live <= committed, f"lost: {must_live - committed}"
    for uuid in must_live if verify else ():
        with CheckpointContext(storage) as ctx:
            ctx.download(uuid, os.path.join(scratch, f"v-{uuid}"))  # verifies


@DELETES
@given(ops=st.lists(op, min_size=2, max_size=7))
def test_local_deletes_and_gc_under_faults_keep_the_registry_true(tmp_path_factory, ops):
    base = str(tmp_path_factory.getbasetemp() / "prop-del" / "store")
    check_delete_property(base, [("save", 0, None), ("save", 0, None), *ops])


@settings(DELETES, max_examples=max(4, DELETES.max_examples // 2))
@given(ops=st.lists(op, min_size=2, max_size=6))
def test_s3_deletes_and_gc_under_faults_keep_the_registry_true(s3_base, ops):
    check_delete_property(s3_base, [("save", 0, None), ("save", 0, None), *ops])
