"""Tensor cuts for TensorFlow's checkpoint files (SavedModel ``variables/``, ``tf.train.Checkpoint``):
the index reader finds every tensor's bytes in real TensorFlow output, a damaged index costs only
the optimisation (no cuts, never an error), and in a deduplicated checkpoint a changed tensor of a
SavedModel costs its own bytes, not a 4 MiB chunk.

Keras 2 checkpoints (``model_checkpoint.*`` written by the Keras 2 ``DeterminedCallback``) are
covered by ``test_tf_bundle_keras2.py`` in the Keras 2 child run."""

from __future__ import annotations

import logging
import os
import struct
from uuid import uuid4

import google_crc32c
import keras
import numpy as np
import pytest
import tensorflow as tf

import ckptstore as det
from ckptstore.checkpointing import CheckpointContext, blobs, scan
from ckptstore.checkpointing import format as fmt
from ckptstore.keras_io.saving import _tf_bundle as tf_bundle
from ckptstore.keras_io.saving._writer import CheckpointWriter, SaveJob

pytestmark = pytest.mark.e2e  # trains Keras models end to end

HEAD_SHAPE = (32, 256)  # 32 KiB of float32: changes between the two checkpoints
FROZEN_SHAPE = (1024, 1025)  # ~4 MiB of float32: the same in both
#: What a second deduplicated checkpoint may store beyond 1.1 x its changed tensors: 64 KiB for
#: the small files TensorFlow rewrites whole on every save, which have no tensors to cut at —
#: ``saved_model.pb`` (14 KiB here; its traced functions' names carry a per-process counter),
#: ``variables.index`` (it records every tensor's crc32c; 275 bytes), ``fingerprint.pb`` (a hash
#: of the variables; 97 bytes) — and, in a data shard, the one chunk into which tensors under
#: 4 KiB (a bias, the object-graph tensor) are merged, at most ``blobs.MERGE_BYTES`` (1 KiB
#: here). The data shards themselves measure exactly the changed tensors' bytes.
ALLOWANCE = 64 * 1024
X = np.random.RandomState(0).rand(3, FROZEN_SHAPE[0]).astype("float32")


def mask(crc: int) -> int:
    """TensorFlow's crc32c mask, written here independently of the module under test."""
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) % 2**32


def entry_crc(piece: bytes, entry) -> int:
    """The masked crc32c ``tensor_bundle.cc`` records for a tensor stored as ``piece``. String
    tensors are stored as varint64 lengths, their masked crc (4 bytes), then the bytes; their crc
    runs over the lengths as little-endian uint32s (uint64 above 4 GiB), that checksum, then the
    bytes (``WriteStringTensor``)."""
    if entry.dtype != tf.string.as_datatype_enum:
        return mask(google_crc32c.value(piece))
    count = int(np.prod([d.size for d in entry.shape.dim])) if entry.shape.dim else 1
    crc, pos = 0, 0
    for _ in range(count):
        length = shift = 0
        while True:
            byte = piece[pos]
            pos += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        crc = google_crc32c.extend(crc, struct.pack("<I" if length < 2**32 else "<Q", length))
    (lengths_crc,) = struct.unpack_from("<I", piece, pos)
    assert lengths_crc == mask(crc)
    crc = google_crc32c.extend(crc, piece[pos : pos + 4])
    return mask(google_crc32c.extend(crc, piece[pos + 4 :]))


class Model(tf.Module):
    """A frozen ~4 MiB matrix and a small head; the head's key sorts first, so its bytes come
    first in the data shard and a fixed 4 MiB chunk would hold it and most of the frozen one."""

    def __init__(self) -> None:
        super().__init__()
        rng = np.random.RandomState(1)
        self.a_head = tf.Variable(rng.rand(*HEAD_SHAPE).astype("float32"))
        self.z_frozen = tf.Variable(rng.rand(*FROZEN_SHAPE).astype("float32"), trainable=False)

    @tf.function(input_signature=[tf.TensorSpec([None, FROZEN_SHAPE[0]], tf.float32)])
    def serve(self, x):
        return tf.matmul(x, self.z_frozen)[:, : HEAD_SHAPE[1]] + tf.reduce_sum(self.a_head, 0)


def write_saved_model(model: Model, out: str) -> str:
    tf.saved_model.save(model, out)
    return os.path.join(out, "variables", "variables.index")


