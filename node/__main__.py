"""``python -m node`` is ``swarm-node``."""

import sys

from node.cli import main

sys.exit(main())
