"""Reference DDTree engine: configs, MLA target, DFlash-style drafter, KV cache, tree, generate loop."""
