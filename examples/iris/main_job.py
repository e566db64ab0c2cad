"""The main job, end to end: train, interrupt, resume, then load by UUID and predict.

Each step is a separate process, as it would be on a cluster:

1. ``train.py`` starts training trial 1 (checkpoint every epoch, in the background);
2. once its first checkpoint is committed it gets SIGTERM: it saves a checkpoint and stops;
3. ``train.py`` runs again: it resumes the trial from that checkpoint and trains to the end;
4. the final checkpoint is loaded by UUID (``ckptstore.load_checkpoint_model``) in a fresh
   process and predicts the species of the Iris flowers.

Exits non-zero if any step fails. Storage and registry default to a fresh temporary folder
(kept with ``--workdir``); ``--storage`` takes any storage URL.

    python examples/iris/main_job.py
    python examples/iris/main_job.py --workdir /tmp/iris-job --storage s3://bucket/iris
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
TRAIN = os.path.join(HERE, "train.py")

PREDICT = """
import json, sys
import numpy as np
sys.path.insert(0, {here!r})
import ckptstore
from train import load_data
model = ckptstore.load_checkpoint_model(
    checkpoint_uuid={uuid!r}, storage={storage!r}, registry={registry!r}
)
x, y = load_data()
pred = np.argmax(np.asarray(model.predict(x, verbose=0)), axis=1)
print(json.dumps({{"accuracy": float((pred == y).mean()), "first": pred[:5].tolist()}}))
"""


class StepFailed(RuntimeError):
    pass


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def _summary(output: str, step: str) -> dict:
    for line in reversed(output.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise StepFailed(f"{step}: no JSON summary in its output:\n{output[-3000:]}")


def _committed_checkpoints(registry: str, trial_id: int) -> int:
    from ckptstore.registry import Registry

    with Registry(registry) as reg:
        return len(reg.list_checkpoints(trial_id=trial_id))


def run(args: argparse.Namespace, workdir: str) -> None:
    storage = args.storage or os.path.join(workdir, "checkpoints")
    registry = args.registry or f"sqlite:///{os.path.join(workdir, 'registry.db')}"
    common = [sys.executable, TRAIN, "--storage", storage, "--registry", registry]
    common += ["--trial-id", str(args.trial_id), "--epochs", str(args.epochs)]
    log = os.path.join(workdir, "train-1.log")

    print(f"[1/4] training trial {args.trial_id} ({args.epochs} epochs) -> {storage}", flush=True)
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [*common, "--step-delay", str(args.step_delay)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_env(),
        )
        deadline = time.monotonic() + args.timeout
        while _committed_checkpoints_safe(registry, args.trial_id) < 2:
            if proc.poll() is not None:
                raise StepFailed(
                    f"training exited ({proc.returncode}) before it could be interrupted; see {log}"
                )
            if time.monotonic() > deadline:
                proc.kill()
                raise StepFailed(f"no checkpoint within {args.timeout} s; see {log}")
            time.sleep(0.2)
        print("[2/4] checkpoints are being written; sending SIGTERM (preemption)", flush=True)
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise StepFailed(f"training did not stop after SIGTERM; see {log}") from None
    with open(log) as f:
        first = _summary(f.read(), "interrupted run")
    if rc != 0 or not first["preempted"] or not first["checkpoint"]:
        raise StepFailed(f"interrupted run: exit {rc}, summary {first}; see {log}")
    if first["epochs_run"] >= args.epochs:
        raise StepFailed(f"training finished before the interruption: {first}")
    print(
        f"      stopped in epoch {first['epochs_run']} at step {first['steps_completed']}; "
        f"checkpoint {first['checkpoint']}",
        flush=True,
    )

    print("[3/4] re-running the same command: resume from the latest checkpoint", flush=True)
    done = subprocess.run(common, capture_output=True, text=True, env=_env(), timeout=args.timeout)
    with open(os.path.join(workdir, "train-2.log"), "w") as f:
        f.write(done.stdout + done.stderr)
    if done.returncode != 0:
        raise StepFailed(f"resumed run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    second = _summary(done.stdout, "resumed run")
    if not second["resumed"] or second["steps_completed"] <= first["steps_completed"]:
        raise StepFailed(f"the second run did not resume: {second}")
    if second["first_epoch"] + second["epochs_run"] - 1 != args.epochs:
        raise StepFailed(f"the resumed run did not train to epoch {args.epochs}: {second}")
    print(
        f"      resumed at step {first['steps_completed']} in epoch {second['first_epoch']} "
        f"and trained {second['epochs_run']} more epochs (epochs {second['first_epoch']}-"
        f"{args.epochs}) to {second['steps_completed']} steps; "
        f"val_accuracy {second['val_accuracy']:.3f}; final checkpoint {second['checkpoint']}",
        flush=True,
    )

    print(f"[4/4] loading checkpoint {second['checkpoint']} by UUID and predicting", flush=True)
    code = PREDICT.format(here=HERE, uuid=second["checkpoint"], storage=storage, registry=registry)
    pred = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=args.timeout,
    )
    if pred.returncode != 0:
        raise StepFailed(f"loading/predicting failed:\n{pred.stderr[-3000:]}")
    result = _summary(pred.stdout, "prediction")
    print(f"      accuracy on the 150 flowers: {result['accuracy']:.3f}", flush=True)
    if result["accuracy"] < args.min_accuracy:
        raise StepFailed(f"accuracy {result['accuracy']:.3f} < {args.min_accuracy}")


def _committed_checkpoints_safe(registry: str, trial_id: int) -> int:
    try:
        return _committed_checkpoints(registry, trial_id)
    except Exception:  # noqa: BLE001 - the registry may not exist yet
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Train, interrupt, resume, load and predict.")
    parser.add_argument("--workdir", default=None, help="keep files here (default: temp, removed)")
    parser.add_argument("--storage", default=None)
    parser.add_argument("--registry", default=None)
    parser.add_argument("--trial-id", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--step-delay", type=float, default=0.05)
    parser.add_argument("--min-accuracy", type=float, default=0.8)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args(argv)
    sys.path.insert(0, REPO)

    workdir = args.workdir or tempfile.mkdtemp(prefix="ckptstore-iris-")
    os.makedirs(workdir, exist_ok=True)
    try:
        run(args, workdir)
    except StepFailed as exc:
        print(f"MAIN JOB FAILED: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print("MAIN JOB OK: trained, interrupted, resumed, loaded by UUID and predicted", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
