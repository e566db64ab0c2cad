"""A Core API script for the Ray engine's settings tests, in the shape of Determined's core_api
tutorials but with no NumPy or TensorFlow (a trial is a few seconds of Python): it "trains"
a counter for the searcher's length, checkpoints every 5 batches with where it ran (the Ray
node's marker from the node's own environment) and the value of ``CKR_PROBE`` (set by the
config's ``environment.environment_variables``), stops at a checkpoint when preempted
(SIGTERM) and resumes from its latest checkpoint."""

import json
import logging
import os
import time

import determined as det

#: Seconds per batch, so a test can stop the driver between two checkpoints.
SLEEP = float(os.environ.get("CKR_SLEEP", "0"))
NODE_ENV = "CKPTSTORE_TEST_RAY_NODE"


def restore(core_context) -> int:
    latest = core_context.info.latest_checkpoint
    if latest is None:
        return 0
    with core_context.checkpoint.restore_path(latest) as path:
        batches = json.loads((path / "state.json").read_text())["batches"]
    print(f"RESUMED AT {batches} BATCHES FROM {latest}")
    return batches


def main(core_context) -> None:
    batches = restore(core_context)
    for op in core_context.searcher.operations():
        while batches < op.length:
            time.sleep(SLEEP)
            batches += 1
            if batches % 5 and batches != op.length:
                continue
            core_context.train.report_training_metrics(batches, {"loss": 1.0 / batches})
            metadata = {
                "steps_completed": batches,
                "node": os.path.basename(os.environ.get(NODE_ENV, "")),
                "probe": os.environ.get("CKR_PROBE"),
            }
            with core_context.checkpoint.store_path(metadata) as (path, _):
                (path / "state.json").write_text(json.dumps({"batches": batches}))
            if core_context.preempt.should_preempt():
                print(f"PAUSED AT {batches} BATCHES")
                return
        core_context.train.report_validation_metrics(batches, {"loss": 1.0 / batches})
        op.report_completed(1.0 / batches)
    print(f"TRAINED {batches} BATCHES")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    with det.core.init() as core_context:
        main(core_context)
