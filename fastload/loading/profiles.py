"""Tuned configurations saved per machine and dataset (``fastload tune --save-profile``)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Sized
from typing import Any

import torch

from ..datasets.protocols import Summarized
from ..system import available_cpus, cpu_model, cpus_per_rank, local_world_size

APPLIED = ("num_workers", "backend", "prefetch_factor")  # what num_workers="auto" takes from a profile


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fastload", "profiles")


def machine_key() -> dict:
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu_model(), "cpus": available_cpus(), "gpu": gpu}


def dataset_key(dataset: Any) -> dict:
    summary = dataset.summary() if isinstance(dataset, Summarized) else {"type": type(dataset).__name__}
    where = summary.get("root") or summary.get("path") or summary.get("paths")
    if isinstance(where, str):
        where = os.path.abspath(where)
    elif isinstance(where, (list, tuple)) and all(isinstance(p, str) for p in where):
        where = [os.path.abspath(p) for p in where]  # TFRecord files: one key for every spelling
    return {
        "type": summary.get("type"),
        "samples": len(dataset) if isinstance(dataset, Sized) else None,
        "where": where,
    }


def _named(where: Any) -> str:
    """The path ``fastload tune PATH`` would open ``where`` (the dataset's location, or its
    files) from: the path itself, the one file, or the folder holding exactly the files."""
    if isinstance(where, str):
        return where
    if isinstance(where, list) and len(where) == 1:
        return where[0]
    if isinstance(where, list) and where and len({os.path.dirname(p) for p in where}) == 1:
        folder = os.path.dirname(where[0])
        try:
            from ..datasets.tfrecord import expand_paths

            if [os.path.abspath(p) for p in expand_paths(folder)] == where:
                return folder
        except (OSError, ValueError):
            pass
    return "DATASET"


def profile_path(dataset: Any) -> str:
    key = json.dumps({"machine": machine_key(), "dataset": dataset_key(dataset)}, sort_keys=True)
    return os.path.join(cache_dir(), hashlib.sha256(key.encode()).hexdigest()[:16] + ".json")


def save(dataset: Any, config: dict, result: dict) -> str:
    """Stores the chosen config (LoaderConfig fields) for this machine and dataset; returns the path."""
    path = profile_path(dataset)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(
            {
                "machine": machine_key(),
                "dataset": dataset_key(dataset),
                "config": config,
                "tuned_for": {"local_world_size": local_world_size(), "cpus": available_cpus()},
                "result": result,
            },
            f,
            indent=2,
        )
    os.replace(tmp, path)
    return path


def forget(dataset: Any) -> str | None:
    """Removes the saved profile for this machine and dataset; returns its path, or None if there was none."""
    path = profile_path(dataset)
    try:
        os.remove(path)
    except FileNotFoundError:
        return None
    return path


def forget_hint(dataset: Any) -> str:
    """How to remove the profile of ``dataset`` (for messages)."""
    return f"`fastload tune {_named(dataset_key(dataset)['where'])} --forget` removes it (or delete the file)"


def lookup(dataset: Any, announce: bool = True) -> dict | None:
    """The saved profile for this machine and dataset, or None."""
    path = profile_path(dataset)
    try:
        with open(path) as f:
            profile = json.load(f)
    except (OSError, ValueError):
        return None
    profile["path"] = path
    if announce:
        settings = ", ".join(f"{k}={v!r}" for k, v in settings_for_rank(profile).items())
        print(
            f"fastload: num_workers='auto' uses tuned profile {path} ({settings}); {forget_hint(dataset)}",
            file=sys.stderr,
        )
    return profile


def settings_for_rank(profile: dict, ranks: int | None = None) -> dict[str, Any]:
    """The profile's worker settings for one of ``ranks`` processes sharing this machine.

    A profile tuned by one process with 16 workers gives each of 8 local ranks 2: the
    machine's CPUs are what was tuned, not a per-process count.
    """
    ranks = local_world_size() if ranks is None else ranks
    tuned_ranks = int(profile.get("tuned_for", {}).get("local_world_size", 1))
    config = profile["config"]
    settings = {k: config[k] for k in APPLIED if k in config}
    if "num_workers" in settings:
        total = int(settings["num_workers"]) * tuned_ranks
        settings["num_workers"] = max(1 if total else 0, total // ranks)
    return settings


def resolve_auto(cfg: Any, explicit: dict, samples: Any) -> tuple[Any, dict | None]:
    """``cfg`` with ``num_workers="auto"`` resolved, and the profile behind it (or None): the
    tuned profile of this machine and ``samples`` (its workers per local rank; its backend and
    prefetch where not in ``explicit``), else the CPUs available per local rank."""
    if cfg.num_workers != "auto":
        return cfg, None
    profile = lookup(samples)
    if profile is None:
        return cfg.replace(num_workers=cpus_per_rank()), None
    tuned = {k: v for k, v in settings_for_rank(profile).items() if k == "num_workers" or k not in explicit}
    return cfg.replace(**tuned), profile
