"""`seekrl launch CONFIG [overrides]`: a run's trainer ranks and engine servers, placed by Ray.

    seekrl launch examples/tiny_grpo.yaml cluster.engine_servers=1           # a local Ray, this machine
    seekrl launch CONFIG cluster.address=auto cluster.num_nodes=4 cluster.trainer_ranks=32 \\
        cluster.gpus_per_trainer=1 cluster.engine_servers=8 cluster.gpus_per_engine=1  # a running cluster

In order, every wait bounded by `cluster.timeout_s`:
1. The config was loaded and checked by the CLI (a ConfigError ends it before Ray starts); here the
   engine token is resolved and a local Ray's CPUs / GPUs are checked against what the job asks.
2. With `cluster.engine_servers`: the policy's initial weights and tokenizer are written to
   `<run>/engine/weights/v0`, built as the trainer builds them (`build.write_initial_weights`: a
   tiny model's tokenizer is trained on the task texts, so it must come from the same tasks and seed).
3. Ray starts in this process (`cluster.address=local`) or is joined (`auto`, `ray://host:port`);
   `cluster.runtime_env` is the job's runtime_env.
4. Engine servers: one placement group bundle and one `EngineServer` actor each; the actor starts
   the server (`seekrl serve engine`, SGLang or vLLM per `engine.server_kind`; the command is
   `engines.setup.server_command`, as for `engine.servers=N`) on its node's IP and a free port,
   waits for /health and returns its URL. Logs: `<run>/engine/server_<i>/server_0.log`.
   vLLM's control endpoints (/collective_rpc, /pause, /update_weight_version) take no token, so
   vLLM servers on node IPs are refused before Ray starts (ConfigError) unless
   `engine.allow_unauthenticated_control=true` says the network is trusted.
5. Trainer ranks: a placement group of `cluster.num_nodes` bundles (STRICT_SPREAD: one per node),
   each holding `trainer_ranks / num_nodes` `TrainerRank` actors, so a bundle's ranks share a
   node and LOCAL_RANK is their index in it. Rank 0 reports its node IP and a free port (the
   rendezvous); every rank sets torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
   LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and runs `seekrl.jobs.train` in-process on the
   config with `engine.kind=remote` and `engine.urls` set to the servers (when there are any).
   Ranks of one node with one GPU each all see the node's GPUs, in local-rank order, as torchrun's
   processes do (the trainer picks `cuda:LOCAL_RANK`).
6. The driver shows progress from `<run>/metrics.jsonl` (rank 0 alone logs it; the run folder
   must be on a file system the driver and every node share, as disk weight sync needs anyway)
   and waits on the ranks. A rank that raises or dies ends the job: `LaunchError`, one line
   naming the rank and the cause.
7. Whatever happened (success, an error, Ctrl-C, SIGTERM): the servers are stopped, every actor
   is killed, the placement groups are removed and Ray is shut down (a local one stops whole).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import sys
from pathlib import Path

from seekrl.build import run_folder, sampler_settings, write_initial_weights
from seekrl.config import Config
from seekrl.errors import ConfigError, LaunchError, SeekrlError

__all__ = ["LaunchError", "launch"]

POLL_S = 1.0  # how often the driver looks at the ranks and metrics.jsonl
STOP_S = 30.0  # longest wait for an engine actor to stop its server before it is killed


def require_ray():
    try:
        import ray
    except ImportError:
        raise LaunchError("seekrl launch needs Ray, which is not installed: pip install seekrl[ray]", status=2) from None
    return ray


def run_dir_of(cfg: Config) -> Path:
    """The run folder, as `seekrl train` names it."""
    return run_folder(cfg, write=False)


def check_local_resources(cfg: Config) -> None:
    """A local Ray must hold every rank and server at once, or the placement would wait for
    cluster.timeout_s in vain: say so now."""
    c = cfg.cluster
    if c.address != "local":
        return
    cpus = c.num_cpus or os.cpu_count() or 1
    need = c.trainer_ranks * c.cpus_per_trainer + c.engine_servers * c.cpus_per_engine
    if need > cpus:
        raise ConfigError(
            f"cluster: {c.trainer_ranks} trainer rank(s) x cluster.cpus_per_trainer={c.cpus_per_trainer:g} + {c.engine_servers} "
            f"engine server(s) x cluster.cpus_per_engine={c.cpus_per_engine:g} = {need:g} CPUs, but the local Ray has {cpus} "
            "(cluster.num_cpus); lower cpus_per_trainer / cpus_per_engine (e.g. 0.5) or the counts")
    gpus = c.trainer_ranks * c.gpus_per_trainer + c.engine_servers * c.gpus_per_engine
    if gpus:
        import torch

        if gpus > torch.cuda.device_count():
            raise ConfigError(f"cluster: the job asks for {gpus:g} GPUs (gpus_per_trainer / gpus_per_engine), this machine has "
                              f"{torch.cuda.device_count()}; lower them or run on a cluster (cluster.address=auto)")


def check_reachable(address: str, timeout_s: float) -> None:
    """ray.init retries an address nothing answers at for many minutes: probe it first (one TCP
    connection, 30 s at most). `auto` is resolved as Ray does (RAY_ADDRESS, else the cluster last
    started on this machine), with Ray's own function."""
    import socket

    hostport = address[len("ray://"):] if address.startswith("ray://") else None
    if hostport is None:
        try:
            from ray._private.services import canonicalize_bootstrap_address
        except ImportError:  # moved in another Ray version: ray.init finds out alone
            return
        try:
            hostport = canonicalize_bootstrap_address(address)
        except (ConnectionError, ValueError) as e:
            why = (str(e).splitlines() or [type(e).__name__])[0].rstrip(".")
            raise LaunchError(f"cluster.address={address}: {why}; start a cluster (ray start --head) "
                              "or use cluster.address=local") from None
        if hostport is None:
            raise LaunchError(f"cluster.address={address}: no Ray cluster found (RAY_ADDRESS is unset and none runs "
                              "here); start one (ray start --head) or use cluster.address=local")
    host, _, port = hostport.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=min(timeout_s, 30.0)).close()
    except (OSError, ValueError) as e:
        raise LaunchError(f"cluster.address={address}: nothing answers at {hostport} ({e}); is the Ray cluster up?") from None


