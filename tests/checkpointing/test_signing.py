"""Signed checkpoints (issue 27): signed at commit in OpenSSF model-signing's format, verified on
download/restore when a verify key is configured, interoperable with ``model_signing`` itself,
and ``ckptstore checkpoint sign|verify``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckptstore import errors
from ckptstore.checkpointing import CheckpointContext, signing
from ckptstore.checkpointing.checksums import crc32c_bytes
from ckptstore.checkpointing.format import Manifest
from ckptstore.core import init
from tests.checkpointing._helpers import ec_key_pair, forge, same_crc32c
from tests.cli.helpers import make_env

model_signing = pytest.importorskip("model_signing")

FILES = {"a.bin": os.urandom(3000), "b.bin": os.urandom(3000), "sub/c.json": b"{}"}


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """``(private, public, other_public)`` PEM files: a P-256 key pair and a stranger's key."""
    folder = tmp_path_factory.mktemp("keys")
    key, pub = ec_key_pair(folder)
    return key, pub, ec_key_pair(folder, "other")[1]


def commit(where, signing_key=None, dedup=False) -> str:
    """A checkpoint of FILES written through core.init (signed with ``signing_key``)."""
    with init(
        storage=where.storage,
        registry=where.registry,
        trial_id=1,
        preempt_signals=False,
        checkpoint_dedup=dedup,
        signing_key=signing_key,
    ) as ctx:
        with ctx.checkpoint.store_path({"steps_completed": 1}) as (path, uuid):
            for rel, data in FILES.items():
                Path(path, rel).parent.mkdir(parents=True, exist_ok=True)
                Path(path, rel).write_bytes(data)
    return uuid


def test_signed_at_commit_downloads_verify_with_model_signing_unmodified(where, keys, tmp_path):
    key, pub, other = keys
    uuid = commit(where, signing_key=key)
    out = tmp_path / "dl"
    with CheckpointContext(where.storage, verify_key=pub) as reader:
        reader.download(uuid, out)
    assert (out / signing.SIGNATURE_NAME).is_file()
    # model_signing's own verifier (what `model_signing verify key` runs) accepts the folder
    model_signing.verifying.Config().use_elliptic_key_verifier(public_key=pub).verify(
        out, out / signing.SIGNATURE_NAME
    )
    with pytest.raises(errors.SignatureError, match="does not verify"):
        signing.verify_folder(out, other)  # a stranger's key
    with CheckpointContext(where.storage, verify_key=other) as reader:
        with pytest.raises(errors.SignatureError):  # in place on local storage too
            with reader.restore_path(uuid):
                pass


def test_tampered_swapped_and_unsigned_are_refused(where, keys, tmp_path):
    key, pub, _ = keys
    storage_dedup = commit(where, signing_key=key, dedup=True)
    whole = commit(where, signing_key=key)
    unsigned = commit(where)
    with CheckpointContext(where.storage, verify_key=pub) as reader:
        # a deduplicated checkpoint's chunk list swapped for another file's (sizes, checksums
        # and blob hashes all consistent): only the signature tells
        forge(reader.storage, storage_dedup, lambda f: f.update({"b.bin": dict(f["a.bin"])}))
        with pytest.raises(errors.SignatureError, match="b.bin"):
            reader.download(storage_dedup, tmp_path / "swapped")
        # a whole file replaced, its manifest entry updated to match
        local = Path(where.storage, whole, "a.bin")
        os.chmod(local, 0o644)
        local.write_bytes(b"x" * 3000)
        forge(reader.storage, whole, lambda f: f["a.bin"].update(crc32c=crc32c_bytes(b"x" * 3000)))
        with pytest.raises(errors.SignatureError, match="a.bin"):
            reader.download(whole, tmp_path / "tampered")
        # the signature removed
        forge(reader.storage, whole, lambda f: f.pop(signing.SIGNATURE_NAME))
        with pytest.raises(errors.SignatureError, match="not signed"):
            reader.download(whole, tmp_path / "removed")
        with pytest.raises(errors.SignatureError, match="not signed"):
            reader.download(unsigned, tmp_path / "unsigned")
        # a selection verifies what it downloaded
        reader.download(storage_dedup, tmp_path / "part", selector="a.bin")
    with CheckpointContext(where.storage) as reader:  # no verify key: nothing checked
        reader.download(unsigned, tmp_path / "plain")


