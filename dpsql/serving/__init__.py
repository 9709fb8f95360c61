"""``dpsql serve``: the engine behind an HTTP boundary, with tokens, roles, limits and a console,
and behind the PostgreSQL protocol.

Modules: ``tokens`` (access tokens stored as hashes beside the ledger), ``problems`` (RFC 9457
errors), ``limits`` (body size, SQL length, rate, timeout), ``runner`` (engine calls off the event
loop, with a timeout), ``service`` (what both front doors share), ``app`` (the FastAPI
application), ``access_log``, ``client`` (the remote connection); the PostgreSQL port:
``pgwire`` (the protocol's messages), ``pgstatements`` (what a statement is), ``pgcatalog`` (the
catalogue from the public schema), ``pgsession`` (SET/SHOW), ``pgreplies`` (result sets,
notices, SQLSTATEs), ``pgserver`` (the connections). Importing this package loads none of them,
so ``import dpsql`` stays light.
"""