def join(ray, address: str, timeout_s: float, runtime_env: dict) -> None:
    """ray.init on a running cluster, its failures as one line."""
    check_reachable(address, timeout_s)
    try:
        ray.init(address=address, log_to_driver=True, runtime_env=runtime_env or None)
    except (ConnectionError, RuntimeError) as e:
        why = (str(e).splitlines() or [type(e).__name__])[0]
        if "InvalidAuthToken" in f"{e} {e.__cause__}":  # Ray 2.60's `ray start` turns token authentication on
            why = ("the cluster refused this driver's authentication token; export RAY_AUTH_MODE=token with the "
                   "cluster's token in ~/.ray/auth_token (or RAY_AUTH_TOKEN)")
        raise LaunchError(f"cannot join the Ray cluster at cluster.address={address}: {why}") from None


# ---- the actors (made Ray actors by `ray.remote` at launch, so that importing this needs no Ray) ----
class EngineServer:
    """One engine server on this actor's node: its process (a ServerGroup of one: own process group,
    parent-death signal, SIGTERM then SIGKILL on stop) and its URL."""

    def __init__(self):
        self.group = None

    def start(self, cfg: Config, model_dir: str, index: int, token: str | None) -> str:
        import ray

        from seekrl.engines.adapters import get_api
        from seekrl.engines.launch import ServerGroup, free_port
        from seekrl.engines.setup import server_command

        host = ray.util.get_node_ip_address()  # reachable from the other nodes, unlike 127.0.0.1
        cmd = server_command(cfg.engine, model_dir, free_port(host), token, sampler_settings(cfg), host=host)  # gpus: the actor's
        log_dir = run_dir_of(cfg) / "engine" / f"server_{index}"
        self.group = ServerGroup.start([cmd], log_dir, health_path=get_api(cfg.engine.api).health.path,
                                       timeout_s=cfg.cluster.timeout_s, token=token)
        return cmd.url

    def stop(self) -> None:
        if self.group is not None:
            self.group.stop()


