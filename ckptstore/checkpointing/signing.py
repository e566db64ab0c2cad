"""Checkpoint signatures in OpenSSF ``model-signing``'s format (key-based, offline).

A signed checkpoint holds ``model.sig`` next to its files: a Sigstore bundle (DSSE envelope,
in-toto statement) over the SHA-256 of every logical file — what a download materializes, so a
deduplicated checkpoint's signature covers its files, not its chunks. ckptstore's own
bookkeeping files (``metadata.json``, ``MANIFEST.json``) are outside the signature and named in
its ``ignore_paths``, so a downloaded folder verifies unmodified with
``model_signing verify key DIR --signature DIR/model.sig --public_key pub.pem``, and a folder
signed by ``model_signing sign key`` (with those paths ignored) verifies here.

Signing and verifying cost no read of their own: the SHA-256 of every file comes from the
read that computes (commit) or checks (download, restore, cache) its crc32c
(:func:`~ckptstore.checkpointing.checksums.file_sums`); :func:`sign_digests` builds
``model_signing``'s manifest from those digests and signs it with its EC signer, and
:class:`Expected` checks a signature's envelope, then compares the digests. A folder no such
read went over is hashed by :func:`folder_digests` (``sign_folder``, ``verify_folder``).

Keys are EC private/public keys in PEM files (P-256, P-384 or P-521, what ``model-signing``
takes): ``core.init(signing_key=...)``, ``ckptstore checkpoint sign --key``, or the environment
(:data:`SIGNING_KEY_ENV`, :data:`VERIFY_KEY_ENV`). With a verify key configured, downloads and
restores refuse an unsigned or altered checkpoint (:class:`~ckptstore.errors.SignatureError`)
before anything reads the files.

Example::

    from ckptstore.checkpointing import signing

    signing.sign_folder("ckpt/", "signing-key.pem")
    signing.verify_folder("ckpt/", "signing-pub.pem")
"""

from __future__ import annotations

import os
import pathlib
import uuid as _uuid
from collections.abc import Callable, Iterable, Mapping

from ckptstore import errors
from ckptstore.checkpointing import format as fmt
from ckptstore.checkpointing.checksums import file_sums

#: The signature file inside a checkpoint (``model_signing``'s default name).
SIGNATURE_NAME = "model.sig"
#: A PEM file with the EC private key that signs every checkpoint at commit.
SIGNING_KEY_ENV = "CKPTSTORE_SIGNING_KEY"
#: A PEM file with the trusted EC public key: downloads and restores verify against it.
VERIFY_KEY_ENV = "CKPTSTORE_VERIFY_KEY"
#: Files outside the signature: itself and ckptstore's bookkeeping (rewritten by amend/registry).
UNSIGNED_NAMES = (SIGNATURE_NAME, fmt.METADATA_NAME, fmt.MANIFEST_NAME, fmt.PENDING_MARKER_NAME)

#: The file digest ckptstore signs with: SHA-256, the one the ``model_signing verify`` command
#: recomputes (BLAKE3 would hash a 400 MB model in less than half the time here, but that
#: command cannot verify it). Signatures with BLAKE2/BLAKE3 (model_signing's API) verify here too.
HASH_ALGORITHM = "sha256"

#: The largest ``model.sig`` read (it is parsed in memory): twice the largest manifest, as a
#: signature spells each file's path and digest in base64'd JSON, about twice a manifest entry.
MAX_SIGNATURE_BYTES = 2 * fmt.MAX_MANIFEST_BYTES

KeyPath = str | os.PathLike[str]


def load_model_signing():  # noqa: ANN202 - the optional package's modules
    try:
        from model_signing import hashing, manifest
        from model_signing._hashing import hashing as digests
        from model_signing._signing import sign_ec_key, sign_sigstore_pb, signing
    except ImportError as exc:
        raise errors.MissingDependency(
            f"Signing checkpoints needs OpenSSF model-signing: pip install 'ckptstore[signing]' "
            f"({exc}). Received: a signing or verify key."
        ) from exc
    return hashing, manifest, digests, signing, sign_ec_key, sign_sigstore_pb


