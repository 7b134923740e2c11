"""One stage's data-parallel ranks on several machines ("nodes"): which node this is, where they meet.

Selected by environment variables, the same on every machine but the node rank (they say where the
processes run, not what they compute: ``deepspeed.world_size`` alone fixes the batches and the
weights, so they are not params and never change a result or a DVC stage):

- ``STEPRL_NODES``: how many machines (default 1); ``deepspeed.world_size`` must be a multiple of
  it, each machine runs ``world_size / nodes`` ranks;
- ``STEPRL_NODE_RANK``: this machine's index, 0 .. nodes-1. Node 0 runs the stage proper (Prefect,
  MLflow, rollout, checkpoints: rank 0 and ranks 1 .. L-1); node n runs ranks n*L .. n*L+L-1 only;
- ``STEPRL_MASTER_ADDR``, ``STEPRL_MASTER_PORT``: where node 0 listens for the others (its
  ``TCPStore``), an address of node 0 that the others can reach, and a free port;
- ``STEPRL_RENDEZVOUS_TIMEOUT_S`` (default 600): how long node 0 waits for the others to join and
  they wait to reach it.

Node 0 binds its store to ``STEPRL_MASTER_ADDR`` only (a socket bound here, handed to torch's
``TCPStore`` as ``master_listen_fd``: torch's own would listen on every interface); the ranks'
gloo pairs use the interface of ``GLOO_SOCKET_IFNAME`` (``lo`` when the address is loopback).

Before any rank starts, every node posts a summary of what it runs with (the stage's params, the
digests of its inputs and code, its command-line arguments) and node 0 compares them: a node whose
summary differs stops with the keys that differ, as do the others. While the ranks run, each other
node beats (``steprl/node/<n>/beat``, every :data:`HEARTBEAT_S` seconds) and says when one of its ranks
failed or all ended; rank 0's watch (components.train.rank_watch) stops the stage on a failure, or
when a node has not beaten for :data:`HEARTBEAT_TIMEOUT_S` seconds (a machine lost). A node whose
store calls fail (rank 0 gone) stops its ranks within :data:`HEARTBEAT_S` seconds.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from components.train.rank_watch import RankFailed

__all__ = [
    "HEARTBEAT_S",
    "HEARTBEAT_TIMEOUT_S",
    "MASTER_ADDR_VAR",
    "MASTER_PORT_VAR",
    "NODES_VAR",
    "NODE_RANK_VAR",
    "NodeError",
    "NodeReporter",
    "Nodes",
    "RemoteNodes",
    "agree",
    "host_store",
    "join_store",
]

NODES_VAR = "STEPRL_NODES"
NODE_RANK_VAR = "STEPRL_NODE_RANK"
MASTER_ADDR_VAR = "STEPRL_MASTER_ADDR"
MASTER_PORT_VAR = "STEPRL_MASTER_PORT"
TIMEOUT_VAR = "STEPRL_RENDEZVOUS_TIMEOUT_S"
HEARTBEAT_S = 2.0
HEARTBEAT_TIMEOUT_S = 30.0


class NodeError(RuntimeError):
    """Bad node settings, or nodes that cannot meet or do not agree; the message says which."""


def _int(env: Mapping[str, str], var: str, default: int | None) -> int | None:
    raw = env.get(var, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise NodeError(f"{var}={raw!r} is not an integer") from None


@dataclass(frozen=True)
class Nodes:
    """The machines of one stage's world, and this one's place among them."""

    count: int = 1
    rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    timeout_s: float = 600.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Nodes:
        """The settings of ``STEPRL_NODES`` ... (module doc), checked; one machine when unset."""
        env = os.environ if env is None else env
        count = _int(env, NODES_VAR, 1)
        if count < 1:
            raise NodeError(f"{NODES_VAR}={count}: the number of machines must be >= 1")
        rank = _int(env, NODE_RANK_VAR, None)
        if count == 1:
            if rank not in (None, 0):
                raise NodeError(f"{NODE_RANK_VAR}={rank} but {NODES_VAR} is 1 (unset): set {NODES_VAR} too")
            return cls()
        missing = [v for v in (NODE_RANK_VAR, MASTER_ADDR_VAR, MASTER_PORT_VAR) if not env.get(v, "").strip()]
        if missing:
            raise NodeError(f"{NODES_VAR}={count} needs {', '.join(missing)} on every machine")
        if not 0 <= rank < count:
            raise NodeError(f"{NODE_RANK_VAR}={rank}: must be 0 .. {count - 1} ({NODES_VAR}={count})")
        port = _int(env, MASTER_PORT_VAR, None)
        if not 1 <= port <= 65535:
            raise NodeError(f"{MASTER_PORT_VAR}={port}: not a TCP port (1 .. 65535)")
        raw_timeout = env.get(TIMEOUT_VAR, "").strip() or "600"
        try:
            timeout = float(raw_timeout)
        except ValueError:
            raise NodeError(f"{TIMEOUT_VAR}={raw_timeout!r} is not a number of seconds") from None
        if timeout <= 0:
            raise NodeError(f"{TIMEOUT_VAR}={raw_timeout}: must be > 0")
        return cls(count, rank, env[MASTER_ADDR_VAR].strip(), port, timeout)

    def local_ranks(self, world_size: int, key: str = "deepspeed.world_size") -> range:
        """The global ranks this machine runs, after checking that the world splits evenly."""
        if world_size % self.count:
            raise NodeError(
                f"{key}={world_size} does not split evenly over {NODES_VAR}={self.count} machines "
                f"(use a multiple of {self.count})"
            )
        per = world_size // self.count
        return range(self.rank * per, (self.rank + 1) * per)

    @property
    def address(self) -> str:
        return f"{self.master_addr}:{self.master_port}"


# --- the store -----------------------------------------------------------------------------------
def host_store(nodes: Nodes) -> dist.TCPStore:
    """Node 0's ``TCPStore``, listening on ``nodes.master_addr`` only (the store owns the socket)."""
    family = socket.AF_INET6 if ":" in nodes.master_addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((nodes.master_addr, nodes.master_port))
        sock.listen(128)
        store = dist.TCPStore(
            nodes.master_addr,
            nodes.master_port,
            None,
            True,
            timedelta(seconds=nodes.timeout_s),
            wait_for_workers=False,
            master_listen_fd=sock.fileno(),
        )
    except OSError as err:
        sock.close()
        raise NodeError(
            f"node 0 cannot listen on {MASTER_ADDR_VAR}:{MASTER_PORT_VAR} = {nodes.address} "
            f"({err.strerror}): it must be an address of this machine and a free port"
        ) from None
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store closes the socket when it stops
    return store


