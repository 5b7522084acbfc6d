"""report.json, per-sequence summaries, plots and the model card built from per-token records."""