def write_checkpoint(model: Model, out: str) -> str:
    tf.train.Checkpoint(a_head=model.a_head, z_frozen=model.z_frozen).write(
        os.path.join(out, "ckpt")
    )
    return os.path.join(out, "ckpt.index")


def write_partitioned(_model: Model, out: str) -> str:
    """A TF1 partitioned variable: its full-tensor entry has slices and no bytes of its own."""
    with tf.Graph().as_default():
        tf.compat.v1.get_variable(
            "part", shape=[64, 4], partitioner=tf.compat.v1.fixed_size_partitioner(3)
        )
        tf.compat.v1.get_variable("whole", shape=[5])
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            saver.save(session, os.path.join(out, "m"))
    return os.path.join(out, "m.index")


WRITERS = {
    "saved_model": write_saved_model,
    "checkpoint": write_checkpoint,
    "partitioned": write_partitioned,
}


@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_every_entry_is_found_at_its_offset_and_cuts_cover_the_shard(tmp_path, kind):
    index = WRITERS[kind](Model(), str(tmp_path / kind))
    header, entries = tf_bundle.read_index(index)
    assert header.num_shards == 1
    cuts = tf_bundle.shard_cuts(index)
    assert cuts is not None and len(cuts) == 1
    ((shard, offsets),) = cuts.items()
    assert shard.endswith(".data-00000-of-00001")
    data = tmp_path / kind / os.path.dirname(os.path.relpath(index, tmp_path / kind)) / shard
    content = data.read_bytes()
    tensors = {k: e for k, e in entries.items() if e.size}
    assert len(tensors) >= 2 + (kind == "partitioned")
    for key, entry in tensors.items():
        assert entry.shard_id == 0
        piece = content[entry.offset : entry.offset + entry.size]
        assert len(piece) == entry.size and entry_crc(piece, entry) == entry.crc32c, key
        assert entry.offset in offsets and entry.offset + entry.size in offsets
    if kind == "partitioned":
        sliced = [e for e in entries.values() if e.slices]
        assert len(sliced) == 1 and len(sliced[0].slices) == 3 and not sliced[0].size
    # The tensors tile the shard: every byte of it is in exactly one of them.
    spans = sorted((e.offset, e.offset + e.size) for e in tensors.values())
    assert spans[0][0] == 0 and spans[-1][1] == len(content)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert offsets == sorted({x for span in spans for x in span})
    # folder_cuts: the same, keyed by path relative to the folder
    rel = os.path.relpath(data, tmp_path).replace(os.sep, "/")
    assert tf_bundle.folder_cuts(str(tmp_path)) == {rel: offsets}


