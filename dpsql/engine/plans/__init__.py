"""One module per mechanism family: its privacy map beside its read and release.

- ``base``: what every family shares (measurements, key literals) and the ``Family`` protocol,
  whose defaults describe discrete-Laplace measurements over public groups;
- ``laplace``: discrete Laplace on each aggregate over public keys (the default);
- ``auto_bounds``: SUM/AVG without declared bounds (AboveThreshold picks the bound first);
- ``keys``: GROUP BY over a column without public keys (thresholds, weighted selection, MAD2R,
  the combined threshold + ALP synopsis);
- ``ranges``: range JOINs with HAVING (the sparse vector technique);
- ``quantiles``: MEDIAN and quantiles (permute-and-flip).

``dpsql.engine.planner.plan_query`` is the one place that picks a family; a plan's views
(mechanism, reason, event, measures, summary, errors) and its release all go through it.
"""
