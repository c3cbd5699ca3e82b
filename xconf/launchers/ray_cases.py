"""The cases of one ``xconf_ray`` launch on the cluster, and the loop that waits on them.

A case goes ``placing`` (its placement group submitted) → ``starting`` (one
:class:`~xconf.launchers.ray_rank.RankActor` per bundle, each saying where it runs) →
``running`` (every rank joined the world and runs the case) → ``done``. A rank that fails or
whose worker dies ends its case at once (its other ranks are killed, never left waiting in a
collective); every case's actors are killed and its group removed when it ends, however it
ends; :meth:`RayLaunch.cancel` does that for every case still live.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus

from xconf.artifacts.safe_io import write_file
from xconf.launchers.errors import LaunchError, LaunchTimeoutError, RankFailedError
from xconf.launchers.ray_cluster import Placement, RaySettings
from xconf.launchers.ray_rank import PROBE_NAME, RankActor, parse
from xconf.launchers.world import WorldRecord

log = logging.getLogger(__name__)

# A torchrun rank inherits the command's environment; a Ray worker has its node's. What changes
# how a case is built or scored goes with every rank: xconf's own settings (model and kernel
# caches) and the engines' (vLLM, Hugging Face, torch). Never a device list: Ray sets that.
FORWARDED_ENV = ("XCONF_", "VLLM_", "HF_", "TRANSFORMERS_", "TOKENIZERS_", "TORCH", "PYTORCH_")
UNFORWARDED_ENV = frozenset({"XCONF_RAY_ADDRESS", "XCONF_REQUIRE_RAY"})
POLL_S = 0.25  # how long one wait blocks: a stop signal is handled within this
DEATH_GRACE_S = 2.0  # after a rank's error, how long to look for a peer's death (the cause)


def forwarded_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of this process's environment every rank gets (:data:`FORWARDED_ENV`)."""
    return {
        k: v for k, v in environ.items() if k.startswith(FORWARDED_ENV) and k not in UNFORWARDED_ENV
    }


@dataclass
class Case:
    """One submitted case and where it stands (``placing`` → ``starting`` → ``running``)."""

    index: int
    job_dir: Path
    world_size: int
    placement: Placement
    job_text: str
    nonce: str
    pg: Any
    state: str = "placing"
    ret: JobReturn | None = None
    actors: list[Any] = field(default_factory=list)
    pending: dict[Any, int] = field(default_factory=dict)  # object ref -> rank
    where: list[dict[str, Any]] = field(default_factory=list)
    answers: dict[int, dict[str, Any]] = field(default_factory=dict)
    started: float = 0.0
    submitted: float = field(default_factory=time.monotonic)


