"""Kept for imports written before the split: everything lives in ``fastload.datasets.tfrecord``."""

from .tfrecord import *  # noqa: F401,F403
from .tfrecord import __all__  # noqa: F401
