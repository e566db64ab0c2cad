"""PyTorch's snapshot copy runs beside the next training step; in-place writes wait (issue 42).

On ``KERAS_BACKEND=torch`` a checkpoint's copy of the large variables runs on a background thread
while ``fit()`` goes on (``ckptstore/keras_io/saving/_torch_guard.py``). Each test here writes
the variables in place right after a checkpoint is taken (``set_weights`` in a callback, a custom
``train_step``'s ``assign`` and a raw ``param.data`` write, a GAN's two optimizers) while the copy
is held back (``START_DELAY``: the copy of a busy machine), and checks that every checkpoint holds
the state at the checkpoint, bit for bit: without the guard the copy would read the new values.
Run in the PyTorch child run (tests/keras_io/test_torch_suite.py); absent on other backends.
"""

from __future__ import annotations

import io
import json
import os
import zipfile

import h5py
import numpy as np
import pytest

import ckptstore as det
from tests.checkpointing._helpers import stored_folder

pytestmark = pytest.mark.e2e  # trains Keras models end to end
ON_TORCH = os.environ.get("KERAS_BACKEND") == "torch"
#: Inputs wide enough that the first kernel (256 x 64 float32 = 64 KiB) and its Adam slots are
#: copied in the background (``_torch_buffers.OVERLAP_BYTES``).
WIDTH = 256
X = np.random.RandomState(2).rand(16, WIDTH).astype("float32")
EPOCHS = 3


