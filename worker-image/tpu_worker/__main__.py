"""``python -m tpu_worker`` is ``tpu-worker``."""

import sys

from tpu_worker.cli import main

sys.exit(main())
