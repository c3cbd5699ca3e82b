"""xconf's fault-tolerant variants of hydra-submitit-launcher.

``hydra/launcher=xconf_submitit_slurm`` and ``xconf_submitit_local`` behave like
``submitit_slurm``/``submitit_local`` (same settings, same submission), except that a job
that dies without a result comes back as a FAILED JobReturn instead of aborting the whole
batch: a failed case, not a crashed sweep.
"""

__version__ = "0.1.0"
