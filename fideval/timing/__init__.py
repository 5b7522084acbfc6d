"""Where a run's time goes, below every stage that spends it (model, store, score):

* :mod:`.timeline` -- a run's time cut into named parts that add up to the whole (CUDA events on a GPU);
* :mod:`.accounting` -- those parts into a wall they sum to; tokens/s and MFU against the GPU's peak.
"""
