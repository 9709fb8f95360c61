"""The ``dpsql`` command line, thin over the engine: one module per command family.

- ``root``      the ``dpsql`` group with every command added; ``main`` (one-line errors) and ``run``
- ``query``     query, explain, contributions, result: the analyst's SQL
- ``ledger``    policy set|show, budget, synopses, ledger [verify|head]: what was set and spent
- ``streams``   stream open
- ``report``    report plan|run
- ``publish``   publish-rr and rr list|popularity|common|decode (local DP)
- ``serve``     serve, token create|list|revoke, and ``--url/--token`` on the analyst commands
- ``demo``      demo [--serve]
- ``output``    every printer (tables, CSV, JSON) and the console they write to
- ``progress``  the progress bar drawn on stderr while a long job runs
- ``options``   options several commands share (``--db``, ``--format``)

Command modules import ``options``, ``output`` and ``progress``; only ``root`` imports the command
modules. The engine is imported inside the commands that use it.
"""

from __future__ import annotations

from dpsql.cli.root import cli, main, run

__all__ = ["cli", "main", "run"]
