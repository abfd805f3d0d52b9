"""Data parallelism: every rank holds the whole model and its own batch, so gradients are averaged
over ranks each step (bucketed, possibly compressed), and batch-wide losses such as contrastive
ones gather the other ranks' features."""
