"""ddprobe: why is DDTree speculative decoding slow at long context, with numbers."""

__version__ = "0.1.0"