class TrainerRank:
    """One trainer process: torchrun's environment, then the RL loop in-process."""

    def where(self) -> tuple[str, list[str]]:
        """This actor's node IP and the GPU ids Ray gave it."""
        import ray

        return ray.util.get_node_ip_address(), [str(g) for g in ray.get_gpu_ids()]

    def free_port(self) -> int:
        from seekrl.engines.launch import free_port

        return free_port("0.0.0.0")  # the rendezvous listens on every interface of rank 0's node

    def train(self, cfg: Config, env: dict[str, str]) -> str:
        os.environ.update(env)
        from seekrl.jobs import train

        return str(train(cfg))


# ---- the driver -----------------------------------------------------------------------------------
def launch(cfg: Config) -> Path:
    """Run the job `cfg` describes (module docstring); return the run folder. Raises LaunchError
    (a rank failed, Ctrl-C, no room on the cluster) and ConfigError / DataError (bad input, before
    Ray starts)."""
    from seekrl.engines.setup import check_control_exposure, engine_token

    c = cfg.cluster
    token = engine_token(cfg.engine)
    check_local_resources(cfg)
    if c.engine_servers:  # what the ranks will run (remote on the servers' URLs) must pass the checks too
        rank_config(cfg, [f"http://server-{i}:0" for i in range(c.engine_servers)]).check()
        check_control_exposure(cfg.engine, "each node's IP address")  # vLLM's control endpoints take no token
    ray = require_ray()
    run_dir = run_dir_of(cfg)
    initial = write_initial_weights(cfg, run_dir) if c.engine_servers else None
    os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")  # the failed rank is reported once, below
    job, term = _Job(ray), {}
    with contextlib.ExitStack() as stack:
        try:
            if c.address == "local":  # "local": a new instance even if another runs on this machine
                ray.init(address="local", num_cpus=c.num_cpus, include_dashboard=False, log_to_driver=True,
                         runtime_env=c.runtime_env or None)
            else:
                join(ray, c.address, c.timeout_s, c.runtime_env)
            # after ray.init, whose own SIGTERM handler would abort the process before the teardown
            stack.enter_context(_sigterm_as_interrupt(term))
            urls = job.start_engines(cfg, initial, token) if c.engine_servers else []
            tail = MetricsTail(run_dir / "metrics.jsonl")  # before rank 0 can write to it
            job.start_ranks(rank_config(cfg, urls), token)
            _say(cfg, f"seekrl launch: run folder {run_dir}; {c.trainer_ranks} trainer rank(s)"
                      + (f", engine servers {' '.join(urls)}" if urls else ""))
            return job.wait(cfg, run_dir, tail)
        except KeyboardInterrupt:
            what, status = ("terminated (SIGTERM)", 143) if term else ("interrupted (Ctrl-C)", 130)
            raise LaunchError(f"{what}; the job's actors and servers were stopped", status) from None
        finally:
            job.teardown()


@contextlib.contextmanager
def _sigterm_as_interrupt(term: dict):
    """Within the block SIGTERM raises KeyboardInterrupt (and sets term["sigterm"]), so that it ends
    the job as Ctrl-C does, teardown included: Ray passes a KeyboardInterrupt raised in one of its
    waits on as it is, but turns any other exception from a signal handler into SystemExit(1)."""
    if not _main_thread():
        yield
        return

    def handler(signum, frame):
        term["sigterm"] = True
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def rank_config(cfg: Config, urls: list[str]) -> Config:
    """The config the ranks run: sampling on the placed servers (if any); the driver shows progress."""
    out = copy.deepcopy(cfg)
    out.log.progress = False
    if urls:
        out.engine.kind, out.engine.urls = "remote", list(urls)
    return out


def _say(cfg: Config, line: str) -> None:
    if cfg.log.progress:
        print(line, file=sys.stderr, flush=True)


