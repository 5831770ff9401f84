"""The parts of the trace pipeline (``ddprobe.probes.trace``): reading a trace, finding its steps, measuring them,
and making a server write its traces (``--url``)."""
