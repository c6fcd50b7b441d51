"""Plumbing shared by the spectraformer apps, written once, one submodule per concern.

An app imports each name from the submodule that owns it, so that its import lines say what it uses:

    from app_common.checkpoint import Checkpointer, state_dicts
    from app_common.cli import add_command, app_parser, command_config, run_cli
    from app_common.fields import EvalFields, OptimizerFields, OutputFields, RuntimeFields, option
    from app_common.grid import GridFields, run_grid
    from app_common.harness import TrainData, Trainer
    from app_common.run import Run
    from app_common.records import finished_record, run_dir
    from app_common.results import append_jsonl, read_jsonl, write_table

The submodules: `batches` (the resumable batch order), `checkpoint` (atomic checkpoints, the resume
policy), `cli` (subcommands from their config class), `config` (frozen dataclass configurations from flags
and TOML), `device` (device and precision), `distributed` (DistributedDataParallel from ``torchrun``'s
environment, the distributed evaluation sums), `fields` (the vocabulary's field groups, run identity),
`grid` (the one grid runner), `harness` (the `Trainer`), `measure` (timers, peak memory, parameter
counts), `plots` (pyplot on the Agg backend, saving a figure), `process` (child processes that die with
their parent), `progress` (tqdm bars), `records` (the run record and layout), `results` (JSON lines,
tables, seed aggregation), `run` (the `Run`: what exists before the model), `safetensors`, `schedules`
(learning-rate schedules, weight-decay groups), `seeding`, `vocabulary` (the flags) and `testing` (the
apps' shared test helpers). The package itself holds no names.
"""
