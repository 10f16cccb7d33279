"""`python tests/slurm_snakemake.py ARGS`: Snakemake with ARGS, its SLURM executor plugin asking squeue every
few seconds (the test cluster's runs, tests/slurm_cluster.py).

The plugin waits `slurm-init-seconds-before-status-checks` (4 s in profiles/slurm-local) before its first status
check, then 10 s more after each check that saw no job finish, up to 180 s: right for a site's scheduler, where
a job takes minutes and squeue is shared, but on the test cluster a job takes seconds, and most of a test's wall
time went on waiting for the next check (checks at 4, 18, 42, 76 s after a submission). No setting of the plugin
(2.8.0) bounds that growth, so this caps the wait between checks at `CAP_S` and otherwise runs Snakemake as
`python -m snakemake` does: the same profile, the same sbatch lines, the same squeue status command."""

from __future__ import annotations

import sys

CAP_S = 2.0


def main() -> None:
    from snakemake_executor_plugin_slurm import Executor
    from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor

    plain = RemoteExecutor.next_seconds_between_status_checks

    def capped(self, value):
        plain.fset(self, None if value is None else min(value, CAP_S))

    Executor.next_seconds_between_status_checks = property(plain.fget, capped)
    from snakemake.cli import main as snakemake

    sys.argv[0] = "snakemake"
    snakemake()


if __name__ == "__main__":
    main()
