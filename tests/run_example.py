"""Runs an example script as ``python EXAMPLE ARGS...`` would, for tests/test_examples.py.

torchvision is installed in the test environment without its compiled ops (tests/refs.py),
and Lightning (through torchmetrics) imports it: the stub that makes that import work is
installed first. Usage: ``python tests/run_example.py EXAMPLE [ARGS...]`` (also under torchrun).
"""

import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from refs import stub_meta_registrations  # noqa: E402

if __name__ == "__main__":
    stub_meta_registrations()
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")
