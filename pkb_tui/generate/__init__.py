"""Models that write kernels: language-model endpoints asked to write candidate solutions, which the
same engine then evaluates, with refine rounds fed the verdicts. No Textual here (the dashboard's
Generate screen drives this package through `loop.GenerationLoop`)."""
