"""``python -m fastload``: the ``fastload`` command, where the venv's scripts are not on PATH."""

import sys

from .cli import main

sys.exit(main())
