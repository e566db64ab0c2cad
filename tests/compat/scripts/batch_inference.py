"""Determined's batch-inference recipe (``client.get_checkpoint(uuid).download()`` then load and
predict), with ``from ckptstore.experimental import client``. Usage: batch_inference.py TRIAL OUT"""

import sys

import numpy as np

import ckptstore as det
from ckptstore.experimental import client

trial_id, out = int(sys.argv[1]), sys.argv[2]
checkpoint = client.get_trial(trial_id).select_checkpoint(latest=True)
path = checkpoint.download()
model = det.keras.load_model_from_checkpoint_path(path)
x = np.linspace(-1, 1, 12, dtype="float32").reshape(3, 4)
np.save(out, model.predict(x, verbose=0))
print(checkpoint.uuid, checkpoint.metadata["steps_completed"])