class Expect:
    """Every stored variable's value when a checkpoint is taken, by the epochs it completes:
    recorded in ``on_epoch_begin`` by a callback placed before ``DeterminedCallback`` (which
    takes the pending checkpoint in its own ``on_epoch_begin``)."""

    def __init__(self, keras, model):
        from ckptstore.keras_io.saving import _snapshot as snapshot_lib

        self.by_epoch: dict[int, dict[str, np.ndarray]] = {}
        outer = self

        class Record(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                layout = snapshot_lib.StateLayout.of(model)
                outer.by_epoch[epoch] = {
                    f"{e.group}/vars/{e.key}": np.array(e.variable.numpy(), copy=True)
                    for e in layout.entries
                    if e.variable is not None
                }
                layout.close()

        self.callback = Record()


def checkpoints_hold_the_state_taken(tmp_path, ctx, expect: Expect) -> int:
    """Assert each checkpoint's ``model.weights.h5`` equals what ``expect`` recorded for it."""
    checked = 0
    for i, ckpt in enumerate(ctx.registry.list_checkpoints(trial_id=ctx.trial_id)):
        folder = stored_folder(str(tmp_path / "ckpts"), ckpt.uuid, tmp_path / f"got{i}")
        with open(os.path.join(folder, "callback_state.json")) as f:
            epoch = json.load(f)["epoch"]
        want = expect.by_epoch.get(epoch)
        if want is None:  # the final checkpoint: nothing wrote after it
            continue
        with zipfile.ZipFile(os.path.join(folder, "model.keras")) as z:
            h5 = h5py.File(io.BytesIO(z.read("model.weights.h5")), "r")
            for path, value in want.items():
                np.testing.assert_array_equal(h5[path][()], value, err_msg=f"epoch {epoch} {path}")
        checked += 1
    return checked


@pytest.fixture
def slow_copy(monkeypatch):
    """Hold each background copy back 0.3 s: the writes after a checkpoint come first."""
    from ckptstore.keras_io.saving import _torch_guard

    monkeypatch.setattr(_torch_guard, "START_DELAY", 0.3)


@pytest.fixture
def run(tmp_path, where, slow_copy):
    """``run(model, *after)``: fit() with [Expect, DeterminedCallback, *after]; checks every
    checkpoint but the last holds the state when it was taken; returns the callback."""
    import keras

    def go(model, *after, data=None):
        expect = Expect(keras, model)
        with det.core.init(**where.core_kwargs(), trial_id=1) as ctx:
            cb = det.keras.DeterminedCallback(ctx, None, 1, export_saved_model="never")
            x = X if data is None else data
            y = None if data is not None else X[:, :1]
            callbacks = [expect.callback, cb, *after]
            model.fit(x, y, batch_size=4, epochs=EPOCHS, verbose=0, callbacks=callbacks)
            assert checkpoints_hold_the_state_taken(tmp_path, ctx, expect) == EPOCHS - 1
            pool = cb._layout.__dict__["_torch_buffers"]
            assert len(pool.waits) == EPOCHS and pool.in_flight is None
            # fit()'s thread waited for each copy (held back) but the last (the writer waits
            # for that one at fit()'s end)
            assert all(waited > 0 for waited in pool.waits[: EPOCHS - 1])
        return cb

    return go


def regressor(keras, model_class=None):
    keras.utils.set_random_seed(4)
    inputs = keras.Input((WIDTH,))
    outputs = keras.layers.Dense(1)(keras.layers.Dense(64, activation="relu")(inputs))
    model = (model_class or keras.Model)(inputs, outputs)
    model.compile(keras.optimizers.Adam(0.01), loss="mse")
    return model


def _set_weights_in_a_callback(run):
    import keras

    model = regressor(keras)

    class Perturb(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.model.set_weights([w + 1.0 for w in self.model.get_weights()])

    run(model, Perturb())


def _train_step_writes_in_place(run, how):
    import keras
    import torch

    class Shrinks(keras.Model):
        """Shrinks its first kernel before each step: Keras's assign, or torch on ``.data``."""

        def train_step(self, data):
            kernel = self.layers[1].kernel
            if how == "assign":
                kernel.assign(kernel * 0.5)
            else:
                with torch.no_grad():
                    kernel.value.data.mul_(0.5)
            return super().train_step(data)

    run(regressor(keras, Shrinks))


def _gan_two_optimizers(run):
    import keras
    import torch

    class TorchGAN(keras.Model):
        """A critic and a maker, each stepped by an Adam of its own (torch autograd)."""

        def __init__(self, critic, maker, **kwargs):
            super().__init__(**kwargs)
            self.critic, self.maker = critic, maker

        def compile(self, critic_opt, maker_opt):
            super().compile()
            self.critic_opt, self.maker_opt = critic_opt, maker_opt

        def call(self, z):
            return self.maker(z)

        def train_step(self, real):
            z = real[:, :8]
            for net, opt, sign in (
                (self.critic, self.critic_opt, 1.0),
                (self.maker, self.maker_opt, -1.0),
            ):
                self.zero_grad()
                fake = self.critic(self.maker(z)).mean()
                loss = sign * fake - (self.critic(real).mean() if sign > 0 else 0.0)
                loss.backward()
                weights = net.trainable_weights
                with torch.no_grad():
                    opt.apply([w.value.grad for w in weights], weights)
            return {"loss": loss}

    keras.utils.set_random_seed(5)
    critic = keras.Sequential(
        [keras.Input((WIDTH,)), keras.layers.Dense(64), keras.layers.Dense(1)]
    )
    maker = keras.Sequential([keras.Input((8,)), keras.layers.Dense(WIDTH)])
    model = TorchGAN(critic, maker)
    model.compile(keras.optimizers.Adam(0.01), keras.optimizers.Adam(0.02))
    model(np.zeros((1, 8), "float32"))
    run(model, data=X)


def _guard_waits_only_for_the_copied_memory():
    import torch

    from ckptstore.keras_io.saving._torch_guard import BackgroundCopy

    source, other = torch.zeros(20_000), torch.zeros(4)
    view = torch.empty_like(source)
    depth = torch._C._len_torch_function_stack()
    copy = BackgroundCopy([view], [source])
    other.add_(1.0)  # another tensor's memory: no wait
    assert not copy.done.is_set()
    source[:3] = 7.0  # the copied memory: waits for the copy first
    assert copy.done.is_set() and copy.waited > 0
    assert float(view.abs().max()) == 0.0 and float(source[0]) == 7.0
    copy.settle()
    copy.result()
    assert torch._C._len_torch_function_stack() == depth  # the guard is off


def _write_from_another_thread_is_copied_again(caplog):
    import threading

    import torch

    from ckptstore.keras_io.saving._torch_guard import BackgroundCopy

    source = torch.zeros(20_000)
    view = torch.empty_like(source)
    with caplog.at_level("WARNING"):
        copy = BackgroundCopy([view], [source])
        writer = threading.Thread(target=source.add_, args=(1.0,))  # outside the guard's thread
        writer.start()
        writer.join()
        copy.settle()
        copy.result()
    assert float(view.min()) == 1.0  # whole, at the newer value, and said so
    assert "written in place while the checkpoint copied it" in caplog.text


if ON_TORCH:

    def test_guard_waits_only_for_writes_to_the_copied_memory(slow_copy):
        _guard_waits_only_for_the_copied_memory()

    def test_a_write_from_another_thread_is_copied_again_with_a_warning(slow_copy, caplog):
        _write_from_another_thread_is_copied_again(caplog)

    def test_set_weights_right_after_a_checkpoint_leaves_it_whole(run):
        _set_weights_in_a_callback(run)

    @pytest.mark.parametrize("how", ["assign", "raw_data"])
    def test_train_step_writing_in_place_leaves_the_checkpoint_whole(run, how):
        _train_step_writes_in_place(run, how)

    def test_gan_two_optimizers_leave_the_checkpoint_whole(run):
        _gan_two_optimizers(run)
