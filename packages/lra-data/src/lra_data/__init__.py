"""Long Range Arena data: the five tasks from the real files, or generated offline.

Convert the downloaded files once into a memory-mapped cache, then load a split as a dataset of
``(tokens, label)`` and batch it with [`collate`][lra_data.collate]:

    # lra-data prepare --task listops --source lra_release --out data/lra
    import lra_data
    from torch.utils.data import DataLoader

    train = lra_data.load("listops", "train", "data/lra")
    loader = DataLoader(train, batch_size=32, shuffle=True, collate_fn=lra_data.collate)
    tokens, key_padding_mask, labels = next(iter(loader))  # (32, L), (32, L) True = padding, (32,)

With no download, ``lra-data generate --task listops --n 96000 --out data/lra`` writes the same cache
format from [`generate_listops`][lra_data.generate_listops]'s rules (and ``--task pathfinder`` from
[`generate_pathfinder`][lra_data.generate_pathfinder]). Token id 0 is padding in every task and nothing else
(pixel ``v`` is token ``v + 1``).
"""

from lra_data.cache import MANIFEST, CacheWriter, LRADataset, cache_folder, read_manifest
from lra_data.collate import Batch, PairBatch, collate, pad
from lra_data.datasets import GENERATORS, GenerateConfig, PrepareConfig, generate, load, prepare, split_seed
from lra_data.errors import CacheError, DataFormatError
from lra_data.listops import (
    ListOpsConfig,
    evaluate_listops,
    generate_listops,
    generate_tree,
    iter_listops,
    tree_to_string,
    tree_value,
    write_listops_tsv,
)
from lra_data.pathfinder import (
    PathfinderConfig,
    PathfinderSample,
    draw_pathfinder,
    generate_pathfinder,
    iter_pathfinder,
)
from lra_data.readers import (
    PATHFINDER_DIFFICULTIES,
    pathfinder_metadata,
    pathfinder_split_indices,
    read_cifar10,
    read_imdb,
    read_listops_tsv,
    read_pathfinder,
    read_pickle,
    read_retrieval_tsv,
)
from lra_data.tasks import TASK_SPECS, TASKS, ReleaseOptions, Task, task_spec
from lra_data.tokenizers import (
    LISTOPS_VOCAB,
    PAD_ID,
    detokenize_bytes,
    detokenize_listops,
    listops_symbols,
    rgb_to_gray,
    tokenize_bytes,
    tokenize_listops,
    tokenize_pixels,
)

__all__ = [
    "GENERATORS",
    "LISTOPS_VOCAB",
    "MANIFEST",
    "PAD_ID",
    "PATHFINDER_DIFFICULTIES",
    "TASKS",
    "TASK_SPECS",
    "Batch",
    "CacheError",
    "CacheWriter",
    "DataFormatError",
    "GenerateConfig",
    "LRADataset",
    "ListOpsConfig",
    "PairBatch",
    "PathfinderConfig",
    "PathfinderSample",
    "PrepareConfig",
    "ReleaseOptions",
    "Task",
    "cache_folder",
    "collate",
    "detokenize_bytes",
    "detokenize_listops",
    "draw_pathfinder",
    "evaluate_listops",
    "generate",
    "generate_listops",
    "generate_pathfinder",
    "generate_tree",
    "iter_listops",
    "iter_pathfinder",
    "listops_symbols",
    "load",
    "pad",
    "pathfinder_metadata",
    "pathfinder_split_indices",
    "prepare",
    "read_cifar10",
    "read_imdb",
    "read_listops_tsv",
    "read_manifest",
    "read_pathfinder",
    "read_pickle",
    "read_retrieval_tsv",
    "rgb_to_gray",
    "split_seed",
    "task_spec",
    "tokenize_bytes",
    "tokenize_listops",
    "tokenize_pixels",
    "tree_to_string",
    "tree_value",
    "write_listops_tsv",
]