class _Job:
    """What one launch placed, for teardown."""

    def __init__(self, ray):
        self.ray = ray
        self.engines: list = []
        self.ranks: list = []
        self.groups: list = []
        self.train_refs: dict = {}  # ObjectRef of a rank's train() -> its rank

    def placement_group(self, bundles: list[dict], strategy: str, what: str, timeout_s: float):
        from ray.util import placement_group

        pg = placement_group(bundles, strategy=strategy)
        self.groups.append(pg)
        try:
            self.ray.get(pg.ready(), timeout=timeout_s)
        except self.ray.exceptions.GetTimeoutError:
            raise LaunchError(f"the cluster has no room for the {what} ({len(bundles)} x {bundles[0]}, {strategy}) after "
                              f"cluster.timeout_s={timeout_s:g} s; free now: {self.ray.available_resources()}") from None
        return pg

    def start_engines(self, cfg: Config, initial: Path, token: str | None) -> list[str]:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        c = cfg.cluster
        bundle = _bundle(c.cpus_per_engine, c.gpus_per_engine)
        pg = self.placement_group([bundle] * c.engine_servers, "PACK" if c.num_nodes == 1 else "SPREAD",
                                  "engine servers", c.timeout_s)
        actor = self.ray.remote(EngineServer)
        for i in range(c.engine_servers):
            self.engines.append(actor.options(
                num_cpus=c.cpus_per_engine, num_gpus=c.gpus_per_engine,
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i),
            ).remote())
        refs = [e.start.remote(cfg, str(initial), i, token) for i, e in enumerate(self.engines)]
        return [self._get(ref, f"engine server {i}", c.timeout_s) for i, ref in enumerate(refs)]

    def start_ranks(self, cfg: Config, token: str | None) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        c = cfg.cluster
        per_node = c.trainer_ranks // c.num_nodes
        bundle = _bundle(c.cpus_per_trainer * per_node, c.gpus_per_trainer * per_node)
        pg = self.placement_group([bundle] * c.num_nodes, "STRICT_SPREAD" if c.num_nodes > 1 else "PACK",
                                  "trainer ranks", c.timeout_s)
        actor = self.ray.remote(TrainerRank)
        for r in range(c.trainer_ranks):
            self.ranks.append(actor.options(
                num_cpus=c.cpus_per_trainer, num_gpus=c.gpus_per_trainer,
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=r // per_node),
            ).remote())
        where = [self._get(a.where.remote(), f"trainer rank {r}", c.timeout_s) for r, a in enumerate(self.ranks)]
        master = (where[0][0], self._get(self.ranks[0].free_port.remote(), "trainer rank 0", c.timeout_s))
        for r, a in enumerate(self.ranks):
            env = rank_env(r, c.trainer_ranks, per_node, master, [g for _, g in where[r - r % per_node:][:per_node]])
            if token and cfg.engine.token_env:  # the variable engine.token_env names is the driver's, not the node's
                env[cfg.engine.token_env] = token
            self.train_refs[a.train.remote(cfg, env)] = r

    def wait(self, cfg: Config, run_dir: Path, tail: MetricsTail) -> Path:
        """Show the steps in metrics.jsonl until every rank returned; the first rank that fails ends the job."""
        from seekrl.observe.progress import Progress

        progress = Progress(cfg.train.steps, enabled=cfg.log.progress, fields=("kl", "entropy"))
        progress.start()
        pending, result = list(self.train_refs), run_dir
        try:
            while pending:
                done, pending = self.ray.wait(pending, num_returns=1, timeout=POLL_S)
                for ref in done:
                    rank = self.train_refs[ref]
                    try:
                        out = self.ray.get(ref, timeout=cfg.cluster.timeout_s)
                    except Exception as e:  # noqa: BLE001 -- every failure of a rank ends the job the same way
                        message, status = failure(e)
                        raise LaunchError(f"trainer rank {rank} failed: {message}", status) from None
                    if rank == 0:
                        result = Path(out)
                for row in tail.rows():
                    progress.update(row["step"], row, step_time=row.get("time/step_s"))
        finally:
            progress.close()
        return result

    def _get(self, ref, what: str, timeout_s: float):
        try:
            return self.ray.get(ref, timeout=timeout_s)
        except self.ray.exceptions.GetTimeoutError:
            raise LaunchError(f"{what} did not start within cluster.timeout_s={timeout_s:g} s") from None
        except Exception as e:  # noqa: BLE001
            message, status = failure(e)
            raise LaunchError(f"{what} failed: {message}", status) from None

    def teardown(self) -> None:
        """Servers stopped, actors killed, placement groups removed, Ray shut down; a second
        Ctrl-C or SIGTERM does not cut it short (each step is bounded)."""
        ray = self.ray
        signals = (signal.SIGINT, signal.SIGTERM) if _main_thread() else ()
        old = {s: signal.signal(s, signal.SIG_IGN) for s in signals}
        try:
            if ray.is_initialized():
                stops = [e.stop.remote() for e in self.engines]  # after a start still running: killed below
                with contextlib.suppress(Exception):
                    if stops:
                        ray.wait(stops, num_returns=len(stops), timeout=STOP_S)
                for a in [*self.ranks, *self.engines]:
                    with contextlib.suppress(Exception):
                        ray.kill(a, no_restart=True)
                from ray.util import remove_placement_group

                for pg in self.groups:
                    with contextlib.suppress(Exception):
                        remove_placement_group(pg)
            ray.shutdown()
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _bundle(cpus: float, gpus: float) -> dict[str, float]:
    return {k: v for k, v in (("CPU", cpus), ("GPU", gpus)) if v > 0}


