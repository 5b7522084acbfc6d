"""The vendor's own reference implementation as the model (``model.implementation: reference``).

DeepSeek ships its models with ``inference/model.py``: for a new model that code is often the only
implementation on day one, and published teacher logits are comparable only with candidates run in the
same implementation. This package runs the vendor's own modules layer by layer over every position:

* :mod:`.code` finds and imports the vendor's code (a trusted folder), with torch stand-ins for kernels
  that need a GPU toolchain, and records every file's SHA-256;
* :mod:`.driver` is the contract one model family's driver fulfils (embed, build+load one layer, run it,
  head over all positions) and the registry that picks the driver for a checkpoint.
"""
