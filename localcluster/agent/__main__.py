"""``python -m localcluster.agent``: run the node agent (normally started by the launcher)."""

import sys

from localcluster.agent.app import main

sys.exit(main())
