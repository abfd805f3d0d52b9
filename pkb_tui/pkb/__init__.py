"""ParallelKernelBench (PKB) as a source of tasks and models, read from a user's clone at run time.

pkb_tui never copies PKB's code: `--pkb-root DIR` (or $PKB_ROOT) names a clone, whose
`reference/<N>_<name>.py` problems become tasks `pkb/<N>_<name>` (tasks.py) and whose generated
`solutions_*` folders, or any folder of `<stem>_<backend>.py` files, become models (solutions.py).
"""
