"""What times things: verify kernels and their production peers (``verify``, ``peers``), engine step times
(``step_times``), the step's anatomy over context (``anatomy``), all-reduce (``allreduce``) and the calibration
that estimates a run's time (``estimate``)."""
