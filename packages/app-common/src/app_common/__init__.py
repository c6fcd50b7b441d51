"""Plumbing shared by the spectraformer apps, written once, one submodule per concern.

An app imports each name from the submodule that owns it, so that its import lines say what it uses:

    from app_common.checkpoint import Checkpointer, state_dicts
    from app_common.cli import add_command, app_parser, command_config, run_cli
    from app_common.fields import EvalFields, OptimizerFields, OutputFields, RuntimeFields, option
    from app_common.grid import GridFields, run_grid
    from app_common.harness import TrainData, Trainer
    from app_common.records import finished_record, run_dir
    from app_common.results import append_jsonl, read_jsonl, write_table

The submodules: `batches` (the resumable batch order), `checkpoint` (atomic checkpoints, the resume
policy), `cli` (subcommands from their config class), `config` (frozen dataclass configurations from flags
and TOML), `device` (device and precision), `distributed` (DistributedDataParallel from ``torchrun``'s
environment, the distributed evaluation sums), `fields` (the vocabulary's field groups, run identity),
`grid` (the one grid runner), `harness` (the `Trainer`), `measure` (timers, peak memory, parameter
counts), `process` (child processes that die with their parent), `progress` (tqdm bars), `records` (the
run record and layout), `results` (JSON lines, tables, seed aggregation), `safetensors`, `schedules`
(learning-rate schedules, weight-decay groups), `seeding`, `vocabulary` (the flags), `testing` and `imports`.

The names are also re-exported here, flat, for code written against the package's first layout
(``import app_common as ac``); new code imports from the submodules.
"""

from app_common.batches import StepBatches, stream_seed
from app_common.checkpoint import (
    Checkpointer,
    changed_settings,
    load_checkpoint,
    load_state_dicts,
    rewind_log,
    save_checkpoint,
    state_dicts,
)
from app_common.cli import (
    USER_ERRORS,
    add_command,
    add_list_command,
    add_report_command,
    app_parser,
    command_config,
    plain_text,
    run_cli,
)
from app_common.config import (
    add_config_argument,
    add_dataclass_arguments,
    config_dict,
    config_from,
    flag,
    flat_settings,
    leaf_fields,
    read_config,
    read_toml,
    split_toml,
)
from app_common.device import DEVICES, DTYPES, autocast, device_name, resolve_device, resolve_dtype
from app_common.distributed import (
    Distributed,
    all_gather_object,
    all_reduce,
    barrier,
    evaluation_sums,
    launched_by_torchrun,
    setup_distributed,
    teardown_distributed,
)
from app_common.fields import (
    AttentionFields,
    EvalFields,
    Fields,
    LayerFields,
    OptimizerFields,
    OutputFields,
    RuntimeFields,
    check_int_fields,
    group_settings,
    identity_digest,
    may_change_on_resume,
    option,
    run_identity,
)
from app_common.grid import ISOLATIONS, GridFields, GridOutcome, parse_shard, run_grid
from app_common.harness import CLOSURE_OPTIMIZERS, NAN_POLICIES, TrainData, Trainer, training_stream_seed
from app_common.measure import (
    PeakMemory,
    PeakMemoryMeter,
    Timer,
    count_parameters,
    fix_mmap_threshold,
    interleaved_medians,
    median_seconds,
    peak_memory,
    reset_peak_memory,
)
from app_common.process import Terminated, run_child
from app_common.progress import progress
from app_common.records import (
    CORE_KEYS,
    RESULTS,
    finished_record,
    flat_record,
    make_record,
    report_folder,
    run_dir,
    write_record,
)
from app_common.results import (
    append_jsonl,
    iter_jsonl,
    markdown_table,
    mean_and_std,
    read_jsonl,
    write_csv,
    write_table,
)
from app_common.safetensors import read_safetensors, write_safetensors
from app_common.schedules import NO_DECAY_NAMES, SCHEDULES, Schedule, decays, param_groups, schedule
from app_common.seeding import CALIBRATION_SEED, rng_state, seed_everything, set_rng_state
from app_common.vocabulary import ALIASES, FLAGS
from spectraformer_core import check_int  # the project's one integer validator, for the apps

__all__ = [
    "ALIASES",
    "CALIBRATION_SEED",
    "CLOSURE_OPTIMIZERS",
    "CORE_KEYS",
    "DEVICES",
    "DTYPES",
    "FLAGS",
    "ISOLATIONS",
    "NAN_POLICIES",
    "NO_DECAY_NAMES",
    "RESULTS",
    "SCHEDULES",
    "USER_ERRORS",
    "AttentionFields",
    "Checkpointer",
    "Distributed",
    "EvalFields",
    "Fields",
    "GridFields",
    "GridOutcome",
    "LayerFields",
    "OptimizerFields",
    "OutputFields",
    "PeakMemory",
    "PeakMemoryMeter",
    "RuntimeFields",
    "Schedule",
    "StepBatches",
    "Terminated",
    "Timer",
    "TrainData",
    "Trainer",
    "add_command",
    "add_config_argument",
    "add_dataclass_arguments",
    "add_list_command",
    "add_report_command",
    "all_gather_object",
    "all_reduce",
    "app_parser",
    "append_jsonl",
    "autocast",
    "barrier",
    "changed_settings",
    "check_int",
    "check_int_fields",
    "command_config",
    "config_dict",
    "config_from",
    "count_parameters",
    "decays",
    "device_name",
    "evaluation_sums",
    "finished_record",
    "fix_mmap_threshold",
    "flag",
    "flat_record",
    "flat_settings",
    "group_settings",
    "identity_digest",
    "interleaved_medians",
    "iter_jsonl",
    "launched_by_torchrun",
    "leaf_fields",
    "load_checkpoint",
    "load_state_dicts",
    "make_record",
    "markdown_table",
    "may_change_on_resume",
    "mean_and_std",
    "median_seconds",
    "option",
    "param_groups",
    "parse_shard",
    "peak_memory",
    "plain_text",
    "progress",
    "read_config",
    "read_jsonl",
    "read_safetensors",
    "read_toml",
    "report_folder",
    "reset_peak_memory",
    "resolve_device",
    "resolve_dtype",
    "rewind_log",
    "rng_state",
    "run_child",
    "run_cli",
    "run_dir",
    "run_grid",
    "run_identity",
    "save_checkpoint",
    "schedule",
    "seed_everything",
    "set_rng_state",
    "setup_distributed",
    "split_toml",
    "state_dicts",
    "stream_seed",
    "teardown_distributed",
    "training_stream_seed",
    "write_csv",
    "write_record",
    "write_safetensors",
    "write_table",
]
