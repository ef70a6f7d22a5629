"""Baselines of TAG §5 (DP-NCCL, DP-NCCL-P, Horovod, single device, METIS model parallelism), compiled and
simulated like any strategy."""

from tag.baselines.baselines import (
    BASELINES,
    BaselineResult,
    baselines_table,
    dp_nccl,
    dp_nccl_p,
    horovod,
    metis_mp,
    run_baselines,
    single_device,
)

__all__ = ["run_baselines", "BaselineResult", "BASELINES", "baselines_table", "dp_nccl", "dp_nccl_p", "horovod",
           "single_device", "metis_mp"]
