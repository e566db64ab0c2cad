"""Determined checkpoint_storage dicts, URL schemes and the lazy backend table."""

import os

import pytest

from ckptstore import errors
from ckptstore.storage_backends import open_storage, parse_storage_config, split_storage_config
from ckptstore.storage_backends.schemes import (
    BACKENDS,
    ConfigKeys,
    backend_class,
    config_types,
    register_backend,
)


@pytest.mark.parametrize(
    "config, url, options",
    [
        ({"type": "s3", "bucket": "b", "prefix": "/p/q/"}, "s3://b/p/q", {}),
        (
            {"type": "s3", "bucket": "b", "access_key": "AK", "secret_key": "SK",
             "endpoint_url": "http://127.0.0.1:1"},
            "s3://b",
            {"access_key": "AK", "secret_key": "SK", "endpoint_url": "http://127.0.0.1:1"},
        ),
        ({"type": "gcs", "bucket": "g", "prefix": "x"}, "gs://g/x", {}),
        ({"type": "gcs", "bucket": "g", "composite_threshold": 2**28}, "gs://g", {"composite_threshold": 2**28}),
        ({"type": "azure", "container": "c", "connection_string": "cs"}, "az://c", {"connection_string": "cs"}),
        ({"type": "shared_fs", "host_path": "/mnt/nfs", "storage_path": "ckpts"}, "/mnt/nfs/ckpts", {}),
        ({"type": "shared_fs", "host_path": "/mnt/nfs", "storage_path": "/mnt/nfs/a"}, "/mnt/nfs/a", {}),
        ({"type": "directory", "container_path": "/data/ckpts"}, "/data/ckpts", {}),
        ({"type": "s3", "bucket": "b", "concurrency": 4, "save_trial_latest": 2}, "s3://b", {"concurrency": 4}),
    ],
)  # fmt: skip
def test_parse_storage_config(config, url, options):
    assert parse_storage_config(config) == (url, options)


@pytest.mark.parametrize(
    "config, key",
    [
        ({"bucket": "b"}, "'type'"),
        ({"type": "ftp"}, "'ftp'"),
        ({"type": "s3"}, "'bucket'"),
        ({"type": "s3", "bucket": "b", "bukcet_typo": 1}, "'bukcet_typo'"),
        ({"type": "gcs", "bucket": "b", "container": "c"}, "'container'"),
        ({"type": "azure"}, "'container'"),
        ({"type": "shared_fs"}, "'host_path'"),
        ({"type": "shared_fs", "host_path": "/a", "storage_path": "/elsewhere"}, "storage_path"),
        ({"type": "shared_fs", "host_path": "/a", "storage_path": "../up"}, "storage_path"),
        ({"type": "directory"}, "'container_path'"),
        ({"type": "s3", "bucket": "b", "save_trial_best": -1}, "save_trial_best"),
    ],
)
def test_bad_config_names_the_key(config, key):
    with pytest.raises(errors.InvalidStorageConfig) as info:
        open_storage(config)
    assert key in str(info.value)


def test_secret_not_echoed_in_config_errors():
    with pytest.raises(errors.InvalidStorageConfig) as info:
        parse_storage_config({"type": "s3", "bucket": "b", "secret_key": 12345678})
    assert "12345678" not in str(info.value)


def test_split_storage_config_returns_gc_keys():
    storage, gc = split_storage_config(
        {"type": "directory", "container_path": "/x", "save_experiment_best": 1,
         "save_trial_best": 2, "save_trial_latest": 3}
    )  # fmt: skip
    assert storage == {"type": "directory", "container_path": "/x"}
    assert gc == {"save_experiment_best": 1, "save_trial_best": 2, "save_trial_latest": 3}


def test_dict_opens_local_storage(tmp_path):
    storage = open_storage({"type": "shared_fs", "host_path": str(tmp_path), "storage_path": "c"})
    storage.write_bytes("k", b"v")
    assert (tmp_path / "c" / "k").read_bytes() == b"v"


def test_every_scheme_resolves_to_a_class():
    for scheme in BACKENDS:
        assert backend_class(scheme).__name__.endswith("Storage")


