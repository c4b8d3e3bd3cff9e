"""``python -m localcluster``: the launcher's command line (see :mod:`localcluster.cli`)."""

import sys

from localcluster.cli import main

sys.exit(main())