def key_from(explicit: KeyPath | None, env_name: str) -> str | None:
    """The key file to use: ``explicit``, else the environment variable ``env_name``, else None.
    A named file that does not exist is an error, never a silent "unsigned"."""
    value = os.fspath(explicit) if explicit is not None else os.environ.get(env_name) or None
    if value is not None and not os.path.isfile(value):
        where = "the argument" if explicit is not None else env_name
        raise errors.InvalidConfig(
            f"The key file named by {where} does not exist; pass the path of a PEM file "
            f"(an EC key, e.g. `openssl ecparam -name prime256v1 -genkey`). Received: {value!r}."
        )
    if value is not None:
        _check_key(value, public=env_name == VERIFY_KEY_ENV)
    return value


def _check_key(path: str, *, public: bool) -> None:
    """Refuse a key ``model_signing`` cannot use here, before any checkpoint is judged by it:
    otherwise every signed checkpoint would be refused as "altered" (a private key, an RSA
    key or a damaged file given as the verify key)."""
    load_model_signing()  # a missing [signing] extra is said first (it brings cryptography)
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    want = "EC public key (`openssl ec -in KEY.pem -pubout`)" if public else "EC private key"
    try:
        with open(path, "rb") as f:
            data = f.read(1 << 20)  # a PEM key is a few hundred bytes
        key = (
            serialization.load_pem_public_key(data)
            if public
            else serialization.load_pem_private_key(data, None)
        )
    except (ValueError, TypeError, OSError) as exc:
        key, reason = None, f"{type(exc).__name__}: {exc}"
    else:
        reason = f"{type(key).__name__} {getattr(getattr(key, 'curve', None), 'name', '')}"
    curve = getattr(key, "curve", None)
    if not isinstance(key, ec.EllipticCurvePublicKey | ec.EllipticCurvePrivateKey) or (
        curve is None or curve.name not in ("secp256r1", "secp384r1", "secp521r1")
    ):
        raise errors.InvalidConfig(
            f"The {'verify' if public else 'signing'} key {path} is not an unencrypted "
            f"{want} in PEM, P-256/384/521 ({reason}). Pass that file instead. "
            f"Received: {path!r}."
        )


def signed_names(files: Iterable[str]) -> list[str]:
    """The relative paths a signature covers among a checkpoint's ``files``: every file
    (``model_signing`` hashes files only, so empty-folder entries ``"x/"`` are not), less
    :data:`UNSIGNED_NAMES` at the top."""
    return [rel for rel in files if not rel.endswith("/") and rel not in UNSIGNED_NAMES]


def sign_digests(
    digests: Mapping[str, str], private_key: KeyPath, out: str, *, name: str = "model"
) -> str:
    """Sign ``{relative path: SHA-256 hex}`` (the checkpoint's logical files, hashed by the
    read that already checksummed them) with the EC private key in PEM file ``private_key``;
    writes ``model_signing``'s signature file at ``out`` and returns it.

    The statement is the one ``model_signing sign key`` writes over the same folder with
    :data:`UNSIGNED_NAMES` ignored (resources = relative paths with their SHA-256,
    serialization ``files``/``sha256``, those ``ignore_paths``); ``name`` is its subject, the
    checkpoint's UUID: readers refuse the signature under any other UUID."""
    _, manifest, digest_mod, signing, sign_ec_key, _ = load_model_signing()
    items = [
        manifest.FileManifestItem(
            path=pathlib.PurePosixPath(rel),
            digest=digest_mod.Digest(HASH_ALGORITHM, bytes.fromhex(sha)),
        )
        for rel, sha in digests.items()
    ]
    serialization = manifest._FileSerialization(
        HASH_ALGORITHM, allow_symlinks=False, ignore_paths=UNSIGNED_NAMES
    )
    try:
        signer = sign_ec_key.Signer(pathlib.Path(os.fspath(private_key)))
        payload = signing.Payload(manifest.Manifest(name, items, serialization))
        signer.sign(payload).write(pathlib.Path(out))
    except (ValueError, TypeError) as exc:
        raise errors.InvalidConfig(
            f"Could not sign with {os.fspath(private_key)}: {exc}. Use an EC private key "
            f"(P-256/384/521) in PEM, unencrypted. Received: {os.fspath(private_key)!r}."
        ) from exc
    return out


