"""``dpsql serve``: the engine behind an HTTP boundary, with tokens, roles, limits and a console.

Modules: ``tokens`` (access tokens stored as hashes beside the ledger), ``problems`` (RFC 9457
errors), ``limits`` (body size, SQL length, rate, timeout), ``runner`` (engine calls off the event
loop, with a timeout), ``app`` (the FastAPI application), ``client`` (the remote connection).
Importing this package loads none of them, so ``import dpsql`` stays light.
"""