def test_a_backend_is_one_row_url_scheme_and_config_type_alike():
    """Registering a backend with its config keys makes both spellings work: the URL and the
    Determined-style dict (no second table to keep in step)."""
    keys = ConfigKeys("mem2", "bucket", optional=("prefix",))
    register_backend("mem2", "ckptstore.storage_backends.memory:MemoryStorage", config=keys)
    try:
        url, options = parse_storage_config({"type": "mem2", "bucket": "b", "prefix": "p/q"})
        assert (url, options) == ("mem2://b/p/q", {})
        with pytest.raises(errors.InvalidStorageConfig, match="missing the required key 'bucket'"):
            parse_storage_config({"type": "mem2"})
    finally:
        BACKENDS.pop("mem2")
    with pytest.raises(errors.InvalidStorageConfig, match="'mem2' is not supported"):
        parse_storage_config({"type": "mem2", "bucket": "b"})
    for kind, (scheme, _keys) in config_types().items():
        assert backend_class(scheme).__name__.endswith("Storage"), kind


def test_missing_package_names_the_pip_command():
    register_backend("ckpttest", "no_such_package_xyz.mod:Cls", "pip install no-such-package-xyz")
    try:
        with pytest.raises(errors.MissingDependency, match="pip install no-such-package-xyz"):
            open_storage("ckpttest://x")
    finally:
        BACKENDS.pop("ckpttest")
    with pytest.raises(errors.InvalidStorageConfig):
        register_backend("x", "no-colon")


def test_unknown_scheme_and_bad_specs():
    with pytest.raises(errors.InvalidStorageConfig, match="Unknown storage URL scheme"):
        open_storage("nosuchproto://bucket/x")
    with pytest.raises(errors.InvalidStorageConfig):
        open_storage(42)  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidStorageConfig):
        open_storage("")
    with pytest.raises(errors.InvalidStorageConfig, match="positive int"):
        open_storage("memory://x", concurrency=0)
    with pytest.raises(errors.InvalidStorageConfig, match="not accepted"):
        open_storage("memory://x", bogus_option=1)


def test_credentials_in_bucket_urls_are_rejected_without_echo():
    with pytest.raises(errors.InvalidStorageConfig) as info:
        open_storage("s3://AKIA:hunter2@bucket/x")
    assert "hunter2" not in str(info.value)


def test_generic_fsspec_fallback_round_trip(tmp_path):
    from ckptstore.storage_backends.fsspec_generic import FsspecStorage

    storage = FsspecStorage(f"file://{tmp_path}")
    (tmp_path / "src" / "d").mkdir(parents=True)
    (tmp_path / "src" / "d" / "f.bin").write_bytes(b"abc")
    assert storage.upload(str(tmp_path / "src"), "ck") == {"d/f.bin": 3}
    assert storage.list("ck") == {"d/f.bin": 3}
    assert storage.write_if_absent("lock", b"1") is True
    assert storage.write_if_absent("lock", b"2") is False
    storage.write_bytes("ck/other/x.txt", b"x")
    assert storage.delete("ck", globs=["other/*"]) == {"d/f.bin": 3}
    assert storage.list("ck") == {"d/f.bin": 3}
    storage.download("ck", str(tmp_path / "out"))
    assert (tmp_path / "out" / "d" / "f.bin").read_bytes() == b"abc"
    assert storage.delete("ck") == {}
    assert os.path.exists(tmp_path / "lock")


def test_download_part_size_defaults_and_overrides(s3_server):
    from ckptstore.storage_backends.s3 import S3Storage

    MiB = 2**20
    with open_storage("s3://bucket-x/p") as st:  # backend defaults: 64 MiB up, 128 MiB down
        assert (st.part_size, st.download_part_size) == (64 * MiB, 128 * MiB)
        assert st._part_ranges(300 * MiB) == [(0, 128 * MiB), (128 * MiB, 128 * MiB),
                                              (256 * MiB, 44 * MiB)]  # fmt: skip
    with open_storage("s3://bucket-x/p", part_size=8 * MiB) as st:  # one size for both ways
        assert st.download_part_size == 8 * MiB
    config = {"type": "s3", "bucket": "bucket-x", "download_part_size": 16 * MiB}
    with open_storage(config) as st:
        assert isinstance(st, S3Storage)
        assert (st.part_size, st.download_part_size) == (64 * MiB, 16 * MiB)
    with open_storage("memory://x") as st:  # a backend without its own download default
        assert st.download_part_size == st.part_size
    with pytest.raises(errors.InvalidStorageConfig, match="download_part_size"):
        open_storage("memory://x", download_part_size=0)


