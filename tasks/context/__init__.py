"""Context parallelism: one long sequence split over ranks, so attention (every query against
every earlier key) needs the other ranks' keys and values, passed around a ring or swapped for
heads with all-to-alls."""