def test_signing_and_verifying_hash_each_file_once_in_the_checksum_read(
    where, keys, tmp_path, monkeypatch
):
    """No second pass: model_signing's own hashing never runs, and the commit and the
    restore each read every file once, for its crc32c and its SHA-256 together."""
    from ckptstore.checkpointing import checksums as ckpt_checksums
    from ckptstore.checkpointing import format as fmt

    key, pub, _ = keys

    def second_pass(*args, **kwargs):
        raise AssertionError("model_signing hashed the folder again")

    monkeypatch.setattr(model_signing.hashing.Config, "hash", second_pass)
    reads: list[tuple[str, bool, bool]] = []
    real = ckpt_checksums.file_sums

    def spy(path, *, crc32c=True, sha256=False):
        reads.append((os.path.basename(path), crc32c, sha256))
        return real(path, crc32c=crc32c, sha256=sha256)

    monkeypatch.setattr(fmt, "file_sums", spy)
    uuid = commit(where, signing_key=key)
    names = sorted(os.path.basename(rel) for rel in FILES)
    assert sorted(r for r in reads if r[0] != "model.sig") == [(n, True, True) for n in names]
    reads.clear()
    with CheckpointContext(where.storage, verify_key=pub) as reader:
        with reader.restore_path(uuid):  # in place: the crc32c check hashes too
            pass
    assert sorted(r for r in reads if r[0] in names) == [(n, True, True) for n in names]


def test_files_from_the_restore_cache_are_hashed_by_its_crc_read(where, keys, tmp_path):
    """A verified download whose files come from the restore cache (no digests kept there)
    gets their SHA-256 from the read that checks their crc32c, so it verifies (a file without
    a digest would be "missing")."""
    from ckptstore.checkpointing import RestoreCache

    key, pub, _ = keys
    uuid = commit(where, signing_key=key)
    cache = RestoreCache(tmp_path / "cache")
    with CheckpointContext(where.storage, verify_key=pub, cache=cache) as reader:
        reader.download(uuid, tmp_path / "first")
        reader.download(uuid, tmp_path / "again")
        report = reader.last_download
        assert report.from_storage == 0 and report.from_cache == sum(report.files.values())
        assert set(FILES) <= set(report.files)


def test_a_poisoned_cache_entry_is_a_miss_not_a_refusal(where, keys, tmp_path):
    """A cache entry with the right size and crc32c but other bytes (a CRC collision, or a
    writer of the cache) never reaches the caller, and does not make a signed checkpoint
    fail to load either: with a signature it is a miss, fetched again from storage."""
    from ckptstore.checkpointing import RestoreCache
    from ckptstore.checkpointing import format as fmt

    key, pub, _ = keys
    uuid = commit(where, signing_key=key)
    cache = RestoreCache(tmp_path / "cache")
    with CheckpointContext(where.storage, verify_key=pub, cache=cache) as reader:
        reader.download(uuid, tmp_path / "first")
        entry = fmt.load_manifest(reader.storage, uuid).files["a.bin"]
        path = str(cache.root / cache.file_key(reader.storage.url, uuid, "a.bin", entry))
        forged = same_crc32c(b"x" * len(FILES["a.bin"]), FILES["a.bin"])
        Path(path + ".new").write_bytes(forged)
        os.replace(path + ".new", path)  # not through the first download's hard link
        reader.download(uuid, tmp_path / "again")
        assert (tmp_path / "again" / "a.bin").read_bytes() == FILES["a.bin"]
        assert reader.last_download.from_storage >= len(FILES["a.bin"])


def test_folder_signed_by_model_signing_verifies_here(where, keys, tmp_path):
    key, pub, _ = keys
    folder = tmp_path / "model"
    for rel, data in FILES.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    hashing = model_signing.hashing.Config().set_ignored_paths(
        paths=list(signing.UNSIGNED_NAMES), ignore_git_paths=False
    )
    model_signing.signing.Config().use_elliptic_key_signer(private_key=key).set_hashing_config(
        hashing
    ).sign(folder, folder / signing.SIGNATURE_NAME)
    with CheckpointContext(where.storage, verify_key=pub) as ctx:
        uuid = ctx.upload(folder)
        ctx.download(uuid, tmp_path / "dl")


