"""The physics every command shares, defined once, standard library only, below every command:

- ``shapes``: dtypes and their sizes, a model's attention shape (KV bytes and FLOPs per token), ``floor_s``;
- ``gpus``: GPU specs (datasheet bandwidth, tensor rate, L2, NVML names) and the least time per kernel;
- ``interconnect``: all-reduce latency per interconnect, where a step's communication time comes from;
- ``step_shape``: the weights and MoE experts one step reads per GPU;
- ``presets``: the ddprobe engine's presets (``tiny``, ``k2``: one GPU's share) as configs;
- ``models``: the one model registry (served models and engine presets, ``get_model``);
- ``step_model``: what a step of R rows costs at its floor, the launches, the bound;
- ``plan``: the one planner (``StepInput`` -> ``StepModel``) every command calls.
"""
