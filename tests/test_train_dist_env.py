"""rank_info(): each launcher's variables map to the same RankInfo."""

from __future__ import annotations

import pytest

from cpuperf.train.dist_env import LaunchEnvError, RankInfo, rank_info


def test_no_launcher_is_none() -> None:
    assert rank_info({}) is None
    assert rank_info({"PATH": "/usr/bin", "SLURM_JOB_ID": "7"}) is None


def test_torchrun() -> None:
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "node0", "MASTER_PORT": "29400"}
    assert rank_info(env) == RankInfo(rank=3, world_size=8, local_rank=1, local_world_size=2,
                                      master_addr="node0", master_port=29400, launcher="torchrun")


def test_openmpi_single_node_defaults_master() -> None:
    env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4",
           "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
    info = rank_info(env)
    assert info == RankInfo(1, 4, 1, 4, "127.0.0.1", 29500, "openmpi")
    assert info.torch_env() == {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
                                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def test_intel_mpi_mpich() -> None:
    env = {"PMI_RANK": "5", "PMI_SIZE": "6", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "3",
           "MASTER_ADDR": "10.0.0.1"}
    assert rank_info(env) == RankInfo(5, 6, 2, 3, "10.0.0.1", 29500, "mpich")


def test_multi_node_without_master_addr_leaves_it_unset() -> None:
    env = {"PMI_RANK": "5", "PMI_SIZE": "6", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "3"}
    info = rank_info(env)
    assert info is not None and info.master_addr is None
    assert "MASTER_ADDR" not in info.torch_env()


def test_slurm_inside_a_step_only() -> None:
    env = {"SLURM_PROCID": "2", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0",
           "SLURM_NTASKS_PER_NODE": "2(x2)", "MASTER_ADDR": "n1"}
    # The sbatch script's own shell: no job step yet, so not a rank.
    assert rank_info(env) is None
    info = rank_info({**env, "SLURM_STEP_ID": "0"})
    assert info == RankInfo(2, 4, 0, 2, "n1", 29500, "slurm")


def test_torchrun_wins_over_outer_launchers() -> None:
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
           "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_STEP_ID": "0",
           "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"}
    info = rank_info(env)
    assert info is not None and (info.launcher, info.rank, info.world_size) == ("torchrun", 1, 2)


@pytest.mark.parametrize("env, fragment", [
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not an integer"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "not within"),
    ({"PMI_RANK": "0", "PMI_SIZE": "0"}, "not within"),
])
def test_malformed(env, fragment: str) -> None:
    with pytest.raises(LaunchEnvError, match=fragment):
        rank_info(env)
