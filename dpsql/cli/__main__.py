"""``python -m dpsql.cli``: the same as the ``dpsql`` command."""

from __future__ import annotations

from dpsql.cli.root import run

run()
