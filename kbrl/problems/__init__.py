"""Problems: the `Problem` record and its loaders (KernelBench checkout, Hugging Face dataset, built-in set).

Import-light: neither torch nor `datasets` is imported until a loader that needs it runs.
"""

from kbrl.problems.loaders import (
    BUILTIN_BACKENDS,
    HF_DEFAULT,
    KERNELBENCH_ROOT_ENV,
    ProblemLoadError,
    ProblemNotFoundError,
    builtin_solutions,
    get_problem,
    load_builtin,
    load_hf_dataset,
    load_kernelbench_dir,
    load_problems,
)
from kbrl.problems.model import Problem

__all__ = [
    "BUILTIN_BACKENDS",
    "HF_DEFAULT",
    "KERNELBENCH_ROOT_ENV",
    "Problem",
    "ProblemLoadError",
    "ProblemNotFoundError",
    "builtin_solutions",
    "get_problem",
    "load_builtin",
    "load_hf_dataset",
    "load_kernelbench_dir",
    "load_problems",
]
