"""Probes, by role. At this level only the pipelines a command runs: ``commit`` (commit length per text and
context), ``gpu_util`` (is the GPU busy), ``floor`` (the whole-step floor), ``advise`` (speculation on or off),
``diagnose`` (all of them, one report). Below them:

- ``backends/``: the servers a probe talks to (the engine in-process, SGLang, vLLM) behind one interface;
- ``telemetry/``: GPU readings (NVML, a Prometheus server, a DCGM exporter) and the sampler that collects them;
- ``bench/``: what times things (verify kernels and their peers, step times, step anatomy, all-reduce, the run
  estimate's calibration).
"""
