"""Names the dead-code check (vulture, run by tests/run.sh) cannot see used: each is used by name from outside
Python's call graph. Read by vulture only, never imported. A name added here needs its reason."""
# ruff: noqa

# Typer calls the app callback itself (`cpuperf --version`).
_root

# Record fields: filled from JSON (measurement files, snapshots, compat data) and written back by asdict().
gemm_fp16_gflops  # decide.records.Measurements
compile_seconds
step_seconds
compile_speedup
announced  # knowledge.matrix.EolNotice (compat/eol.toml rows)
end_of_support
slurm_job_id  # probe.facts.Limits
slurm_cpus_on_node
slurm_ntasks
slurm_nnodes
memory_total_bytes  # plan.saved.HostIdentity (a TypedDict: read by key, host["memory_total_bytes"])
min_torch  # decide.arm_levers.ArmLeverRow (compat/tuning.toml [[arm_lever]] keys, read with row.get)
changes_math
why_not_training
needs_isa
busy_s  # train.observed.WindowFigures (a TypedDict: its keys are read by name, first.get("busy_s"))
pressure_some_s
pressure_file

# The launcher's local size: part of train.dist_env.RankInfo's value (tests compare whole RankInfos).
local_world_size

# knowledge.matrix's exact-version specifier takes packaging's SpecifierSet.contains(version, prereleases=...).
prereleases

# torch's oneDNN setting, assigned for its effect (train/bench.py, train/loop.py).
_.fp32_precision

# Called by frameworks with these names: pytest fixtures and hooks, http.server, transformers' TrainerCallback.
_clean_env
foreign_busy_process
pytest_runtest_makereport
pytest_terminal_summary
pytest_addoption  # tests/conftest.py: the tiers (tests/tiers.py)
pytest_configure
pytest_collection_modifyitems
pytest_runtest_protocol
pytest_runtest_logreport
_.longrepr  # a report's failure text, set by the tier guard
pytestmark  # a test module's markers (the full tier), read by pytest
_.log_message
_.daemon_threads
_.on_step_end
control

# compat/variables.toml's flags: read by name through Variables.names(several_ranks=True, ...) (getattr).
several_ranks
meet
binds_ranks
script_switch

# Lightning calls a LightningModule's and a Callback's hooks by name (benchmarks/scripts/lightning_lm.py,
# tests/fixtures/scripts/lightning_loop.py).
training_step
configure_optimizers
on_train_batch_end
batch_idx

# tokenizers and transformers read these attributes, set by benchmarks/scripts/clm_trainer.py.
pre_tokenizer
bos_token_id
