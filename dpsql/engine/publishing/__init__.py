"""Published releases: a user×item table under local DP, stored in the database and queried free.

``publish_rr`` encodes every person's item set of a table with compressed randomized response
(:mod:`dpsql.mechanisms.compressed_rr`; Hillebrand, Suppakitpaisarn, Shibuya, Algorithms 1-3 and
Theorem 1; Section 2.4 for the chunked encoding) and stores the release (public
parameters + one message per person) in the DuckDB file, as ``dpsql_rr_releases`` (one row per
release) and ``dpsql_rr_<name>`` (``user_id``, ``message``). The queries on a stored release
(:func:`release_popularity`, :func:`release_common_items`, :func:`release_decode`) read only the
release, so they are post-processing: each is recorded as a zero-cost ledger entry naming it.

Privacy decisions (``docs/publish.md`` has the proofs):

* **Public item universe.** Coordinates come from the policy only: the item column's
  ``public_keys`` (index = position in the list) or integer ``bounds = [low, high]`` (index =
  item - low). Nothing about the coordinates is derived from the data; items outside the universe
  and NULL items are dropped. Without a universe the release is refused before any charge.
* **Public cap.** Each person keeps at most ``max_items`` (= D; default: the table's
  ``max_rows_per_unit``) distinct items, a uniformly random subset drawn with the session's
  private generator (a choice that depends on nothing but the person's own items), before
  encoding.
* **Neighbour relation and cost.** The release lists every non-NULL unit of the table, so it
  reveals who is in the table: membership is *not* protected. What is protected is each
  person's item set under the replace-one-person relation (same units, one unit's rows
  changed). Two capped item sets differ in at most ``h = min(2·D, n)`` items, and the message is
  ``ε_item``-DP per item (metric DP under Hamming distance, Theorem 1 with PPR Theorem 4.7), so
  the release is ``h·ε_item``-DP. The caller's ``epsilon`` is that person-level cost; the codec
  runs at ``ε_item = epsilon / h``.
* **Chunks** are computed from public values only (n, ε_item, D, α): ``suggest_chunks`` with the
  public cap D, raised if needed so that even D items in one chunk keep its log-ratio bound
  within :data:`MAX_CHUNK_LOG_RATIO` (the codec's crowded-chunk refusal cannot happen after the
  charge) and δ below :data:`DELTA_TARGET`.
* **δ of the encoder's refusal.** The PPR encoder refuses (``ExecutionError``) when an index
  could pass 2**60. That event depends on the data, so it is charged as δ, bounded from public
  parameters by :func:`overflow_delta`.
* **Order.** Every check above, and the release name, are settled from the policy and catalog;
  then ``Session.charge`` records the cost (or refuses, and nothing is read or written); only then
  is the table read, encoded and written. A failure after the charge leaves the charge standing.
"""

from __future__ import annotations

from dpsql.engine.publishing.plan import (
    DELTA_TARGET,
    FORMAT,
    INDEX_LIMIT_LOG2,
    MAX_CHUNK_LOG_RATIO,
    MAX_DELTA,
    MAX_UNIVERSE,
    MECHANISM,
    POST_PROCESSING,
    RELEASES_TABLE,
    TABLE_PREFIX,
    Item,
    ItemUniverse,
    ReleasePlan,
    UserId,
    overflow_delta,
    plan_release,
)
from dpsql.engine.publishing.publish import (
    publish_rr,
)
from dpsql.engine.publishing.queries import (
    CommonItemsResult,
    DecodedRow,
    PopularityResult,
    release_common_items,
    release_decode,
    release_popularity,
)
from dpsql.engine.publishing.store import (
    PublishedRelease,
    list_releases,
    load_release,
)

__all__ = [
    "DELTA_TARGET",
    "FORMAT",
    "INDEX_LIMIT_LOG2",
    "MAX_CHUNK_LOG_RATIO",
    "MAX_DELTA",
    "MAX_UNIVERSE",
    "MECHANISM",
    "POST_PROCESSING",
    "RELEASES_TABLE",
    "TABLE_PREFIX",
    "CommonItemsResult",
    "DecodedRow",
    "Item",
    "ItemUniverse",
    "PopularityResult",
    "PublishedRelease",
    "ReleasePlan",
    "UserId",
    "list_releases",
    "load_release",
    "overflow_delta",
    "plan_release",
    "publish_rr",
    "release_common_items",
    "release_decode",
    "release_popularity",
]