def public_key_file(private_key: KeyPath, folder: str) -> str:
    """Write the public half of the EC private key in PEM file ``private_key`` into
    ``folder``; returns its path (a signer checks what it signs again against its own key)."""
    from cryptography.hazmat.primitives import serialization

    with open(private_key, "rb") as f:
        key = serialization.load_pem_private_key(f.read(), None)
    out = os.path.join(folder, "signing-pub.pem")
    with open(out, "wb") as f:
        f.write(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
    return out


def folder_digests(folder: str) -> dict[str, str]:
    """``{relative path: SHA-256}`` of the files a signature of local ``folder`` covers, one
    read each (for folders no checksumming read went over: ``checkpoint sign`` of a copy,
    ``verify=False`` restores)."""
    files = fmt.local_files(folder, skip_reserved=False)
    return {
        rel: str(file_sums(files[rel], crc32c=False, sha256=True)[1]) for rel in signed_names(files)
    }


def unlisted_digests(folder: str, listed: Iterable[str]) -> dict[str, str]:
    """``{relative path: SHA-256}`` of the files under local ``folder`` that ``listed`` (a
    manifest's paths) does not name, and ``"symlink"`` for every link: a checkpoint verified in
    place hands its caller the whole folder, so a file added next to the signed ones must be
    seen (the manifest is not signed), and ``model_signing`` signs no links. One read of an
    added file only; a checkpoint as committed has none."""
    known = set(listed)
    found: dict[str, str] = {}
    for root, dirs, files in os.walk(folder):
        prefix = os.path.relpath(root, folder).replace(os.sep, "/") + "/"
        prefix = "" if prefix == "./" else prefix
        for name in dirs + files:
            path = os.path.join(root, name)
            if os.path.islink(path):
                found[prefix + name] = "symlink"
            elif name in files and prefix + name not in known:
                found[prefix + name] = str(file_sums(path, crc32c=False, sha256=True)[1])
    return found


def sign_folder(folder: str | os.PathLike[str], private_key: KeyPath) -> str:
    """Sign the files of the local checkpoint folder ``folder`` with the EC private key in PEM
    file ``private_key``; writes and returns ``folder/model.sig``."""
    folder = os.fspath(folder)
    out = os.path.join(folder, SIGNATURE_NAME)
    name = os.path.basename(os.path.abspath(folder))
    return sign_digests(folder_digests(folder), private_key, out, name=name)


def signed_digests(signature_path: str, public_key: KeyPath) -> tuple[str, Mapping[str, str]]:
    """The hash algorithm and ``{relative path: hex digest}`` a signature file vouches for,
    once its signature checks out against ``public_key``;
    :class:`~ckptstore.errors.SignatureError` if it does not."""
    return _checked_statement(signature_path, public_key)[:2]


def _checked_statement(
    signature_path: str, public_key: KeyPath
) -> tuple[str, Mapping[str, str], str]:
    """(hash algorithm, digests, subject name) of a signature that checks out."""
    *_, sign_ec_key, sign_sigstore_pb = load_model_signing()
    size = os.path.getsize(signature_path)
    if size > MAX_SIGNATURE_BYTES:
        raise errors.SignatureError(
            f"The signature {signature_path} has {size} bytes, over the {MAX_SIGNATURE_BYTES} "
            "a checkpoint's signature can need: not read. Do not load the checkpoint. "
            f"Received: {signature_path!r}."
        )
    try:
        signature = sign_sigstore_pb.Signature.read(pathlib.Path(signature_path))
        manifest = sign_ec_key.Verifier(pathlib.Path(os.fspath(public_key))).verify(signature)
    except Exception as exc:  # noqa: BLE001 - any failure to check it is a refusal
        raise errors.SignatureError(
            f"The signature {signature_path} does not verify with the trusted key "
            f"{os.fspath(public_key)} ({type(exc).__name__}: {exc}); the checkpoint was not "
            "signed by that key or was altered. Do not load it. Received: "
            f"{signature_path!r}."
        ) from exc
    kind = manifest.serialization_type
    if kind.get("method") != "files" or kind.get("hash_type") not in ("sha256", "blake2", "blake3"):
        raise errors.SignatureError(
            f"The signature {signature_path} hashes the model as {kind}; ckptstore verifies "
            "whole-file digests (model_signing's default): sign again without shards. "
            f"Received: {signature_path!r}."
        )
    digests = {str(r.identifier): r.digest.digest_hex for r in manifest.resource_descriptors()}
    return str(kind["hash_type"]), digests, str(manifest.model_name)


def _is_uuid(name: str) -> bool:
    try:
        return str(_uuid.UUID(name)) == name.lower()
    except ValueError:
        return False


def verify_key(explicit: KeyPath | None = None) -> str | None:
    """The trusted public key every reader checks signatures with: ``explicit``, else
    :data:`VERIFY_KEY_ENV`, else None (the one place that lookup is written)."""
    return key_from(explicit, VERIFY_KEY_ENV)


def unsigned_error(where: str) -> errors.SignatureError:
    """The refusal of a checkpoint without :data:`SIGNATURE_NAME` where a verify key is set."""
    return errors.SignatureError(
        f"Checkpoint {where} is not signed (no {SIGNATURE_NAME}) and a verify key is "
        f"configured ({VERIFY_KEY_ENV} or verify_key=): refused. Sign it with `ckptstore "
        f"checkpoint sign UUID --key KEY.pem` if you trust it. Received: {where!r}."
    )


def envelope(
    where: str,
    signed: bool,
    signature: str | Callable[[], str],
    public_key: KeyPath,
    *,
    subject: str | None = None,
) -> Expected:
    """The signature policy every reader follows once a verify key is set (without one,
    nothing is checked: :func:`verify_key` is None), written once: a checkpoint without
    :data:`SIGNATURE_NAME` (``signed`` False) is refused (:func:`unsigned_error`, naming
    ``where``); its envelope must be signed by ``public_key`` for checkpoint ``subject``
    (:meth:`Expected.read`); the caller then compares the files it reads with the returned
    :class:`Expected`. ``signature``: the signature's local path, or what fetches it there
    (called only when the checkpoint is signed, so an unsigned one costs no download)."""
    if not signed:
        raise unsigned_error(where)
    path = signature() if callable(signature) else signature
    return Expected.read(path, public_key, subject=subject)


class Expected:
    """What a checked signature vouches for: its hash algorithm and ``{path: digest}``.

    Example::

        expected = Expected.read("ckpt/model.sig", "signing-pub.pem")  # the envelope first
        expected.compare("ckpt", {"model.keras": sha256_hex})           # then the files
    """

    def __init__(self, algorithm: str, digests: Mapping[str, str]) -> None:
        self.algorithm = algorithm
        self.digests = dict(digests)

    @classmethod
    def read(
        cls, signature_path: str, public_key: KeyPath, *, subject: str | None = None
    ) -> Expected:
        """The checked envelope; with ``subject`` (the UUID of the checkpoint being read) its
        statement must name that checkpoint, so a signed checkpoint copied under another
        UUID (a replay, to pass an old model off as the newest) is refused. A statement whose
        subject is not a UUID (``model_signing sign`` over a folder names it by the folder)
        binds no checkpoint; ``ckptstore checkpoint sign UUID`` binds one."""
        algorithm, digests, name = _checked_statement(signature_path, public_key)
        if subject is not None and name != subject and _is_uuid(name):
            raise errors.SignatureError(
                f"The signature {signature_path} was made for checkpoint {name!r}, not for "
                f"{subject!r}, the checkpoint being read: a signed checkpoint was copied "
                "under another UUID. Do not load it. Received: "
                f"{signature_path!r}."
            )
        return cls(algorithm, digests)

    def compare(
        self, folder: str, actual: Mapping[str, str] | None, *, partial: bool = False
    ) -> None:
        """Check ``actual`` (``{path: SHA-256}`` of the files of ``folder``, from the read that
        checksummed them; None: hash the folder here) against the signature.
        ``partial``: a selection was downloaded, so signed files may be missing (each present
        one must still match). Raises :class:`~ckptstore.errors.SignatureError` naming what
        differs."""
        if self.algorithm != HASH_ALGORITHM:
            actual = _model_signing_digests(folder, self.algorithm)  # signed elsewhere
        elif actual is None:
            actual = folder_digests(folder)
        else:
            actual = {rel: actual[rel] for rel in signed_names(actual)}
        expected = self.digests
        extra = sorted(set(actual) - set(expected))
        missing = [] if partial else sorted(set(expected) - set(actual))
        changed = sorted(k for k in set(actual) & set(expected) if actual[k] != expected[k])
        if extra or missing or changed:
            raise errors.SignatureError(
                f"Checkpoint {folder} does not match its signature: it was altered after "
                "signing. Do not load it; restore it from a trusted copy. Received: "
                f"changed={changed[:5]}, unsigned={extra[:5]}, missing={missing[:5]}."
            )


def _model_signing_digests(folder: str, algorithm: str) -> dict[str, str]:
    """Digests of ``folder`` by ``model_signing``'s own hashing (a folder it signed with
    BLAKE2/BLAKE3, which ckptstore's reads do not compute)."""
    hashing = load_model_signing()[0]
    config = (
        hashing.Config()
        .use_file_serialization(hashing_algorithm=algorithm)
        .set_ignored_paths(paths=UNSIGNED_NAMES, ignore_git_paths=False)
    )
    return {
        str(r.identifier): r.digest.digest_hex for r in config.hash(folder).resource_descriptors()
    }


def verify_folder(
    folder: str | os.PathLike[str],
    public_key: KeyPath,
    *,
    partial: bool = False,
    digests: Mapping[str, str] | None = None,
    subject: str | None = None,
) -> None:
    """Check that ``folder`` holds exactly the files its ``model.sig`` vouches for, with their
    contents, signed by ``public_key``. ``partial``: a selection was downloaded, so signed
    files may be missing (each present one must still match). ``digests``: ``{path:
    SHA-256}`` of the folder's files from the read that checksummed them (else they are
    hashed here). Raises :class:`~ckptstore.errors.SignatureError`, naming what differs."""
    folder = os.fspath(folder)
    sig = os.path.join(folder, SIGNATURE_NAME)
    expected = envelope(folder, os.path.isfile(sig), sig, public_key, subject=subject)
    expected.compare(folder, digests, partial=partial)


def verify(
    folder: str | os.PathLike[str],
    public_key: KeyPath | None = None,
    *,
    subject: str | None = None,
    partial: bool = False,
) -> str | None:
    """The check every reader of a local checkpoint folder runs before anything opens a file
    in it: with a verify key (``public_key``, else :data:`VERIFY_KEY_ENV`) the folder must
    hold exactly the files its signature vouches for, signed for checkpoint ``subject``
    (when known); without one, nothing is checked. Returns the key used (None: none set)."""
    key = verify_key(public_key)
    if key is not None:
        verify_folder(folder, key, partial=partial, subject=subject)
    return key


__all__ = [
    "HASH_ALGORITHM",
    "MAX_SIGNATURE_BYTES",
    "Expected",
    "SIGNATURE_NAME",
    "SIGNING_KEY_ENV",
    "UNSIGNED_NAMES",
    "VERIFY_KEY_ENV",
    "envelope",
    "key_from",
    "load_model_signing",
    "public_key_file",
    "folder_digests",
    "sign_digests",
    "sign_folder",
    "signed_digests",
    "signed_names",
    "unlisted_digests",
    "unsigned_error",
    "verify",
    "verify_folder",
    "verify_key",
]
