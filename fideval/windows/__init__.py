"""Evaluation windows: sources -> sampled documents -> packed windows -> cuts, screened for overlap."""
