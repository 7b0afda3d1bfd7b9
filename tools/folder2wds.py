#!/usr/bin/env python3
"""Convert an image folder or list file (or an LMDB / TFRecord / WebDataset dataset) to WebDataset tar
shards (key.jpg + key.cls), with a sidecar of class names."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from fastload.convert import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main("wds", description=__doc__))
