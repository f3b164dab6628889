"""The ``swarm-node`` command: parsing (generated from the config dataclasses), config files, and each command.

Top of the node's layers: nothing below imports from here.
"""

from node.cli.main import main

__all__ = ["main"]
