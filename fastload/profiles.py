"""Tuned configurations saved per machine and dataset (``fastload tune --save-profile``)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Any

import torch

from .system import available_cpus, cpu_model


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fastload", "profiles")


def machine_key() -> dict:
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu_model(), "cpus": available_cpus(), "gpu": gpu}


def dataset_key(dataset: Any) -> dict:
    summary = dataset.summary() if hasattr(dataset, "summary") else {"type": type(dataset).__name__}
    where = summary.get("root") or summary.get("path") or summary.get("paths")
    return {"type": summary.get("type"), "samples": len(dataset) if hasattr(dataset, "__len__") else None,
            "where": os.path.abspath(where) if isinstance(where, str) else where}


def profile_path(dataset: Any) -> str:
    key = json.dumps({"machine": machine_key(), "dataset": dataset_key(dataset)}, sort_keys=True)
    return os.path.join(cache_dir(), hashlib.sha256(key.encode()).hexdigest()[:16] + ".json")


def save(dataset: Any, config: dict, result: dict) -> str:
    """Stores the chosen config (LoaderConfig fields) for this machine and dataset; returns the path."""
    path = profile_path(dataset)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"machine": machine_key(), "dataset": dataset_key(dataset), "config": config,
                   "result": result}, f, indent=2)
    os.replace(tmp, path)
    return path


def lookup(dataset: Any, announce: bool = True) -> dict | None:
    """The saved profile for this machine and dataset, or None."""
    path = profile_path(dataset)
    try:
        with open(path) as f:
            profile = json.load(f)
    except (OSError, ValueError):
        return None
    if announce:
        print(f"fastload: num_workers='auto' uses tuned profile {path} "
              f"(num_workers={profile['config'].get('num_workers')})", file=sys.stderr)
    profile["path"] = path
    return profile
