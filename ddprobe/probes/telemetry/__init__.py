"""GPU telemetry sources, one file each (``nvml``, ``prometheus``, ``dcgm_exporter``; shared parsing in
``sources``), and the ``sampler`` thread that reads them while a probe runs."""
