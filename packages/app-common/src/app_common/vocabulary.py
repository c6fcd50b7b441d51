"""The apps' one vocabulary of flags: what each flag means in every app, and the spellings no app may use.

A leaf module (it imports nothing of ``app_common``): [`config`][app_common.config] reads the meaning of
``--config`` here, and [`fields`][app_common.fields] the meanings of the field groups' flags.
"""

#: Flag (field name) -> what it means in every app. ``--help`` shows these texts.
FLAGS: dict[str, str] = {
    "device": "auto (CUDA when there is one), cpu, cuda or cuda:<index>",
    "dtype": "precision of the matrix products (autocast); parameters stay float32",
    "threads": "CPU threads of torch (0: torch's default)",
    "seed": "seed of the initialization, the random features and the data order",
    "config": "TOML file whose keys are the flags' names with underscores (flags given win)",
    "out": "folder holding runs/<name>/ (checkpoint, log, record of each run) and the results file",
    "resume": "continue from the run's checkpoint if there is one (refused if its identity settings "
    "differ); --no-resume starts over",
    "steps": "optimizer steps (the schedule ends there)",
    "lr": "peak learning rate",
    "grad_clip": "clip the gradient norm to this value (0: no clipping)",
    "eval_every": "steps between evaluations",
    "log_every": "steps between training-loss log lines",
    "layer": "MLP replacement kind (ralimp.create): ralimp, eugen, snnk, lowrank or dense",
    "features": "random features of each replacement layer (ralimp.create's budget, exactly)",
    "weight_matrix": "rf_matrices name of the replacement layers' random projections",
    "fit": "how a ralimp layer fits its activation (ralimp.fits): variance (bias^2 + the estimator's exact "
    "variance on the calibration sample; it may keep fewer atoms), discretized (least squares in the "
    "layer's basis) or paper (the paper's: the continuous rational fit, node k weighted by gamma_k)",
    "num_atoms": "J, the atoms of a ralimp layer's rational fit (fit=variance keeps the best 0..J)",
    "last_k": "replace the MLPs of the last k blocks",
    "attention": "attention: any name of rf_attention.names()",
    "attention_features": "random features of the attention (rows of its weight matrix)",
    "eval_batches": "batches of each evaluation",
    "warmup_steps": "linear warm-up steps of the learning rate",
    "checkpoint_every": "steps between checkpoints besides those after evaluations and the last step "
    "(0: none)",
    "results": "JSON-lines file the run's record is appended to",
    "weights": "pretrained weights to start from",
    "report_dir": "folder the report (tables, plots) is written to (default: report/ beside the results "
    "file)",
    "init": "start of the replaced MLPs: psi (the paper's Psi(W)), lstsq (readout fitted to the dense MLP on "
    "a calibration batch), auto (lstsq when the MLPs are pretrained, psi otherwise)",
    "weight_decay": "AdamW weight decay of the matrices (app_common.schedules.param_groups: none on vectors, "
    "embeddings or RaLiMP's coefficients)",
    "dropout": "dropout rate of the model's blocks",
    "workers": "DataLoader worker processes",
    "shard": "i/n: run the i-th of n interleaved parts of the grid (cells i, i + n, ...)",
    "isolation": "each cell of the grid in its own process (process) or one after another in this one "
    "(in-process)",
}

#: Other spellings of vocabulary flags, which no app may use: alias -> the vocabulary's flag.
ALIASES: dict[str, str] = {
    "--layers": "--layer",
    "--ks": "--last-k",
    "--eval-steps": "--eval-batches",
    "--eval-examples": "--eval-batches",
    "--warmup": "--warmup-steps",
    "--init-from": "--weights",
    "--pretrained": "--weights",
    "--save-every": "--checkpoint-every",
    "--results-file": "--results",
    "--learning-rate": "--lr",
    "--max-steps": "--steps",
    "--runs": "--out",
    "--clip": "--grad-clip",
}
