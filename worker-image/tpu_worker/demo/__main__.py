"""``python -m tpu_worker.demo [flags]`` is ``tpu-worker demo [flags]``."""

import sys

from tpu_worker.cli import main

sys.exit(main(["demo", *sys.argv[1:]]))