def test_cli_sign_and_verify(tmp_path, keys, monkeypatch):
    key, pub, other = keys
    env = make_env(tmp_path)
    with init(storage=env.storage_url, registry=env.registry_url, trial_id=1) as ctx:
        with ctx.checkpoint.store_path({"steps_completed": 1}) as (path, uuid):
            Path(path, "w.bin").write_bytes(FILES["a.bin"])
    # the environment's verify key holds for `checkpoint download` too (it verified nothing)
    monkeypatch.setenv(signing.VERIFY_KEY_ENV, pub)
    refused = env.run("checkpoint", "download", uuid, "-o", str(tmp_path / "unsigned"))
    assert refused.exit_code == 5 and "not signed" in refused.output, refused.output
    assert not (tmp_path / "unsigned" / "w.bin").exists()
    monkeypatch.delenv(signing.VERIFY_KEY_ENV)
    refused = env.run("checkpoint", "verify", uuid, "--key", pub)
    assert refused.exit_code == 5 and "not signed" in refused.output, refused.output
    assert env.run("checkpoint", "verify", uuid).exit_code == 0  # no key: checksums only
    signed = env.run("checkpoint", "sign", uuid, "--key", key)
    assert signed.exit_code == 0, signed.output
    monkeypatch.setenv(signing.VERIFY_KEY_ENV, pub)
    ok = env.run("checkpoint", "verify", uuid, "--json")
    assert ok.exit_code == 0 and json.loads(ok.stdout)["signature"] == "verified", ok.output
    # a folder `ckptstore checkpoint download` wrote verifies with the model_signing command
    out = tmp_path / "dl"
    assert env.run("checkpoint", "download", uuid, "-o", str(out)).exit_code == 0
    command = Path(sys.executable).with_name("model_signing")
    proc = subprocess.run(
        [str(command), "verify", "key", str(out), "--signature", str(out / "model.sig")]
        + ["--public_key", pub],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and "Verification succeeded" in proc.stdout, proc.stderr
    stranger = env.run("checkpoint", "verify", uuid, "--key", other)
    assert stranger.exit_code == 5 and "SignatureError" in stranger.output
    again = env.run("checkpoint", "sign", uuid, "--key", key)
    assert again.exit_code != 0 and "already signed" in again.output
    missing = env.run("checkpoint", "sign", uuid, "--key", str(tmp_path / "nope.pem"))
    assert missing.exit_code == 2 and "nope.pem" in missing.output
    missing = env.run("checkpoint", "export", uuid, "--key", str(tmp_path / "nope.pem"))
    assert missing.exit_code == 2 and "nope.pem" in missing.output  # before any export runs


def test_the_ui_states_a_checkpoints_signature_from_its_manifest_and_model_sig(
    where, keys, monkeypatch
):
    """The checkpoint page's status: read from the manifest and model.sig only (a page view
    never downloads the checkpoint), checked against the UI's verify key when it has one."""
    from ckptstore.ui.signature import signature_status

    key, pub, other = keys
    signed, unsigned = commit(where, signing_key=key), commit(where)
    monkeypatch.delenv(signing.VERIFY_KEY_ENV, raising=False)
    with CheckpointContext(where.storage) as ctx:

        def state(uuid: str) -> str:
            manifest = Manifest.parse(ctx.storage.read_bytes(f"{uuid}/MANIFEST.json"), uuid)
            return signature_status(ctx.storage, uuid, manifest)["state"]

        assert state(unsigned) == "UNSIGNED"
        assert state(signed) == "SIGNED"  # nothing to check it against
        monkeypatch.setenv(signing.VERIFY_KEY_ENV, str(pub))
        assert (state(signed), state(unsigned)) == ("VERIFIED", "UNSIGNED")
        monkeypatch.setenv(signing.VERIFY_KEY_ENV, str(other))
        assert state(signed) == "INVALID"
        monkeypatch.setenv(signing.VERIFY_KEY_ENV, "/no/such/key.pem")
        assert state(signed) == "SIGNED"  # a missing key file is said, not a 500


# ---- attacks: nothing the key did not sign reaches a caller; nothing it signed is refused ----
def _writable(path: Path) -> None:
    for root, _dirs, files in os.walk(path):
        os.chmod(root, 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)


@pytest.mark.parametrize("extra", ["evil.py", "sub/evil.py"])
def test_in_place_file_added_next_to_signed(where, keys, extra):
    key, pub, _ = keys
    uuid = commit(where, signing_key=key)
    folder = Path(where.storage, uuid)
    _writable(folder)
    (folder / extra).write_bytes(b"import os\n")
    with CheckpointContext(where.storage, verify_key=pub) as reader:
        with pytest.raises(errors.SignatureError):
            with reader.restore_path(uuid) as path:
                print(sorted(os.listdir(path)))


def test_in_place_selection_is_copied_out_with_a_verify_key(where, keys):
    """In place, the caller would get the whole folder with its unselected files unchecked."""
    key, pub, _ = keys
    uuid = commit(where, signing_key=key)
    folder = Path(where.storage, uuid)
    _writable(folder)
    (folder / "b.bin").write_bytes(b"y" * 3000)
    with CheckpointContext(where.storage, verify_key=pub) as reader:
        with reader.restore_path(uuid, selector="a.bin") as path:
            assert (path / "a.bin").read_bytes() == FILES["a.bin"]
            assert not (path / "b.bin").exists()


def test_download_refused_leaves_no_altered_file(where, keys, tmp_path):
    key, pub, _ = keys
    uuid = commit(where, signing_key=key)
    local = Path(where.storage, uuid, "a.bin")
    os.chmod(local, 0o644)
    local.write_bytes(b"x" * 3000)
    with CheckpointContext(where.storage, verify_key=pub) as reader:
        forge(reader.storage, uuid, lambda f: f["a.bin"].update(crc32c=crc32c_bytes(b"x" * 3000)))
        with pytest.raises(errors.SignatureError):
            reader.download(uuid, tmp_path / "out")
    assert not (tmp_path / "out" / "a.bin").exists()


def test_huge_or_malformed_signature_is_a_typed_refusal(where, keys, tmp_path):
    """Read in bounded memory: a signature over the size limit is refused unread (a sparse
    file: no disk used), and bytes that are not a bundle are a SignatureError."""
    key, pub, _ = keys
    uuid = commit(where, signing_key=key)
    sig = Path(where.storage, uuid, signing.SIGNATURE_NAME)
    _writable(sig.parent)
    with open(sig, "r+b") as f:
        f.truncate(signing.MAX_SIGNATURE_BYTES + 1)
    with pytest.raises(errors.SignatureError, match="bytes, over the"):
        signing.verify_folder(sig.parent, pub)
    for data in (b"\x00\xff" * 1000, b"[" * 100000, b"{}", b'{"mediaType": 1}'):
        sig.write_bytes(data)
        with pytest.raises(errors.SignatureError, match="does not verify"):
            signing.verify_folder(sig.parent, pub)


@pytest.mark.parametrize("dedup", [False, True])
def test_empty_folder_entry_and_unicode_names_verify(where, keys, tmp_path, dedup):
    """A valid signature is not refused: non-ASCII and odd names, an empty folder (which a
    signature does not cover), in place and downloaded, whole and deduplicated."""
    key, pub, _ = keys
    files = {"é/ü.bin": b"1", "a b#?.bin": b"2", "NFD-e\u0301.bin": b"3"}
    folder = tmp_path / "model"
    (folder / "empty").mkdir(parents=True)
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    with CheckpointContext(where.storage, signing_key=key, dedup=dedup) as writer:
        uuid = writer.upload(folder)  # upload keeps empty folders (store_path drops them)
    with CheckpointContext(where.storage, verify_key=pub) as reader:
        reader.download(uuid, tmp_path / "u")
        assert (tmp_path / "u" / "empty").is_dir()
        with reader.restore_path(uuid) as path:
            assert (path / "é" / "ü.bin").read_bytes() == b"1"


def test_signed_paths_outside_the_folder_are_only_ever_missing(where, keys, tmp_path):
    """A signature (by the trusted key) naming ``../x`` or an absolute path: nothing is
    written or read there, and the checkpoint is refused (a signed file is missing)."""
    key, pub, _ = keys
    uuid = commit(where, signing_key=key)
    folder = Path(where.storage, uuid)
    _writable(folder)
    digests = signing.folder_digests(str(folder))
    digests.update({"../x": "00" * 32, str(tmp_path / "abs"): "11" * 32})
    signing.sign_digests(digests, key, str(folder / signing.SIGNATURE_NAME))
    data = (folder / signing.SIGNATURE_NAME).read_bytes()
    forge(
        CheckpointContext(where.storage).storage,
        uuid,
        lambda f: f[signing.SIGNATURE_NAME].update(size=len(data), crc32c=crc32c_bytes(data)),
    )
    with CheckpointContext(where.storage, verify_key=pub) as reader:
        with pytest.raises(errors.SignatureError, match=r"missing=\[.*\.\./x"):
            reader.download(uuid, tmp_path / "out" / "dl")
        reader.download(uuid, tmp_path / "part", selector="a.bin")  # a selection: fine
    assert not (tmp_path / "out" / "x").exists() and not (tmp_path / "abs").exists()


@pytest.mark.parametrize("kind", ["private", "rsa", "garbage"])
def test_wrong_kind_of_verify_key(where, keys, tmp_path, kind):
    key, pub, _ = keys
    uuid = commit(where, signing_key=key)
    if kind == "private":
        bad = key
    elif kind == "rsa":
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        k = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        bad = str(tmp_path / "rsa.pem")
        Path(bad).write_bytes(
            k.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
    else:
        bad = str(tmp_path / "g.pem")
        Path(bad).write_bytes(b"hello")
    with pytest.raises(errors.InvalidConfig, match="not an unencrypted EC public key"):
        CheckpointContext(where.storage, verify_key=bad)
    with CheckpointContext(where.storage, verify_key=pub) as reader:
        reader.download(uuid, tmp_path / "ok")  # the right key still verifies