def _damage(index: str, how: str) -> None:
    data = bytearray(open(index, "rb").read())
    if how == "truncated":
        data = data[: len(data) // 2]
    elif how == "empty":
        data = bytearray()
    elif how == "flipped":
        data[len(data) // 3] ^= 0x40
    elif how == "magic":
        data[-1] ^= 0xFF
    elif how == "compressed":  # a block marked snappy, its crc fixed so only the type is wrong
        footer = data[-tf_bundle.FOOTER_BYTES :]
        pos = 0
        for _ in range(2):  # skip the metaindex handle
            while footer[pos] & 0x80:
                pos += 1
            pos += 1
        offset, pos = tf_bundle._varint(bytes(footer), pos, 40, 64)
        size, _ = tf_bundle._varint(bytes(footer), pos, 40, 64)
        data[offset + size] = 1
        crc = tf_bundle.masked_crc32c(bytes(data[offset : offset + size + 1]))
        struct.pack_into("<I", data, offset + size + 1, crc)
    elif how == "text":
        data = bytearray(b"not a table, just a file named .index\n" * 3)
    with open(index, "wb") as f:
        f.write(data)


@pytest.mark.parametrize(
    "how", ["truncated", "empty", "flipped", "magic", "compressed", "text", "no_shard"]
)
def test_a_damaged_index_or_missing_shard_gives_no_cuts_and_no_error(tmp_path, caplog, how):
    index = write_checkpoint(Model(), str(tmp_path))
    if how == "no_shard":
        os.remove(str(tmp_path / "ckpt.data-00000-of-00001"))
        os.rename(index, str(tmp_path / "x.index"))  # beside an unrelated shard
        open(str(tmp_path / "x.data-00000-of-00002"), "wb").close()
        index = str(tmp_path / "x.index")
    else:
        _damage(index, how)
    with caplog.at_level(logging.DEBUG, logger=tf_bundle.__name__):
        assert tf_bundle.shard_cuts(index) is None
        assert tf_bundle.folder_cuts(str(tmp_path)) == {}
    assert "No tensor cuts" in caplog.text
    if how == "compressed":
        assert "compressed" in caplog.text
    if how != "no_shard":  # read_index itself raises, typed
        with pytest.raises(tf_bundle.BundleFormatError):
            tf_bundle.read_index(index)


# ---- end to end: deduplicated checkpoints -------------------------------------------------------
def object_store_url(tmp_path) -> str:
    """A fresh in-process store without a local path (chunks everything, as S3 does)."""
    return f"memory://tf-bundle-{uuid4().hex[:12]}/{tmp_path.name}"


def blob_sizes(ctx: CheckpointContext) -> dict[str, int]:
    names = {k.rsplit("/", 1)[-1] for k in ctx.storage.list(blobs.BLOBS_DIR)}
    return {
        n: len(ctx.storage.read_bytes(blobs.blob_key(n))) for n in names if blobs.SHA_RE.match(n)
    }


def changed_bytes(first: str, second: str) -> int:
    """Bytes of the tensors of the second bundle whose content (crc32c and size, as the indexes
    record them) is in no tensor of the first; a content stored twice counts once. By content,
    not key: a tensor that only moved (Keras's ``_all_variables`` order differs between two
    exports) is not a change, and its bytes, cut at its own start, are shared."""
    before = {(e.crc32c, e.size) for e in tf_bundle.read_index(first)[1].values()}
    after = {(e.crc32c, e.size) for e in tf_bundle.read_index(second)[1].values() if e.size}
    return sum(size for _crc, size in after - before)


def two_checkpoints(tmp_path, kind: str) -> tuple[CheckpointContext, list[str], Model, int]:
    """Two deduplicated checkpoints of ``Model`` through the Keras writer (the head changes in
    between): a SavedModel written by ``before_commit`` (as the export), or a
    ``tf.train.Checkpoint`` moved in from ``extra_dir`` (as files of ``on_checkpoint_end``).
    Returns the context, the UUIDs, the model and the bytes of new blobs of the second."""
    # A SavedModel is chunked where nothing reads it in place (object stores; here the memory
    # store): a local store keeps saved_model/ whole (format.kept_whole_in_place).
    root = object_store_url(tmp_path) if kind == "saved_model" else str(tmp_path / "ckpts")
    ctx = CheckpointContext(root, dedup=True)
    writer = CheckpointWriter(ctx)
    model = Model()
    uuids, sizes = [], []
    for step in range(2):
        if step:
            model.a_head.assign_add(tf.ones(HEAD_SHAPE))
        job = SaveJob(snapshot=None, metadata={"steps_completed": step})
        if kind == "saved_model":
            job.before_commit = lambda path: write_saved_model(
                model, os.path.join(path, "saved_model")
            )
        else:
            job.extra_dir = str(tmp_path / f"extra{step}")
            write_checkpoint(model, os.path.join(job.extra_dir, "tf_ckpt"))
        writer.submit(job)
        writer.wait()
        uuids.append(writer.saved[-1])
        sizes.append(blob_sizes(ctx))
    writer.close()
    new = sum(size for sha, size in sizes[1].items() if sha not in sizes[0])
    return ctx, uuids, model, new


def index_of(kind: str) -> str:
    return (
        "saved_model/variables/variables.index" if kind == "saved_model" else "tf_ckpt/ckpt.index"
    )


@pytest.mark.parametrize("kind", ["saved_model", "checkpoint"])
def test_a_changed_tensor_costs_its_own_bytes_in_a_deduplicated_checkpoint(
    tmp_path, monkeypatch, kind
):
    ctx, uuids, model, new = two_checkpoints(tmp_path / "cut", kind)
    with ctx:
        paths = [str(tmp_path / f"dl{i}") for i in range(2)]
        for uuid, path in zip(uuids, paths, strict=True):
            ctx.download(uuid, path)  # reassembles the files, checking every chunk
        manifest = fmt.read_manifest(ctx.storage, uuids[1])
    assert manifest["format_version"] == fmt.BLOBS_FORMAT_VERSION
    changed = changed_bytes(*(os.path.join(p, index_of(kind)) for p in paths))
    assert changed == HEAD_SHAPE[0] * HEAD_SHAPE[1] * 4  # only the head
    assert new <= 1.1 * changed + ALLOWANCE, (new, changed)
    if kind == "saved_model":
        # The restored SavedModel loads and serves what the model does.
        served = tf.saved_model.load(os.path.join(paths[1], "saved_model"))
        np.testing.assert_array_equal(served.serve(X).numpy(), model.serve(X).numpy())
    else:
        restored = Model()
        restored.a_head.assign(tf.zeros(HEAD_SHAPE))
        tf.train.Checkpoint(a_head=restored.a_head, z_frozen=restored.z_frozen).read(
            os.path.join(paths[1], "tf_ckpt", "ckpt")
        ).assert_consumed()
        np.testing.assert_array_equal(restored.a_head.numpy(), model.a_head.numpy())

    # Without cuts (fixed offsets) the same change costs the whole first 4 MiB chunk.
    monkeypatch.setattr(tf_bundle, "folder_cuts", lambda folder: {})
    _ctx, _uuids, _model, fixed = two_checkpoints(tmp_path / "fixed", kind)
    assert fixed >= blobs.DEFAULT_CHUNK_BYTES > 20 * new, (fixed, new)


def test_determined_callback_export_cuts_the_saved_model_variables(tmp_path):
    """Keras 3 ``DeterminedCallback(export_saved_model="every")``: the export worker writes
    ``saved_model/`` before the commit; a frozen 4 MiB kernel is not stored again."""
    keras.utils.set_random_seed(3)
    inputs = keras.Input((64,))
    head = keras.layers.Dense(16, name="head")
    backbone = keras.layers.Dense(65536, name="backbone")  # 4 MiB kernel, 256 KiB bias
    backbone.trainable = False
    model = keras.Model(inputs, backbone(head(inputs)))
    model.compile(keras.optimizers.SGD(0.01), "mse")
    x = np.random.RandomState(4).rand(8, 64).astype("float32")
    y = np.zeros((8, 65536), "float32")
    url = object_store_url(tmp_path)  # a local store would keep saved_model/ whole
    with det.core.init(storage=url, trial_id=1, preempt_signals=False) as ctx:
        ctx.checkpoint.dedup = True
        cb = det.keras.DeterminedCallback(ctx, None, 1, export_saved_model="every")
        model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[cb])
        cb.wait()
        storage = ctx.checkpoint.storage
        uuids = [r.uuid for r in scan.sort_records(scan.scan_checkpoints(storage))]
    assert len(uuids) == 2
    with CheckpointContext(url) as reader:
        for i, u in enumerate(uuids):
            reader.download(u, str(tmp_path / f"dl{i}"))
        manifests = [fmt.read_manifest(reader.storage, u) for u in uuids]
    rel = "saved_model/variables/variables.data-00000-of-00001"
    before = {c["sha256"] for c in manifests[0]["files"][rel]["blobs"]}
    chunks = {c["sha256"]: c["size"] for c in manifests[1]["files"][rel]["blobs"]}
    new = sum(size for sha, size in chunks.items() if sha not in before)  # each stored once
    index = "saved_model/variables/variables.index"
    changed = changed_bytes(*(str(tmp_path / f"dl{i}" / index) for i in range(2)))
    # The head (4 KiB kernel, bias) and the object graph, nothing of the frozen backbone.
    assert 0 < changed < 8 * 1024
    assert new <= 1.1 * changed + ALLOWANCE, (new, changed)
    weights = sum(int(np.prod(v.shape)) * 4 for v in model.weights)
    # each variable stored once (Keras 3.15's model.export() wrote every tensor twice)
    assert weights <= manifests[1]["files"][rel]["size"] <= 1.05 * weights
    served = tf.saved_model.load(str(tmp_path / "dl1" / "saved_model"))
    np.testing.assert_allclose(
        served.serve(tf.constant(x)).numpy(), model.predict(x, verbose=0), rtol=1e-5, atol=1e-5
    )
