"""replab's version: the bottom floor, so every layer (run ids, manifests, the dist zip) can read it."""

__version__ = "0.1.0"