def test_s3_request_checksums_default_on_and_follow_boto3_switch(monkeypatch):
    monkeypatch.delenv("AWS_REQUEST_CHECKSUM_CALCULATION", raising=False)
    with open_storage("s3://bucket-x/p", endpoint_url="http://127.0.0.1:9") as st:
        assert st._client.meta.config.request_checksum_calculation == "when_supported"
    monkeypatch.setenv("AWS_REQUEST_CHECKSUM_CALCULATION", "WHEN_REQUIRED")
    with open_storage("s3://bucket-x/p", endpoint_url="http://127.0.0.1:9") as st:
        assert st._client.meta.config.request_checksum_calculation == "when_required"


# ---- StorageConfig: parsed once where a spec enters, one precedence rule (issue 43) ----------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ckptstore.storage_backends.spec import StorageConfig, resolve  # noqa: E402


def test_resolve_owns_the_precedence_argument_config_env_default(tmp_path, monkeypatch):
    monkeypatch.setenv("CKPTSTORE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("CKPTSTORE_STORAGE", raising=False)
    assert resolve().url == str(tmp_path / "home" / "checkpoints")
    monkeypatch.setenv(
        "CKPTSTORE_STORAGE",
        '{"type": "s3", "bucket": "env", "save_trial_latest": 3, "dedup": false}',
    )
    env = resolve()
    assert (env.url, env.retention, env.dedup) == ("s3://env", {"save_trial_latest": 3}, False)
    assert resolve(fallback="gs://config/p").url == "gs://config/p"
    assert resolve(str(tmp_path), fallback="gs://config/p").url == str(tmp_path)
    # A config's GC keys join the storage chosen; the storage's own keys win.
    joined = resolve(retention={"save_trial_latest": 5, "save_trial_best": 2})
    assert joined.retention == {"save_trial_latest": 3, "save_trial_best": 2}
    monkeypatch.setenv("CKPTSTORE_STORAGE", "{not json")
    with pytest.raises(errors.InvalidConfig, match="CKPTSTORE_STORAGE must hold a JSON object"):
        resolve()


def test_an_open_storage_is_used_as_it_is_and_never_closed_by_its_config(tmp_path):
    store = open_storage(str(tmp_path))
    config = resolve(store)
    assert config.open() is store and config.url == store.url and config.to_env() == store.url
    assert resolve(config) is config  # a StorageConfig passes through every layer unchanged


_GC = st.dictionaries(
    st.sampled_from(["save_trial_best", "save_trial_latest", "save_experiment_best"]),
    st.integers(0, 9),
)
_SPECS = st.one_of(
    st.sampled_from(["/data/ckpts", "s3://b/p", "gs://g", "memory://m"]),
    st.fixed_dictionaries(
        {"type": st.just("s3"), "bucket": st.sampled_from(["b", "c"])},
        optional={
            "prefix": st.sampled_from(["p", "a/b"]),
            "endpoint_url": st.just("http://127.0.0.1:1"),
            "concurrency": st.integers(1, 64),
        },
    ),
)


@settings(max_examples=60, deadline=None)
@given(spec=_SPECS, gc=_GC, dedup=st.sampled_from([None, True, False]), extra=_GC)
def test_a_storage_config_reaches_a_child_process_unchanged(spec, gc, dedup, extra):
    if isinstance(spec, dict):
        spec = {**spec, **gc, **({} if dedup is None else {"dedup": dedup})}
    parent = resolve(spec, retention=extra)
    child = StorageConfig.parse(parent.to_env())  # CKPTSTORE_STORAGE / a registry row
    assert (child.url, dict(child.options)) == (parent.url, dict(parent.options))
    assert (dict(child.retention), child.dedup) == (dict(parent.retention), parent.dedup)
    assert parent.retention == {**extra, **(gc if isinstance(spec, dict) else {})}


def test_a_trusted_row_url_is_opened_with_the_callers_own_options(tmp_path):
    # A registry row picks a location, never the options: the same backend gets the caller's.
    config = resolve({"type": "directory", "container_path": str(tmp_path / "a"), "concurrency": 3})
    with config.open_at(str(tmp_path / "b")) as same, config.open_at("memory://other") as other:
        assert same.url.endswith("/b") and same.concurrency == 3
        assert other.url == "memory://other"