def rank_env(rank: int, world: int, per_node: int, master: tuple[str, int], node_gpus: list[list[str]]) -> dict[str, str]:
    """torchrun's variables for `rank`; `node_gpus`: the GPU ids Ray gave each rank of its node, in
    local-rank order. When each has one GPU of its own, every rank of the node sees them all, so
    that `cuda:LOCAL_RANK` is the rank's own GPU, as under torchrun."""
    env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank % per_node),
           "LOCAL_WORLD_SIZE": str(per_node), "MASTER_ADDR": master[0], "MASTER_PORT": str(master[1])}
    ids = [g[0] for g in node_gpus if len(g) == 1]
    if len(ids) == len(node_gpus) and len(set(ids)) == len(ids) and ids:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(ids)
    return env


def failure(e: BaseException) -> tuple[str, int]:
    """One line for what ended an actor's call, and the exit status (2 for bad input, as the CLI)."""
    from ray.exceptions import RayActorError, RayTaskError


    if isinstance(e, RayTaskError):
        cause = getattr(e, "cause", None) or e
        first = next((ln.strip() for ln in str(cause).splitlines() if ln.strip()), "")
        status = cause.exit_status if isinstance(cause, SeekrlError) else 1
        return f"{type(cause).__name__}: {first}" if first else type(cause).__name__, status
    if isinstance(e, RayActorError):
        first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "")
        return f"its process died ({first})", 1
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", 1


class MetricsTail:
    """The steps rank 0 logs to metrics.jsonl, as they are appended. Rows that were there before
    the launch (a resumed run's file, which it rewrites to drop the steps after its checkpoint)
    are not shown again."""

    def __init__(self, path: Path):
        self.path, self.offset, self.inode = path, 0, None
        self.old: set[int] = set()
        with contextlib.suppress(FileNotFoundError):
            self.old = {hash(line) for line in path.read_bytes().splitlines()}

    def rows(self) -> list[dict]:
        """The complete new rows with a step >= 1 appended since the last call."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return []
        if st.st_ino != self.inode or st.st_size < self.offset:  # new, or rewritten by a resume
            self.offset, self.inode = 0, st.st_ino
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a half-written last line waits for the next look
        self.offset += end
        rows = []
        for line in data[:end].splitlines():
            if hash(line) in self.old:
                continue
            with contextlib.suppress(json.JSONDecodeError):
                row = json.loads(line)
                if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] >= 1:
                    rows.append(row)
        return rows
