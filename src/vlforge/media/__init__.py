"""Media primitives shared by data, profile, verify and extract: the one video decoder (``decode``) and
the one smart-resize (``resize``). Depends on PyAV and numpy only (no torch, no transformers)."""
