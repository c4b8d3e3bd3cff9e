"""``python -m tpu_operator``: the same as the ``tpu-operator`` command."""

import sys

from tpu_operator.cli import main

sys.exit(main())
