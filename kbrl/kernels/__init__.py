"""The kernel evaluator: extraction, static checks, sandboxed compile → verify → time, feedback."""