def join_store(nodes: Nodes, timeout_s: float | None = None) -> dist.TCPStore:
    """A client of node 0's store (retries until ``timeout_s``, default the rendezvous timeout)."""
    timeout_s = nodes.timeout_s if timeout_s is None else timeout_s
    try:
        return dist.TCPStore(nodes.master_addr, nodes.master_port, None, False, timedelta(seconds=timeout_s))
    except (RuntimeError, TimeoutError) as err:
        raise NodeError(
            f"node {nodes.rank} could not reach node 0 at {MASTER_ADDR_VAR}:{MASTER_PORT_VAR} = "
            f"{nodes.address} within {timeout_s:.0f} s (start the stage on node 0; check the address "
            f"and that the port is open between the machines): {str(err).splitlines()[0][:200]}"
        ) from None


def _flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def differences(mine: Mapping[str, Any], theirs: Mapping[str, Any]) -> list[str]:
    """The flattened keys whose values differ between two summaries (missing on one side included)."""
    a, b = _flat(mine), _flat(theirs)
    return sorted(k for k in a.keys() | b.keys() if a.get(k, "<missing>") != b.get(k, "<missing>"))


def agree(store: dist.TCPStore, nodes: Nodes, summary: Mapping[str, Any]) -> None:
    """Every node posts ``summary`` (JSON); node 0 compares them with its own and answers each node.
    Raises :class:`NodeError` naming the keys that differ, on node 0 and on the node that differs."""
    text = json.dumps(summary, sort_keys=True, default=str)
    timeout = timedelta(seconds=nodes.timeout_s)
    if nodes.rank > 0:
        store.set(f"steprl/node/{nodes.rank}/summary", text)
        try:
            store.wait([f"steprl/node/{nodes.rank}/verdict"], timeout)
        except Exception as err:  # torch raises DistStoreError or RuntimeError
            raise NodeError(
                f"node {nodes.rank}: no answer from node 0 within {nodes.timeout_s:.0f} s: {err}"
            ) from None
        verdict = store.get(f"steprl/node/{nodes.rank}/verdict").decode()
        if verdict:
            raise NodeError(verdict)
        return
    wrong = []
    for n in range(1, nodes.count):
        key = f"steprl/node/{n}/summary"
        try:
            store.wait([key], timeout)
        except Exception:
            raise NodeError(
                f"node {n} did not join within {nodes.timeout_s:.0f} s: start the same stage on it with "
                f"{NODE_RANK_VAR}={n} ({NODES_VAR}={nodes.count}, {MASTER_ADDR_VAR}={nodes.master_addr}, "
                f"{MASTER_PORT_VAR}={nodes.master_port})"
            ) from None
        diff = differences(summary, json.loads(store.get(key)))
        verdict = ""
        if diff:
            shown = ", ".join(diff[:12]) + (f" and {len(diff) - 12} more" if len(diff) > 12 else "")
            verdict = f"node {n} runs with other settings or inputs than node 0: {shown} differ"
            wrong.append(verdict)
        store.set(f"steprl/node/{n}/verdict", verdict)
    if wrong:
        raise NodeError("; ".join(wrong))


