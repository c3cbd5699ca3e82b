"""Each rank all-reduces ``value``; rank 0 writes result.json and returns the sum.

``die=true`` makes the task exit without a result, as a crashed case would.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import hydra
from omegaconf import DictConfig


@hydra.main(version_base=None, config_path="conf", config_name="slurm_app")
def main(cfg: DictConfig) -> float | None:
    import torch
    import torch.distributed as dist
    from hydra.core.hydra_config import HydraConfig

    from xconf.launchers.slurm_rank import destroy_slurm_rank, init_slurm_rank

    if cfg.die:
        os._exit(1)
    me = init_slurm_rank(timeout_s=60)
    total = torch.tensor([float(cfg.value)])
    dist.all_reduce(total)
    destroy_slurm_rank()
    if not me.publishes:
        return None
    out = Path(HydraConfig.get().runtime.output_dir) / "result.json"
    record = {"world": me.world_size, "sum": total.item(), "job_id": me.job_id}
    out.write_text(json.dumps(record))
    return total.item()


if __name__ == "__main__":
    main()
