"""kbrl: reinforcement learning for GPU kernels on KernelBench.

Kept import-light on purpose: the sandboxed evaluator child imports `kbrl.kernels.runner`,
and every millisecond spent here is paid once per candidate.
"""

__version__ = "0.1.0"