# --- while the ranks run -------------------------------------------------------------------------
class NodeReporter:
    """On node n > 0: beats every :data:`HEARTBEAT_S` seconds, and tells node 0 when a rank failed
    or all ended. ``alive()`` is False once node 0's store no longer answers (rank 0 gone)."""

    def __init__(self, nodes: Nodes) -> None:
        self.nodes = nodes
        self._store = join_store(nodes, timeout_s=HEARTBEAT_TIMEOUT_S)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.lost: str | None = None  # why node 0 is taken for gone
        self._thread = threading.Thread(target=self._beat, name="steprl-heartbeat", daemon=True)
        self._thread.start()

    def _key(self, what: str) -> str:
        return f"steprl/node/{self.nodes.rank}/{what}"

    def _beat(self) -> None:
        while not self._stop.is_set():
            try:
                with self._lock:
                    self._store.add(self._key("beat"), 1)
            except Exception as err:  # the store's server (rank 0) is gone
                self.lost = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
                return
            self._stop.wait(HEARTBEAT_S)

    def alive(self) -> bool:
        """Whether node 0's store answered the last beat (``check``: ask it now)."""
        return self.lost is None

    def check(self) -> bool:
        """Ask node 0's store now (a rank that failed may have failed because rank 0 is gone)."""
        try:
            with self._lock:
                self._store.add(self._key("beat"), 0)
        except Exception as err:  # the store's server (rank 0) is gone
            self.lost = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
        return self.lost is None

    def report(self, what: str, value: Mapping[str, Any]) -> None:
        """``what``: "failed" (a rank's failure) or "done" (every rank ended well)."""
        try:
            with self._lock:
                self._store.set(self._key(what), json.dumps(dict(value)))
        except Exception:  # rank 0 gone: nothing to tell
            pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


class RemoteNodes:
    """Rank 0's view of the other nodes (:class:`components.train.rank_watch.RemoteRanks`)."""

    def __init__(self, nodes: Nodes, world_size: int, check_every_s: float = 1.0) -> None:
        self.nodes, self.world_size, self.check_every_s = nodes, world_size, check_every_s
        self._store = join_store(nodes)
        self._per = world_size // nodes.count
        now = time.monotonic()
        self._beats = {n: (-1, now) for n in range(1, nodes.count)}
        self._done: set[int] = set()
        self._checked = 0.0

    def failure(self) -> RankFailed | None:
        now = time.monotonic()
        if now - self._checked < self.check_every_s:
            return None
        self._checked = now
        for n in range(1, self.nodes.count):
            if n in self._done:
                continue
            if self._store.check([f"steprl/node/{n}/failed"]):
                info = json.loads(self._store.get(f"steprl/node/{n}/failed"))
                return RankFailed(
                    info["rank"], self.world_size, info.get("pid"), info["how"], where=f"node {n}, "
                )
            if self._store.check([f"steprl/node/{n}/done"]):
                self._done.add(n)
                continue
            beat = self._store.add(f"steprl/node/{n}/beat", 0)
            seen, since = self._beats[n]
            if beat != seen:
                self._beats[n] = (beat, now)
            elif now - since > HEARTBEAT_TIMEOUT_S:
                return RankFailed(
                    n * self._per,
                    self.world_size,
                    None,
                    f"sent no heartbeat for {HEARTBEAT_TIMEOUT_S:.0f} s (machine or network lost?)",
                    where=f"node {n}, ",
                )
        return None

    def done(self) -> bool:
        """Whether every other node said its ranks all ended well (as of the last :meth:`failure`)."""
        return len(self._done) == self.nodes.count - 1
