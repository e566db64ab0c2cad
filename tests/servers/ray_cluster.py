"""A two-node Ray cluster on loopback for the Ray engine tests: the head on 127.0.0.2 and a
second node on 127.0.0.3 (Ray swaps 127.0.0.1 for the machine's interface address), one CPU
and a small object store each, each node with its own temp dir. One cluster per test session
(``ray_cluster``, loaded by tests/conftest.py; a node a test killed is started again for the
next test). The nodes start with a clean environment (:func:`node_env`: PATH, HOME, the
repository on PYTHONPATH and Ray's own switches, no ``CKPTSTORE_*``, no ``AWS_*``), as nodes
started from a plain shell on other machines would: whatever a trial needs must come from
the driver. :meth:`RayCluster.start_node` with ``hostname`` starts a node in its own UTS
namespace, so Ray (and the engine) see it on another host. Tear-down SIGKILLs every
process the fixture's nodes started (found by their temp dir in their command line or in the
:data:`NODE_ENV` variable every process inherits from its ``ray start``, and as their
descendants: ``ray start --head`` also leaves a client server behind, re-parented to init, that
names neither), checks that none is left, and touches no other Ray on the machine (no
``ray stop``).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests._helpers.ports import free_port

REPO = Path(__file__).resolve().parents[2]
#: Ray turns token auth on by itself when ~/.ray/auth_token exists (another cluster on this
#: machine may have made one); the test cluster and its drivers keep it off, all alike.
CLUSTER_ENV = {"RAY_AUTH_MODE": "disabled"}
HEAD_IP, NODE_IP = "127.0.0.2", "127.0.0.3"
OBJECT_STORE_BYTES = 80 * 1024 * 1024
# Dead nodes are noticed after ~3 s instead of Ray's default ~30 s.
SYSTEM_CONFIG = '{"health_check_period_ms": 1000, "health_check_failure_threshold": 3}'
#: Set to the node's temp dir for ``ray start`` and so inherited by every process of that node.
NODE_ENV = "CKPTSTORE_TEST_RAY_NODE"


def _processes() -> dict[int, tuple[int, str]]:
    """{pid: (parent pid, command line + this fixture's NODE_ENV value)} of every live
    process (zombies left out: they are gone once their parent is)."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if fields[0] == "Z":
                continue
            ppid = int(fields[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            node = ""
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    for item in f.read().split(b"\0"):
                        if item.startswith(NODE_ENV.encode() + b"="):
                            node = item.decode(errors="replace")
            except OSError:  # another user's process: not one of ours
                pass
        except (OSError, ValueError, IndexError):
            continue
        out[int(entry)] = (ppid, f"{cmdline} {node}")
    return out


def _tree(marker: str) -> set[int]:
    """Processes whose command line names ``marker`` (a node's temp dir), and their
    descendants (Ray renames its workers' titles, so they are found through their parents)."""
    procs = _processes()
    found = {pid for pid, (_, cmd) in procs.items() if marker in cmd}
    grew = True
    while grew:
        more = {pid for pid, (ppid, _) in procs.items() if ppid in found} - found
        found |= more
        grew = bool(more)
    found.discard(os.getpid())
    return found


def _kill(pids: set[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@dataclasses.dataclass
class RayCluster:
    address: str
    base: Path
    env: dict[str, str]

    def node_dir(self, name: str) -> str:
        return str(self.base / name)

    def processes(self, name: str) -> set[int]:
        return _tree(self.node_dir(name))

    def kill_node(self, name: str) -> None:
        """SIGKILL a node's raylet and everything under it (a lost machine)."""
        _kill(self.processes(name))

    def start_node(self, name: str = "w", ip: str = NODE_IP, hostname: str | None = None) -> None:
        """Join a node to the cluster; with ``hostname``, in its own UTS namespace under that
        name (``unshare --uts``), which is how Ray tells machines apart (its node table's
        ``NodeManagerHostname``)."""
        _ray_start(
            ["--address", self.address, "--node-ip-address", ip],
            self.node_dir(name),
            self.env,
            hostname=hostname,
        )

    def alive(self, name: str) -> bool:
        """Whether the node's raylet runs."""
        return any(b"raylet" in cmdline(pid) for pid in self.processes(name))


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _ray_start(
    args: list[str], temp_dir: str, env: dict[str, str], hostname: str | None = None
) -> None:
    ray = str(Path(sys.executable).with_name("ray"))
    cmd = [ray, "start", *args, "--num-cpus", "1", "--object-store-memory"]
    cmd += [str(OBJECT_STORE_BYTES), "--temp-dir", temp_dir, "--disable-usage-stats"]
    if hostname is not None:
        # A new UTS namespace (a user namespace too when not root) named like another machine;
        # the node's daemons inherit it.
        unshare = ["unshare", "--uts"] if os.geteuid() == 0 else ["unshare", "-Ur", "--uts"]
        script = f"hostname {hostname} && exec {subprocess.list2cmdline(cmd)}"
        cmd = [*unshare, "sh", "-c", script]
    env = {**env, NODE_ENV: temp_dir}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")


def node_env() -> dict[str, str]:
    """What ``env -i PATH=... HOME=... ray start`` gives a node, plus this checkout first on
    PYTHONPATH (so the nodes run the code under test) and Ray's switches."""
    keep = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR") if k in os.environ}
    keep["PYTHONPATH"] = os.pathsep.join(
        [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    return {**keep, "RAY_USAGE_STATS_ENABLED": "0", "TF_CPP_MIN_LOG_LEVEL": "3", **CLUSTER_ENV}


@pytest.fixture
def ray_cluster(_ray_session_cluster: RayCluster) -> RayCluster:
    """The session's two-node cluster, with its second node started again if a test killed it."""
    if not _ray_session_cluster.alive("w"):
        _kill(_ray_session_cluster.processes("w"))
        _ray_session_cluster.start_node("w", NODE_IP)
    return _ray_session_cluster


@pytest.fixture(scope="session")
def _ray_session_cluster():
    ray = Path(sys.executable).with_name("ray")
    if not ray.exists():
        pytest.skip("Ray is not installed (pip install 'ckptstore[ray]')")
    # Short: Ray's unix sockets live under the temp dir (paths are limited to 107 bytes).
    base = Path(tempfile.mkdtemp(prefix="ckr", dir="/tmp"))
    env = node_env()
    cluster = None
    try:
        # Other Ray clusters may start on this machine meanwhile and take the free port picked
        # here before the head binds it: start again on another port if a node cannot join.
        for attempt in range(3):
            port = free_port(HEAD_IP)
            cluster = RayCluster(f"{HEAD_IP}:{port}", base, env)
            try:
                _ray_start(
                    [
                        "--head",
                        "--node-ip-address",
                        HEAD_IP,
                        "--port",
                        str(port),
                        "--include-dashboard",
                        "false",
                        "--system-config",
                        SYSTEM_CONFIG,
                    ],
                    cluster.node_dir("h"),
                    env,
                )
                cluster.start_node("w", NODE_IP)
                break
            except RuntimeError:
                _kill(_tree(str(base)))
                if attempt == 2:
                    raise
        yield cluster
    finally:
        for _ in range(3):  # workers may still be forking while the first round is killed
            _kill(_tree(str(base)))
            time.sleep(0.5)
        left = {pid: cmd for pid, (_, cmd) in _processes().items() if pid in _tree(str(base))}
        shutil.rmtree(base, ignore_errors=True)
        assert not left, f"Ray processes outlived the test cluster: {left}"
