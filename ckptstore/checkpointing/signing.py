"""Checkpoint signatures in OpenSSF ``model-signing``'s format (key-based, offline).

A signed checkpoint holds ``model.sig`` next to its files: a Sigstore bundle (DSSE envelope,
in-toto statement) over the SHA-256 of every logical file — what a download materializes, so a
deduplicated checkpoint's signature covers its files, not its chunks. ckptstore's own
bookkeeping files (``metadata.json``, ``MANIFEST.json``) are outside the signature and named in
its ``ignore_paths``, so a downloaded folder verifies unmodified with
``model_signing verify key DIR --signature DIR/model.sig --public_key pub.pem``, and a folder
signed by ``model_signing sign key`` (with those paths ignored) verifies here.

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
from collections.abc import Mapping

from ckptstore import errors
from ckptstore.checkpointing import format as fmt

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

KeyPath = str | os.PathLike[str]


def load_model_signing():  # noqa: ANN202 - the optional package's modules
    try:
        from model_signing import hashing, signing
        from model_signing._signing import sign_ec_key, sign_sigstore_pb
    except ImportError as exc:
        raise errors.MissingDependency(
            f"Signing checkpoints needs OpenSSF model-signing: pip install 'ckptstore[signing]' "
            f"({exc}). Received: a signing or verify key."
        ) from exc
    return hashing, signing, sign_ec_key, sign_sigstore_pb


def _hashing_config(algorithm: str = HASH_ALGORITHM):  # noqa: ANN202 - hashing.Config
    hashing = load_model_signing()[0]
    return (
        hashing.Config()
        .use_file_serialization(hashing_algorithm=algorithm)
        .set_ignored_paths(paths=UNSIGNED_NAMES, ignore_git_paths=False)
    )


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
    return value


def sign_folder(folder: str | os.PathLike[str], private_key: KeyPath) -> str:
    """Sign the files of the local checkpoint folder ``folder`` with the EC private key in PEM
    file ``private_key``; writes and returns ``folder/model.sig``."""
    signing = load_model_signing()[1]
    folder = os.fspath(folder)
    out = os.path.join(folder, SIGNATURE_NAME)
    try:
        (
            signing.Config()
            .use_elliptic_key_signer(private_key=os.fspath(private_key))
            .set_hashing_config(_hashing_config())
            .sign(folder, out)
        )
    except (ValueError, TypeError) as exc:
        raise errors.InvalidConfig(
            f"Could not sign {folder} with {os.fspath(private_key)}: {exc}. Use an EC private "
            f"key (P-256/384/521) in PEM, unencrypted. Received: {os.fspath(private_key)!r}."
        ) from exc
    return out


def signed_digests(signature_path: str, public_key: KeyPath) -> tuple[str, Mapping[str, str]]:
    """The hash algorithm and ``{relative path: hex digest}`` a signature file vouches for,
    once its signature checks out against ``public_key``;
    :class:`~ckptstore.errors.SignatureError` if it does not."""
    _, _, sign_ec_key, sign_sigstore_pb = load_model_signing()
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
    return str(kind["hash_type"]), digests


def verify_folder(
    folder: str | os.PathLike[str], public_key: KeyPath, *, partial: bool = False
) -> None:
    """Check that ``folder`` holds exactly the files its ``model.sig`` vouches for, with their
    contents, signed by ``public_key``. ``partial``: a selection was downloaded, so signed
    files may be missing (each present one must still match). Raises
    :class:`~ckptstore.errors.SignatureError`, naming what differs."""
    folder = os.fspath(folder)
    sig = os.path.join(folder, SIGNATURE_NAME)
    if not os.path.isfile(sig):
        raise errors.SignatureError(
            f"Checkpoint {folder} is not signed (no {SIGNATURE_NAME}) and a verify key is "
            f"configured ({VERIFY_KEY_ENV} or verify_key=): refused. Sign it with `ckptstore "
            f"checkpoint sign UUID --key KEY.pem` if you trust it. Received: {folder!r}."
        )
    algorithm, expected = signed_digests(sig, public_key)
    actual = {
        str(r.identifier): r.digest.digest_hex
        for r in _hashing_config(algorithm).hash(folder).resource_descriptors()
    }
    extra = sorted(set(actual) - set(expected))
    missing = [] if partial else sorted(set(expected) - set(actual))
    changed = sorted(k for k in set(actual) & set(expected) if actual[k] != expected[k])
    if extra or missing or changed:
        raise errors.SignatureError(
            f"Checkpoint {folder} does not match its signature: it was altered after signing. "
            "Do not load it; restore it from a trusted copy. Received: "
            f"changed={changed[:5]}, unsigned={extra[:5]}, missing={missing[:5]}."
        )


__all__ = [
    "HASH_ALGORITHM",
    "SIGNATURE_NAME",
    "SIGNING_KEY_ENV",
    "UNSIGNED_NAMES",
    "VERIFY_KEY_ENV",
    "key_from",
    "load_model_signing",
    "sign_folder",
    "signed_digests",
    "verify_folder",
]
