from __future__ import annotations

import dpsql
import dpsql.errors


def test_public_surface_is_sorted_and_importable() -> None:
    assert dpsql.__all__ == sorted(dpsql.__all__)
    for name in dpsql.__all__:
        assert getattr(dpsql, name) is not None


def test_every_error_is_exported_and_rooted() -> None:
    for name in dpsql.errors.__all__:
        error = getattr(dpsql.errors, name)
        assert name in dpsql.__all__
        assert issubclass(error, dpsql.DpsqlError)
    assert issubclass(dpsql.ParameterError, ValueError)
