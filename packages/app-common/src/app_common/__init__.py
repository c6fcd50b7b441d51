"""Plumbing shared by the spectraformer apps, written once.

Device and precision (``--device auto|cpu|cuda``, ``--dtype float32|bfloat16``), seeding and random state,
timing, peak memory, JSON-lines results, atomic checkpoints, tqdm progress bars, DistributedDataParallel
set-up from ``torchrun``'s environment, and frozen dataclass configurations read from flags and TOML:

    import app_common as ac

    dist = ac.setup_distributed("auto")             # one process, or the torchrun group
    ac.seed_everything(0)
    state = ac.load_checkpoint("runs/x/checkpoint.pt")
    with ac.Timer(dist.device) as timer:
        for step in ac.progress(range(100), desc="train", disable=not dist.is_main):
            ...
    ac.append_jsonl("results/x.jsonl", {"seconds": timer.elapsed, **vars(ac.peak_memory(dist.device))})
    ac.teardown_distributed()
"""

from app_common.checkpoint import load_checkpoint, save_checkpoint
from app_common.cli import USER_ERRORS, run_cli
from app_common.config import add_dataclass_arguments, config_dict, config_from, flag, read_toml
from app_common.device import DEVICES, DTYPES, autocast, resolve_device, resolve_dtype
from app_common.distributed import (
    Distributed,
    all_gather_object,
    all_reduce,
    barrier,
    launched_by_torchrun,
    setup_distributed,
    teardown_distributed,
)
from app_common.measure import PeakMemory, Timer, peak_memory, reset_peak_memory
from app_common.progress import progress
from app_common.results import append_jsonl, iter_jsonl, read_jsonl
from app_common.safetensors import SAFETENSORS_DTYPES, read_safetensors, write_safetensors
from app_common.seeding import rng_state, seed_everything, set_rng_state

__all__ = [
    "DEVICES",
    "DTYPES",
    "SAFETENSORS_DTYPES",
    "USER_ERRORS",
    "Distributed",
    "PeakMemory",
    "Timer",
    "add_dataclass_arguments",
    "all_gather_object",
    "all_reduce",
    "append_jsonl",
    "autocast",
    "barrier",
    "config_dict",
    "config_from",
    "flag",
    "iter_jsonl",
    "launched_by_torchrun",
    "load_checkpoint",
    "peak_memory",
    "progress",
    "read_jsonl",
    "read_safetensors",
    "read_toml",
    "reset_peak_memory",
    "resolve_device",
    "resolve_dtype",
    "rng_state",
    "run_cli",
    "save_checkpoint",
    "seed_everything",
    "set_rng_state",
    "setup_distributed",
    "teardown_distributed",
    "write_safetensors",
]
