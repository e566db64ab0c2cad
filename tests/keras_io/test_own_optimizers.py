"""A model's own optimizers with ``DeterminedCallback`` (Keras 3): a GAN whose ``compile()`` keeps
a discriminator and a generator optimizer in attributes, stepped by its own ``train_step`` on
input-only batches. Every slot of both is in each checkpoint and a resume restores them (the
bit-exact run across processes is ``gan_two_optimizers`` in ``test_shape_corpus.py``); a warm
start leaves them fresh; a checkpoint that cannot restore them is a ``ResumeError``, never a
silent resume from zeroed slots. Keras 2 restores them through TensorFlow's object graph.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import ckptstore as det
from ckptstore import errors
from ckptstore.keras_io.saving import _optimizers as optimizers_lib
from tests.keras_io.keras_under_test import keras, keras3_only

pytestmark = pytest.mark.e2e  # trains Keras models end to end
KERAS3 = keras3_only("Keras 2 restores them through TensorFlow's object graph")

X = np.random.RandomState(1).rand(16, 3).astype("float32")


class TinyGAN(keras.Model):
    """Two sub-models, two optimizers of its own, a train_step on images only."""

    def __init__(self, critic, maker, **kwargs):
        super().__init__(**kwargs)
        self.critic, self.maker = critic, maker

    def compile(self, critic_opt, maker_opt, names=("critic_opt", "maker_opt")):
        super().compile()
        setattr(self, names[0], critic_opt)
        setattr(self, names[1], maker_opt)
        self.names = names

    def call(self, z):
        return self.maker(z)

    def train_step(self, real):
        critic_opt, maker_opt = (getattr(self, n) for n in self.names)
        z = real[:, :2]
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(self.critic(self.maker(z))) - tf.reduce_mean(self.critic(real))
        weights = self.critic.trainable_weights
        critic_opt.apply_gradients(zip(tape.gradient(loss, weights), weights, strict=True))
        with tf.GradientTape() as tape:
            loss = -tf.reduce_mean(self.critic(self.maker(z)))
        weights = self.maker.trainable_weights
        maker_opt.apply_gradients(zip(tape.gradient(loss, weights), weights, strict=True))
        return {"loss": loss}


def gan(names=("critic_opt", "maker_opt"), called=True):
    """``called=False``: never called, as in a script whose train_step is all that runs it (the
    model stays unbuilt, its sub-models are built by their Input)."""
    keras.utils.set_random_seed(5)
    critic = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    maker = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])
    model = TinyGAN(critic, maker)
    model.compile(keras.optimizers.Adam(0.01), keras.optimizers.Adam(0.02), names=names)
    if called:
        model(np.zeros((1, 2), "float32"))
    return model


@pytest.fixture
def fit(tmp_path):
    """``fit(model, checkpoint, continue_id, epochs)``: the callback's last checkpoint."""

    def run(model, checkpoint=None, continue_id=1, epochs=1):
        with det.core.init(
            storage=str(tmp_path / "ckpts"),
            registry=f"sqlite:///{tmp_path / 'reg.db'}",
            trial_id=1,
            preempt_signals=False,
        ) as core:
            cb = det.keras.DeterminedCallback(
                core, checkpoint, continue_id, export_saved_model="never"
            )
            model.fit(X, batch_size=4, epochs=epochs, verbose=0, callbacks=[cb])
            return cb.last_checkpoint, cb

    return run


def own_state(model):
    return [
        np.asarray(v)
        for name in model.names
        for v in optimizers_lib.variables_of(getattr(model, name))
    ]


@KERAS3
def test_own_optimizers_resume_with_every_slot_and_warm_start_fresh(fit):
    trained = gan()
    uuid, _ = fit(trained)
    want = own_state(trained)
    assert (
        len(want) == (2 + 2 * 4) + (2 + 2 * 2) and want[0] == 4
    )  # iterations, lr, m, v per weight
    resumed = gan()
    _, cb = fit(resumed, uuid, epochs=1)  # the run is complete: restores, trains nothing more
    assert cb.resumed
    for a, b in zip(want, own_state(resumed), strict=True):
        np.testing.assert_array_equal(a, b)
    warm = gan()
    _, cb = fit(warm, uuid, continue_id=2)  # another run: the weights only
    assert not cb.resumed
    assert int(np.asarray(warm.critic_opt.iterations)) == 4  # its own 4 steps, not 8


@KERAS3
def test_a_gan_never_called_outside_its_train_step_resumes(fit):
    trained = gan(called=False)
    uuid, _ = fit(trained, epochs=2)
    assert not trained.built  # Keras refuses load_weights into such a model by itself
    resumed = gan(called=False)
    _, cb = fit(resumed, uuid, epochs=3)
    assert cb.resumed and cb.steps_completed == 12
    assert int(np.asarray(resumed.critic_opt.iterations)) == 12
    assert int(np.asarray(resumed.maker_opt.iterations)) == 12


@KERAS3
def test_optimizer_the_checkpoint_has_no_state_for_is_a_resume_error(fit):
    uuid, _ = fit(gan())
    with pytest.raises(errors.ResumeError, match="d_opt"):
        fit(gan(names=("d_opt", "g_opt")), uuid)


@KERAS3
def test_checkpoint_without_the_slots_of_a_stepped_optimizer_is_a_resume_error(fit, monkeypatch):
    # As written before the slots were saved: the layout of fit() start, and no record.
    monkeypatch.setattr("ckptstore.keras_io.saving._snapshot.StateLayout.grown", lambda s: False)
    monkeypatch.setattr(optimizers_lib, "OPTIMIZERS_FILENAME", "elsewhere.json")
    uuid, _ = fit(gan())
    monkeypatch.undo()
    with pytest.raises(errors.ResumeError, match="'critic_opt'.*4 steps"):
        fit(gan(), uuid, epochs=2)
