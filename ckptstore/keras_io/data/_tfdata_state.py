"""What a ``tf.data`` iterator checkpoint can hold when the pipeline keeps state outside it: one
rule for ``fit()``'s resumable input (``_resumable.py``) and ``TFKerasTrial``'s
(``keras_io/trial/data.py``).

TensorFlow refuses to checkpoint an iterator whose pipeline holds state of its own
(``FailedPreconditionError: <Op> is stateful``). That state is one of two kinds:

``draws``
    random draws: the seed variable of a Keras augmentation layer mapped over the data
    (``ReadVariableOp``), ``tf.random.*``, ``tf.image.random_*``. The iterator's position
    and its shuffle/prefetch buffers still say exactly where the data is, so iterators are
    made with ``ExternalStatePolicy.IGNORE`` (:func:`saving_positions`) and checkpoints keep
    them: a resumed run continues at the next batch, and only the draws after it differ from
    an uninterrupted run's. One warning (:data:`DRAWS`).
``python``
    a Python function (``tf.py_function``, ``tf.numpy_function``,
    ``Dataset.from_generator``): its state may be the data itself (a generator's position),
    which no checkpoint holds, so ignoring it would resume at a wrong place. The iterator is
    not saved; each caller says what its resume does instead (:data:`PYTHON`).

Lookup tables (``TextVectorization``, ``StringLookup``) and ``Normalization`` are not
stateful to TensorFlow here: their pipelines checkpoint exactly.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

Kind = Literal["none", "draws", "python"]

#: Ops whose state is a Python object's (tf.py_function, tf.numpy_function, from_generator).
_PYTHON_OPS = frozenset({"PyFunc", "EagerPyFunc", "PyFuncStateless"})

#: Warning for ``draws`` (%s: what runs, e.g. "this fit()"; TensorFlow's reason).
DRAWS = (
    "The tf.data pipeline of %s draws random numbers outside it (%s), e.g. a Keras random "
    "augmentation layer or tf.random/tf.image.random_* in dataset.map(): checkpoints save "
    "the data position and shuffle buffers but not those draws, so a resumed run continues "
    "at the next batch with other augmentations than an uninterrupted one. For an exact "
    "resume apply random augmentation layers in the model instead of in dataset.map() "
    "(their seed state is checkpointed with it), or use stateless random ops "
    "(tf.image.stateless_random_*) seeded from the data."
)
#: Warning for ``python`` (%s: what runs; TensorFlow's reason; what a resume does instead).
PYTHON = (
    "TensorFlow cannot checkpoint the tf.data pipeline of %s (%s): a Python function in it "
    "(tf.py_function, tf.numpy_function, Dataset.from_generator) holds state no checkpoint "
    "can, so its checkpoints commit without the input's position and %s. For an exact "
    "resume build the pipeline from tensors or files (from_tensor_slices, TFRecordDataset, "
    "tf.io ops in map())."
)


def saving_positions(dataset: Any) -> Any:
    """``dataset`` whose iterators checkpoint their position and buffers even when an op
    keeps ``draws`` state outside the pipeline (nothing else changes)."""
    import tensorflow as tf

    options = tf.data.Options()
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    return dataset.with_options(options)


def outside_state(dataset: Any, iterator: Any) -> tuple[Kind, str]:
    """Which state of ``dataset``'s pipeline a checkpoint of ``iterator`` (the one training
    reads) would leave out, and TensorFlow's words for it (``("none", "")`` when it holds
    everything). Asks TensorFlow to serialize that iterator under its default policy, which
    neither moves it nor draws a seed; a fresh iterator would (a ``shuffle(seed=...)`` hands
    each new iterator its next order, so a probe iterator changes the epochs after it).
    TensorFlow names only the first stateful op it meets, so a stateful pipeline's ops are then
    all looked at: any Python function makes it ``python``. An iterator TensorFlow cannot be
    asked about (a ``tf.distribute`` one) counts as ``python`` if it has a Python function."""
    import tensorflow as tf
    from tensorflow.python.ops import gen_dataset_ops

    resource = getattr(iterator, "_iterator_resource", None)
    if resource is None:
        python = bool(_PYTHON_OPS & _ops_of(dataset))
        return ("python", "a Python function in the pipeline") if python else ("none", "")
    try:
        policy = tf.data.experimental.ExternalStatePolicy.FAIL.value
        gen_dataset_ops.serialize_iterator(resource, external_state_policy=policy)
    except tf.errors.FailedPreconditionError as exc:
        reason = exc.message.split("}}")[-1].split(" [Op:")[0].strip().rstrip(".")
        return ("python" if _PYTHON_OPS & _ops_of(dataset) else "draws"), reason
    return "none", ""


def saveable(dataset: Any, iterator: Any, who: str, then: str, log: logging.Logger) -> bool:
    """Whether ``iterator`` (``dataset``'s, the one training reads) may be saved, with one
    warning on ``log`` when its checkpoint leaves something out: :data:`DRAWS`, or
    :data:`PYTHON` (then it may not) ending with ``then``, what a resume of ``who`` (e.g.
    "this fit()") does instead. Callers ask once, at the first checkpoint, and keep the answer."""
    kind, reason = outside_state(dataset, iterator)
    if kind == "draws":
        log.warning(DRAWS, who, reason)
    elif kind == "python":
        log.warning(PYTHON, who, reason, then)
    return kind != "python"


def _ops_of(dataset: Any) -> set[str]:
    """The op types of ``dataset``'s graph and its functions (``{"PyFunc"}`` when TensorFlow
    cannot say, which keeps the iterator unsaved: the safe side)."""
    import tensorflow as tf

    try:
        policy = tf.data.experimental.ExternalStatePolicy.IGNORE
        graph = tf.compat.v1.GraphDef.FromString(
            dataset._as_serialized_graph(external_state_policy=policy).numpy()
        )
    except Exception:  # noqa: BLE001 -- a private TensorFlow API: assume the worst
        return {"PyFunc"}
    return {n.op for n in graph.node} | {n.op for f in graph.library.function for n in f.node_def}


__all__ = ["DRAWS", "PYTHON", "Kind", "outside_state", "saveable", "saving_positions"]
