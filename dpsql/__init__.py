"""dpsql: differentially private SQL with a privacy accountant."""
