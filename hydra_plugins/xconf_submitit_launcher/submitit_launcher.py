"""Submitit launchers whose dead jobs become FAILED JobReturns and whose jobs a Ctrl-C cancels.

These subclass hydra-submitit-launcher and keep its ``launch()``: submission, executor
parameters and job records are upstream's. Upstream gathers results with
``[j.results()[0] for j in jobs]``, so one job that died before writing its result (cancelled,
node lost) raises out of ``launch()`` and every other job's return is lost. The one hook is
the executor class, swapped for the duration of ``launch()``: its jobs gather each result on
its own, and a stop signal while waiting cancels every job the launch submitted.

Hydra lists every concrete launcher class it finds in a plugin module's namespace
(``--info plugins``), imported ones included: so the upstream classes are reached through
their module, and the shared behaviour is a mixin that is not a Launcher.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra_plugins.hydra_submitit_launcher import submitit_launcher as upstream

from hydra_plugins.xconf_submitit_launcher.config import XconfLocalQueueConf, XconfSlurmQueueConf

log = logging.getLogger(__name__)

__all__ = ["XconfLocalLauncher", "XconfLocalQueueConf", "XconfSlurmLauncher", "XconfSlurmQueueConf"]

# xconf's own launcher keys (node shape): not submitit parameters, kept out of upstream's params.
NODE_KEYS = ("node_cpus", "node_gpus", "node_count", "max_tasks_per_node")


def failed_return(job: Any, overrides: Sequence[str], detail: str) -> JobReturn:
    from xconf.launchers.errors import LaunchError

    state = getattr(job, "state", "UNKNOWN")
    error = LaunchError(
        "launch.submitit.job_failed",
        f"job {job.job_id} ended {state} without a result: {detail}",
        "hydra.launcher",
    )
    log.error("job %s (%s) failed: %s", job.job_id, " ".join(overrides), state)
    return JobReturn(overrides=list(overrides), status=JobStatus.FAILED, _return_value=error)


def _last_words(job: Any, exc: Exception) -> str:
    """Why the job died: the last line of its stderr that is not srun's (e.g. the stop signal
    it received), else submitit's message."""
    with contextlib.suppress(Exception):
        lines = [ln.strip() for ln in (job.stderr() or "").splitlines() if ln.strip()]
        own = [ln for ln in lines if not ln.startswith("srun:")]
        if own:
            return own[-1][-300:]
    return str(exc).splitlines()[0]


class _GatheredJob:
    """A submitted job whose ``results()`` never raises for a job that died without one."""

    def __init__(self, job: Any, overrides: Sequence[str]) -> None:
        self._job = job
        self._overrides = overrides

    def results(self) -> list[JobReturn]:
        from submitit.core.utils import UncompletedJobError

        try:
            return list(self._job.results())
        except UncompletedJobError as exc:
            return [failed_return(self._job, self._overrides, _last_words(self._job, exc))]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._job, name)


def _cancel(jobs: Sequence[Any]) -> None:
    for job in jobs:
        with contextlib.suppress(Exception):
            job.cancel(check=False)
    log.warning("stop requested: cancelled %d submitted job(s)", len(jobs))


@contextlib.contextmanager
def _gathering_executor() -> Iterator[list[Any]]:
    """Within: ``submitit.AutoExecutor`` hands out gathered jobs; yields what was submitted."""
    import submitit

    submitted: list[Any] = []
    upstream = submitit.AutoExecutor

    class GatheringExecutor(upstream):  # type: ignore[misc, valid-type]
        def map_array(self, fn: Any, *iterable: Any) -> list[Any]:
            jobs = super().map_array(fn, *iterable)
            submitted.extend(jobs)
            overrides = iterable[0] if iterable else [[] for _ in jobs]
            return [_GatheredJob(j, o) for j, o in zip(jobs, overrides, strict=True)]

    submitit.AutoExecutor = GatheringExecutor  # type: ignore[misc]
    try:
        yield submitted
    finally:
        submitit.AutoExecutor = upstream  # type: ignore[misc]


class _XconfSubmitit:
    """Mixin (not a Launcher itself, so Hydra's plugin listing shows only the two below)."""

    def __init__(self, **params: Any) -> None:
        self.node_declared = {k: params.pop(k, None) for k in NODE_KEYS}
        super().__init__(**params)  # type: ignore[call-arg]

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        from xconf.interrupts import Interrupted

        with _gathering_executor() as submitted:
            try:
                launched: Sequence[JobReturn] = super().launch(  # type: ignore[misc]
                    job_overrides, initial_job_idx
                )
                return launched
            except Interrupted:
                # Ctrl-C / SIGTERM while waiting: no job of this sweep may keep running.
                _cancel(submitted)
                raise


class XconfSlurmLauncher(_XconfSubmitit, upstream.SlurmLauncher):
    _EXECUTOR = "slurm"

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        extra = dict(self.params.get("additional_parameters") or {})
        if not {"requeue", "no_requeue", "no-requeue"} & set(extra):
            # A case whose node was lost is a failed case, resumed by the next run; Slurm's
            # default requeue would leave the sweep waiting on a node that may never return.
            extra["no_requeue"] = True
        self.params["additional_parameters"] = extra


class XconfLocalLauncher(_XconfSubmitit, upstream.LocalLauncher):
    _EXECUTOR = "local"
