#!/usr/bin/env python3
"""Convert an image folder or list file (or an LMDB / TFRecord dataset) to TFRecord shards in
TensorFlow's ImageNet layout, with .idx index files."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from fastload.convert import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main("tfrecord", description=__doc__))
