"""kbrl's built-in offline problem set, read as text by `kbrl.problems.loaders` (never imported).

- `level1/{N}_{Name}.py`, `level2/{N}_{Name}.py`: problems in exact KernelBench format (`Model`,
  `get_inputs()`, `get_init_inputs()`), float32, shapes small enough that the Triton CPU interpreter
  runs one forward in well under a second, so tests and demos need no GPU, checkout or network.
- `solutions/level{L}/{N}_{Name}_{triton,cuda}.py`: one honest, correct `ModelNew` per backend for
  every problem. They are the evaluator's positive controls: each must compile, match its reference
  at fp32 tolerance (1e-4), and must not be flagged by the cheat checks. Parameters are created in
  the same order and shapes as in `Model`, so one seed gives both the same weights.
"""
