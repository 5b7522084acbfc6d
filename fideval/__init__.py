"""fideval: how far is a quantized build from the official model, with numbers you can defend."""

__version__ = "0.1.0"