class RayLaunch:
    """One ``launch()`` call: its cases, their actors, and the loop that waits on them."""

    def __init__(self, settings: RaySettings) -> None:
        self.settings = settings
        self.cases: dict[int, Case] = {}

    # -- submission ------------------------------------------------------------------------

    def submit(
        self, index: int, job_dir: Path, world: int, placement: Placement, job_text: str
    ) -> None:
        from ray.util.placement_group import placement_group

        nonce = uuid.uuid4().hex
        # The ranks check this file before anything else: their storage is the launcher's.
        write_file(job_dir / PROBE_NAME, nonce.encode())
        pg = placement_group(list(placement.bundles), strategy=placement.strategy)
        self.cases[index] = Case(index, job_dir, world, placement, job_text, nonce, pg)
        self.cases[index].pending[pg.ready()] = -1
        log.info("case #%d: placement group of %d bundle(s) %s", index, world, placement.strategy)

    def _start_actors(self, case: Case) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        actor_class: Any = ray.remote(RankActor)
        env = forwarded_env(os.environ)
        for rank, bundle in enumerate(case.placement.bundles):
            actor = actor_class.options(
                num_cpus=bundle["CPU"],
                num_gpus=bundle.get("GPU", 0),
                max_restarts=0,
                runtime_env={"env_vars": env},
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    case.pg, placement_group_bundle_index=rank
                ),
            ).remote(rank, str(case.job_dir), case.nonce)
            case.actors.append(actor)
            case.pending[actor.where.remote()] = rank
        case.state = "starting"

    def _start_ranks(self, case: Case) -> None:
        case.where.sort(key=lambda w: int(w["rank"]))
        master = case.where[0]
        settings = json.dumps(asdict(self.settings.world()))
        pid_dir = case.job_dir / ".pids" / case.pg.id.hex()
        pid_dir.mkdir(parents=True, exist_ok=True)
        for rank, actor in enumerate(case.actors):
            env = {
                "RANK": str(rank),
                "WORLD_SIZE": str(case.world_size),
                "LOCAL_RANK": str(self._local_rank(case, rank)),
                "MASTER_ADDR": str(master["ip"]),
                "MASTER_PORT": str(master["port"]),
            }
            ref = actor.run.remote(case.job_text, settings, str(pid_dir), json.dumps(env))
            case.pending[ref] = rank
        case.state, case.started = "running", time.monotonic()

    @staticmethod
    def _local_rank(case: Case, rank: int) -> int:
        """The rank's device index: 0 with a GPU (Ray shows an actor its own GPU only), else
        its place among the case's ranks on its node."""
        if case.placement.gpus_per_rank:
            return 0
        node = case.where[rank]["node_id"]
        return [w["node_id"] for w in case.where[:rank]].count(node)

    # -- progress --------------------------------------------------------------------------

    def wait_all(self, check: Callable[[], None]) -> None:
        import ray

        while any(c.state != "done" for c in self.cases.values()):
            check()
            owner = {ref: c for c in self.cases.values() for ref in c.pending}
            if owner:
                ready, _ = ray.wait(list(owner), num_returns=1, timeout=POLL_S)
                for ref in ready:
                    case = owner[ref]
                    if case.state != "done" and ref in case.pending:
                        self._advance(case, ref)
            else:
                time.sleep(POLL_S)
            self._check_timeouts()

    def _advance(self, case: Case, ref: Any) -> None:
        import ray

        rank = case.pending.pop(ref)
        if case.state == "placing":
            self._start_actors(case)
            return
        try:
            answer = parse(ray.get(ref))
        except ray.exceptions.RayError as exc:
            self._fail(case, self._died(case, rank, exc))
            return
        if case.state == "starting":
            if answer.get("storage_error"):
                self._fail(case, self._storage(answer))
                return
            case.where.append(answer)
            if len(case.where) == case.world_size:
                self._start_ranks(case)
            return
        if not answer.get("ok"):
            self._fail(case, self._cause(case, rank, str(answer.get("error"))))
            return
        case.answers[rank] = answer
        if len(case.answers) == case.world_size:
            value = case.answers[0].get("value")
            self._finish(case, json.loads(value) if value is not None else None, None)

    def _died(self, case: Case, rank: int, exc: Exception) -> RankFailedError:
        where = case.where[rank] if rank < len(case.where) else {}
        text = " ".join(str(exc).split())
        detail = re.search(r"exit detail: (.*?)(?: There are some potential|$)", text)
        reason = detail.group(1) if detail else text[:300]
        place = f"pid {where.get('pid')} on node {where.get('ip')}" if where else "not started"
        return RankFailedError(
            "launch.rank_failed",
            f"rank {rank}'s Ray worker ({place}) died mid-case: {reason}",
            f"rank[{rank}]",
        )

    def _cause(self, case: Case, rank: int, error: str) -> RankFailedError:
        """A rank's error, unless a peer's worker died: then that death is the cause (the
        survivor's error is only the broken collective)."""
        import ray

        others = [r for r, k in case.pending.items() if k != rank]
        if others:
            ready, _ = ray.wait(others, num_returns=len(others), timeout=DEATH_GRACE_S)
            for ref in ready:
                try:
                    ray.get(ref)
                except ray.exceptions.RayError as exc:
                    return self._died(case, case.pending[ref], exc)
        return RankFailedError(
            "launch.rank_failed", f"rank {rank} failed: {error}", f"rank[{rank}]"
        )

    @staticmethod
    def _storage(answer: dict[str, Any]) -> LaunchError:
        return LaunchError(
            "launch.ray.storage_unreachable", str(answer["storage_error"]), "hydra.sweep.dir"
        )

    def _check_timeouts(self) -> None:
        limit = self.settings.job_timeout_s
        for case in self.cases.values():
            if case.state == "running" and time.monotonic() - case.started > limit:
                self._fail(
                    case,
                    LaunchTimeoutError(
                        "launch.timeout",
                        f"world did not finish within {limit}s; its actors were killed",
                        "hydra.launcher.job_timeout_s",
                    ),
                )

    def _fail(self, case: Case, error: LaunchError) -> None:
        log.error("case #%d failed: %s", case.index, error)
        self._finish(case, None, error)

    def _finish(self, case: Case, value: Any, error: LaunchError | None) -> None:
        self._release(case)
        case.state = "done"
        self._record(case, error)
        if case.ret is None:
            return
        if error is None:
            case.ret.return_value = value
        else:
            case.ret.status = JobStatus.FAILED
            case.ret.return_value = error

    def _record(self, case: Case, error: LaunchError | None) -> None:
        resolved = self.settings.backend
        if resolved == "auto":
            resolved = "nccl" if case.placement.gpus_per_rank else "gloo"
        record = WorldRecord(
            run_id=case.pg.id.hex(),
            world_size=case.world_size,
            backend=resolved,
            world_shared=False,
            elapsed_s=round(time.monotonic() - (case.started or case.submitted), 3),
            status="failed" if error else "completed",
            error=str(error) if error else None,
        )
        write_file(case.job_dir / "launch.json", _json(asdict(record)))
        placement = {
            "strategy": case.placement.strategy,
            "bundles": list(case.placement.bundles),
            "ranks": sorted(case.where, key=lambda w: int(w["rank"])),
        }
        write_file(case.job_dir / "ray_placement.json", _json(placement))

    # -- release ---------------------------------------------------------------------------

    def _release(self, case: Case) -> None:
        """Kill the case's actors and remove its placement group (idempotent)."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for actor in case.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception as exc:  # already gone
                log.debug("kill: %s", exc)
        try:
            remove_placement_group(case.pg)
        except Exception as exc:
            log.debug("remove placement group: %s", exc)
        case.pending.clear()

    def cancel(self, stopped: bool) -> None:
        """End every live case: ``stopped`` by a signal, else the launch itself failed."""
        live = [c for c in self.cases.values() if c.state != "done"]
        actors = sum(len(c.actors) for c in live)
        for case in live:
            self._release(case)
            case.state = "done"
        if stopped or live:
            log.warning(
                "%s: cancelled %d case(s) on the Ray cluster (%d rank actor(s) killed, "
                "%d placement group(s) removed)",
                "stop requested" if stopped else "launch failed",
                len(live),
                actors,
                len(live),
            )


def _json(data: Any) -> bytes:
    return (json.dumps(data, indent=2, default=str) + "\n").encode()
