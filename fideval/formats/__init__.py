"""File contracts in one light place: the grammars and headers that more than one stage reads.

Importable with the standard library alone (the GPU machine runs the model and score stages without the
workflow stack), so every stage, the workflow and the tests share one definition of each contract.
"""
