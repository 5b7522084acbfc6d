"""Statistics of per-token records: cluster BCa bootstrap, Wilson intervals, quantiles (numpy + scipy only)."""
