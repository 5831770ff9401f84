"""Probes: bandwidth floor, commit length, GPU telemetry, and the backends they talk to."""
